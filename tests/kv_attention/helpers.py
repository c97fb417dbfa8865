"""Calls into kv_attention shared by the library's tests: a strategy by name, and multi-head attention."""

import kv_attention as kv

HEADS_PATHS = ("grouped", "repeat_kv")


def run(name, *args, **kwargs):
    return kv.STRATEGIES[name](*args, **kwargs)


def heads_reference(*args, n_heads=6, n_kv_heads=2):
    return kv.multi_head_attention(*args, n_heads=n_heads, n_kv_heads=n_kv_heads)


def heads_decode(*args, n_heads=6, n_kv_heads=2, path="grouped", **kwargs):
    return kv.multi_head_decode(*args, n_heads=n_heads, n_kv_heads=n_kv_heads, path=path, **kwargs)


HEADS_FUNCTIONS = {
    "reference": heads_reference,
    "grouped": heads_decode,
    "repeat_kv": lambda *args, **kw: heads_decode(*args, path="repeat_kv", **kw),
}
