"""Input checks shared by every strategy: dtype, finiteness and shapes.

Every public entry point validates all of its inputs here before it computes
or mutates anything, so bad input raises a clear error and changes nothing.
"""

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(name, value):
    """Return ``value`` as a float32/float64 ndarray, never copying or writing it.

    Raises:
        TypeError: the dtype is not float32 or float64 (ints, bools, complex,
            float16, object, ...).
        ValueError: the array holds NaN or inf.
    """
    array = np.asarray(value)
    if array.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} must be a float32 or float64 array, got dtype {array.dtype}"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or inf")
    return array


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
            or D_k == 0.
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
    w_q, w_k, w_v = (w.astype(dtype, copy=False) for w in (w_q, w_k, w_v))
    return x, w_q, w_k, w_v, dtype


def check_finite_output(out):
    """Raise ValueError if ``out`` overflowed to inf/NaN (inputs too large for the dtype)."""
    if not np.isfinite(out).all():
        raise ValueError(
            f"attention overflowed {out.dtype}: q·k or the projections are too large "
            "for the dtype; rescale x or the weights"
        )
