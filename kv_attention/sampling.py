"""The next token from logits: greedy (argmax), or drawn after Hugging Face's warpers.

``do_sample``, ``temperature``, ``top_k``, ``top_p`` are HF's ``generate`` names and defaults, their warpers HF's
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper`` in HF's order
(``generation/logits_process.py``, ``utils.py:_get_logits_processor``). ``seed`` is vLLM's ``SamplingParams.seed``:
one ``numpy.random.default_rng(seed)`` per call, so a seed repeats its tokens (HF seeds torch's global generator).
What differs: the warpers run in float64, and a draw is an inverse CDF of one uniform, not ``torch.multinomial``.
"""

import warnings

import numpy as np

from ._validation import as_flag, as_real, as_size

DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}  # HF's GenerationConfig


def warp(logits, temperature=1.0, top_k=50, top_p=1.0):
    """``logits [..., V]`` divided by ``temperature``, then -inf outside the ``top_k`` largest (ties kept; 0 or None:
    all) and outside the smallest set of probability >= ``top_p`` (the largest always kept): float64 ``[..., V]``."""
    scores = np.asarray(logits, np.float64) / temperature
    if top_k and top_k < scores.shape[-1]:
        kth = np.partition(scores, -top_k, axis=-1)[..., -top_k, None]
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p < 1.0:
        order = np.argsort(scores, axis=-1)  # ascending, as HF's
        cumulative = np.cumsum(softmax(np.take_along_axis(scores, order, axis=-1)), axis=-1)
        remove = cumulative <= 1 - top_p
        remove[..., -1] = False
        np.put_along_axis(remove, order, remove.copy(), axis=-1)  # back to the vocabulary's order
        scores = np.where(remove, -np.inf, scores)
    return scores


def softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sampler(do_sample=False, temperature=1.0, top_k=50, top_p=1.0, seed=None):
    """A function of logits ``[B, m, V]`` to tokens int64 ``[B, m]``: the argmax, or with ``do_sample`` one draw
    from the softmax of :func:`warp` per position. TypeError, ValueError naming a bad argument (``temperature`` > 0,
    ``top_k`` >= 0, ``top_p`` in [0, 1], ``seed`` None or an int >= 0); greedy warns where a warper is set (HF's rule)."""
    do_sample = as_flag("do_sample", do_sample)
    options = {"temperature": as_real("temperature", temperature, 0, above=True),
               "top_k": 0 if top_k is None else as_size("top_k", top_k),
               "top_p": as_real("top_p", top_p, 0)}
    if options["top_p"] > 1:
        raise ValueError(f"top_p must be in [0, 1], got {top_p}")
    seed = None if seed is None else as_size("seed", seed)
    if not do_sample:
        changed = [name for name, value in options.items() if value != DEFAULTS[name] and (name, value) != ("top_k", 0)]
        if changed:
            warnings.warn(f"{', '.join(changed)} only apply with do_sample=True; decoding greedily", UserWarning,
                          stacklevel=4)
        return lambda logits: logits.argmax(axis=-1)
    rng = np.random.default_rng(seed)

    def sample(logits):
        cumulative = np.cumsum(softmax(warp(logits, **options)), axis=-1)  # [B, m, V]
        u = (1.0 - rng.random(cumulative.shape[:-1] + (1,))) * cumulative[..., -1:]  # in (0, total]
        return (cumulative < u).sum(axis=-1)  # the first token whose cumulative reaches u: never one of weight 0

    return sample
