"""Input checks shared by every strategy: dtype, finiteness and shapes.

Every public entry point validates all of its inputs here before it computes
or mutates anything, so bad input raises a clear error and changes nothing.
"""

import math

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(name, value):
    """Return ``value`` as a native-byte-order float32/float64 ndarray; never writes it.

    Raises:
        TypeError: the dtype is not float32 or float64 (ints, bools, complex,
            float16, object, ...), or ``value`` is a masked array.
        ValueError: the array holds NaN or inf, or is ragged.
    """
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; pass a plain ndarray (e.g. {name}.filled(0.0))")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{name} is not a rectangular array: {error}") from None
    if array.dtype.kind == "f" and not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} must be a float32 or float64 array, got dtype {array.dtype}"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or inf")
    return array


def as_size(name, value, minimum=0):
    """Return ``value`` as an int >= ``minimum``; TypeError for non-integers (bools included)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def as_float_dtype(dtype):
    """Return ``np.dtype(dtype)``; TypeError unless it is float32 or float64."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def _max_square_norm(a):
    """Largest squared Euclidean norm over the last axis of ``a``, in float64 (inf if it overflows)."""
    if a.size == 0:
        return 0.0
    a = a.astype(np.float64, copy=False)
    return float(np.einsum("...d,...d->...", a, a).max())


def check_score_range(x, w_q, w_k, w_v, dtype, stored_k=None):
    """Raise ValueError if q, k, v or any partial sum of q·k could overflow ``dtype``.

    By Cauchy–Schwarz every partial sum of q·k is at most |q|·|k|, and
    |q| <= |x_t|·|w_q|_F (likewise k, v). Checking this bound once up front
    rules out the one silent failure of finite inputs: a score that overflows
    to -inf would get softmax weight 0 instead of raising. ``stored_k``,
    ``[..., S, D_k]``, are keys already in a cache, which enter the bound too.
    """
    limit = float(np.finfo(dtype).max) / 4  # margin for rounding
    with np.errstate(over="ignore", invalid="ignore"):
        x_sq = _max_square_norm(x)
        q, k, v = (math.sqrt(x_sq * _max_square_norm(w.reshape(1, -1))) for w in (w_q, w_k, w_v))
        if stored_k is not None:
            k = max(k, math.sqrt(_max_square_norm(stored_k)))
    # inf * 0 (a zero weight) gives NaN, which compares False: its true product is 0.
    if q > limit or k > limit or v > limit or q * k > limit:
        raise ValueError(
            f"x and the weights are too large for {np.dtype(dtype)}: q·k could overflow "
            f"(|q|·|k| up to {q * k:.3g}); rescale x or the weights"
        )


def check_projection_inputs(x, w_q, w_k, w_v, x_ndims):
    """Validate ``x`` and the three projection matrices of single-head attention.

    Args:
        x: ``[T, D_model]`` or ``[B, T, D_model]``; ``x_ndims`` says which are allowed.
        w_q: ``[D_model, D_k]``; w_k: ``[D_model, D_k]``; w_v: ``[D_model, D_v]``.
        x_ndims: the allowed numbers of axes of ``x``, e.g. ``(2,)`` or ``(2, 3)``.

    Returns:
        ``(x, w_q, w_k, w_v, dtype)``: the weights cast to ``dtype`` (a new array
        only when the dtype differs), where ``dtype = np.result_type`` of all
        four inputs; ``x`` is returned as given.

    Raises:
        TypeError: an input is not float32/float64.
        ValueError: NaN/inf in an input, a wrong number of axes, a D_model that
            differs between ``x`` and the weights, D_k of ``w_q`` != D_k of ``w_k``,
            D_k == 0, or inputs so large that q·k could overflow the dtype.
    """
    x = as_float_array("x", x)
    w_q = as_float_array("w_q", w_q)
    w_k = as_float_array("w_k", w_k)
    w_v = as_float_array("w_v", w_v)
    if x.ndim not in x_ndims:
        layouts = " or ".join({2: "[T, D_model]", 3: "[B, T, D_model]"}[n] for n in x_ndims)
        raise ValueError(f"x must be {layouts}, got shape {x.shape}")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if w.ndim != 2:
            raise ValueError(f"{name} must be [D_model, D], got shape {w.shape}")
        if w.shape[0] != x.shape[-1]:
            raise ValueError(
                f"{name} has {w.shape[0]} rows but x has D_model={x.shape[-1]}: "
                f"x {x.shape}, {name} {w.shape}"
            )
    if w_q.shape[1] != w_k.shape[1]:
        raise ValueError(
            f"w_q and w_k must share D_k: w_q {w_q.shape}, w_k {w_k.shape}"
        )
    if w_q.shape[1] == 0:
        raise ValueError(f"D_k must be at least 1: w_q {w_q.shape}")
    dtype = np.result_type(x, w_q, w_k, w_v)
    check_score_range(x, w_q, w_k, w_v, dtype)
    w_q, w_k, w_v = (w.astype(dtype, copy=False) for w in (w_q, w_k, w_v))
    return x, w_q, w_k, w_v, dtype


def check_finite_output(out):
    """Raise ValueError if ``out`` holds inf/NaN (overflow, or a cache holding inf/NaN)."""
    if not np.isfinite(out).all():
        raise ValueError(
            f"attention overflowed {out.dtype}: the projections, scores or a given "
            "cache's keys/values are too large for the dtype (or not finite)"
        )
