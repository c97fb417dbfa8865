"""The next token from logits: greedy (argmax), or drawn after Hugging Face's warpers.

``do_sample``, ``temperature``, ``top_k``, ``top_p`` are HF's ``generate`` names and defaults, their warpers HF's
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper`` in HF's order
(``generation/logits_process.py``, ``utils.py:_get_logits_processor``). ``seed`` is vLLM's ``SamplingParams.seed``:
one ``numpy.random.default_rng(seed)`` per call, so a seed repeats its tokens (HF seeds torch's global generator).
What differs: the warpers run in float64, and a draw is an inverse CDF of one uniform, not ``torch.multinomial``.
"""

import os
import sys
import warnings

import numpy as np

from ._validation import as_flag, as_real, as_size

DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}  # HF's GenerationConfig


def warp(logits, temperature=1.0, top_k=50, top_p=1.0):
    """``logits [..., V]`` divided by ``temperature``, then -inf outside the ``top_k`` largest (ties kept; 0 or None:
    all) and outside the smallest set of probability >= ``top_p`` (the largest always kept): float64 ``[..., V]``."""
    scores = np.asarray(logits, np.float64) / temperature
    out = np.full(scores.shape, -np.inf)
    for row, kept in zip(scores.reshape(-1, scores.shape[-1]), out.reshape(-1, scores.shape[-1])):
        ids = kept_ids(row, top_k, top_p)
        kept[ids] = row[ids]
    return out


def kept_ids(scores, top_k, top_p):
    """The ids, ascending, that :func:`warp` keeps of one row of ``scores [V]`` (already divided by temperature):
    top-k by a partition, top-p over those alone (the rest have probability 0), so a step sorts k values, not V."""
    ids = np.arange(len(scores))
    if top_k and top_k < len(scores):
        ids = np.flatnonzero(scores >= np.partition(scores, -top_k)[-top_k])
    if top_p < 1.0:
        order = np.argsort(scores[ids], kind="stable")  # ascending, as HF's
        cumulative = np.cumsum(softmax(scores[ids][order]))
        remove = cumulative <= 1 - top_p
        remove[-1] = False
        ids = ids[np.sort(order[~remove])]
    return ids


def _caller_level():
    """warnings' stacklevel of the first frame outside this package: the user's call."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(os.path.dirname(__file__)):
        level, frame = level + 1, frame.f_back
    return level


def softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sampler(do_sample=False, temperature=1.0, top_k=50, top_p=1.0, seed=None):
    """A function of logits ``[B, m, V]`` to tokens int64 ``[B, m]``: the argmax, or with ``do_sample`` one draw
    from the softmax of :func:`warp` per position. TypeError, ValueError naming a bad argument (``temperature`` > 0,
    >= 0 when greedy, ``top_k`` >= 0, ``top_p`` in [0, 1], ``seed`` None or an int >= 0); greedy warns where a warper
    is set (HF's rule)."""
    do_sample = as_flag("do_sample", do_sample)
    options = {"temperature": as_real("temperature", temperature, 0, above=do_sample),  # greedy: 0 warned, as HF
               "top_k": 0 if top_k is None else as_size("top_k", top_k),
               "top_p": as_real("top_p", top_p, 0)}
    if options["top_p"] > 1:
        raise ValueError(f"top_p must be in [0, 1], got {top_p}")
    seed = None if seed is None else as_size("seed", seed)
    if not do_sample:
        changed = [name for name, value in options.items() if value != DEFAULTS[name] and (name, value) != ("top_k", 0)]
        if changed:
            warnings.warn(f"do_sample is False, so {', '.join(changed)} (used in sampling only) has no effect: set "
                          f"do_sample=True or unset it", UserWarning, stacklevel=_caller_level())
        return lambda logits: logits.argmax(axis=-1)
    rng = np.random.default_rng(seed)

    def sample(logits):
        scores = np.asarray(logits, np.float64)
        with np.errstate(over="ignore"):  # the largest 0 first: a tiny temperature sends the others to -inf, not NaN
            scores = (scores - scores.max(axis=-1, keepdims=True)) / options["temperature"]  # [B, m, V]
        tokens = np.empty(scores.shape[:-1], np.int64)
        for i in np.ndindex(scores.shape[:-1]):
            ids = kept_ids(scores[i], options["top_k"], options["top_p"])
            cumulative = np.cumsum(softmax(scores[i][ids]))
            u = (1.0 - rng.random()) * cumulative[-1]  # in (0, total]: never a token of weight 0
            tokens[i] = ids[np.count_nonzero(cumulative < u)]  # the first whose cumulative reaches u
        return tokens

    return sample
