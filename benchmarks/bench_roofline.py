"""Roofline experiment, its arithmetic and draws: the bytes one decode step at model shapes must read, and the int8
draws of its inputs (bench_model's drawn weights too). Its points, the fraction of the read bandwidth a step reaches,
are the lab's answers: answers/bench_roofline.py.

Every value is an int8 draw over 128 (in [-1, 1)): ``rng.bytes`` costs 3 ns a
value where ``standard_normal`` costs 20, and a Llama-2-7B layer holds 64 M
weights. The step's bytes (:func:`step_bytes`) are those it must read:

    weights  = 4 · (D_model·H_q·D_head + 2·D_model·H_kv·D_head + H_q·D_head·D_model)
    K and V  = 4 · 2·B·H_kv·(T + 1)·D_head       (the T cached positions and the new one)
    copies   = 4 · 2·B·H_q·(T + 1)·D_head        (repeat_kv with G = H_q / H_kv > 1 only)

They are arithmetic, the same at every commit: the report computes them, no benchmark tracks them.
"""

import math

import numpy as np

from .common import SEED, library_function, read_only

# The points' grid: the answers' params (answers/bench_roofline.py) and the report's rows
ROOFLINE_SHAPES = ["Llama-3-8B", "Llama-2-7B"]  # GQA 32/8/128 and MHA 32/32/128, keys of MODEL_SHAPES
ROOFLINE_LENGTHS = [1024, 4096, 16384]  # T, positions already in the cache
ROOFLINE_BATCHES = [1, 4]  # B
ROOFLINE_PATHS = ["grouped", "repeat_kv"]
ITEMSIZE = 4  # float32


def model_shape(name):
    """``(n_heads, n_kv_heads, head_dim)`` of the commit's ``MODEL_SHAPES[name]``; NotImplementedError without it."""
    shapes = library_function("MODEL_SHAPES")
    if name not in shapes:
        raise NotImplementedError(f"MODEL_SHAPES has no {name} at this commit")
    s = shapes[name]
    return s.n_heads, s.n_kv_heads, s.head_dim


def part_bytes(n_heads, n_kv_heads, head_dim, t_len, batch, path):
    """``{"weights", "kv", "copies"}``: the bytes one step reads (module docstring), by part."""
    d_model = n_heads * head_dim
    weights = ITEMSIZE * d_model * head_dim * (2 * n_heads + 2 * n_kv_heads)
    kv = ITEMSIZE * 2 * batch * n_kv_heads * (t_len + 1) * head_dim
    copied = path == "repeat_kv" and n_heads > n_kv_heads
    copies = ITEMSIZE * 2 * batch * n_heads * (t_len + 1) * head_dim if copied else 0
    return {"weights": weights, "kv": kv, "copies": copies}


def step_bytes(shape, t_len, batch, path):
    """The bytes one step must read: weights + K and V of T + 1 positions + repeat_kv's copies."""
    return sum(part_bytes(*model_shape(shape), t_len, batch, path).values())


def draws(parts, shape, scale=1.0):
    """Read-only float32 ``[*shape]``: int8 draws of ``default_rng([42, *parts])`` times ``scale / 128``."""
    rng = np.random.default_rng([SEED, *parts])
    out = np.frombuffer(rng.bytes(math.prod(shape)), np.int8).astype(np.float32).reshape(shape)
    out *= np.float32(scale / 128)
    return read_only(out)[0]
