"""The input checks several modules share: arrays, sizes, dtypes, flags and the overflow guard.

Entry points call these before they compute or mutate anything, so bad input
raises TypeError (a type or dtype) or ValueError (a value or a shape), naming
the argument and the shapes, and changes nothing. Arrays must be float32 or
float64; a computation runs in ``np.result_type`` of its inputs. Sizes: D_k >= 1
wherever there are queries and keys (a cache's or a pool's ``k_dim`` too); every other
array size (D_v, D_model, T, B, S, a cache's length or batch axes) may be 0 and gives
empty arrays. A ``block_size`` or ``window`` (tokens a block or a window holds) is >= 1.

The checks of one module's own arguments and state live in that module, beside
what they guard: attention's (x and the projection weights included), split-KV's
and the heads' in ``attention.py``, ``split.py`` and ``heads.py``; a cache's in
``cache.py`` and ``window.py`` (a cache given to a decode included); the paged
cache's and the allocators' as their methods; a ragged decode's in ``ragged.py``,
a serve's in ``scheduler.py``; memory in ``_memory.py``. This module keeps the
primitives several of them share: arrays, sizes, dtypes, flags and the overflow guard.
"""

import math

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class NonFiniteError(ValueError):
    """The ValueError of the ``check_finite`` checks: NaN/inf in an input or a result, or a bound over the dtype.

    A ValueError, as every such error always was; its own class lets a decode tell a failed finiteness
    check (whose cause it then names) from any other error, which it lets through as raised.
    """
_FLOAT32, _FLOAT64 = SUPPORTED_DTYPES
_MAX_STEP = 2**62  # a ragged decode's start_steps[i] + lengths[i] must stay within int64


# Arrays, sizes, dtypes and names


def as_float_array(name, value):
    """Return ``value`` as a native-byte-order float32/float64 ndarray; never writes it.

    TypeError for another dtype or a masked array; ValueError for NaN/inf or a ragged array.
    """
    array = _as_array(name, value)
    if not np.isfinite(array).all():
        raise NonFiniteError(f"{name} contains NaN or inf")
    return array


def _as_array(name, value):
    """:func:`as_float_array` without the NaN/inf check (for inputs whose norms the overflow guard takes)."""
    if type(value) is np.ndarray and (value.dtype is _FLOAT64 or value.dtype is _FLOAT32):  # nothing to convert
        return value
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
    return array


def as_size(name, value, minimum=0):
    """Return ``value`` as an int >= ``minimum``; TypeError for non-integers (bools included)."""
    if type(value) is int and value >= minimum:  # the common case (type(True) is bool)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def as_sizes_per_sequence(name, values, count):
    """``values`` as an int64 array of ``count`` integers in [0, 2**62]."""
    if isinstance(values, (str, bytes)) or np.ndim(values) != 1 or len(values) != count:
        raise ValueError(f"{name} must be {count} integers, one per sequence, got {values!r}")
    sizes = [as_size(f"{name}[{i}]", n) for i, n in enumerate(values)]
    for i, n in enumerate(sizes):
        if n > _MAX_STEP:
            raise ValueError(f"{name}[{i}]={n} is too large: at most 2**62 decode steps")
    return np.array(sizes, dtype=np.int64)


def as_float_dtype(dtype):
    """Return ``np.dtype(dtype)``; TypeError unless it is float32 or float64.

    None is refused too: ``np.dtype(None)`` would silently mean float64 (as in :func:`as_itemsize`).
    """
    if dtype is _FLOAT64 or dtype is _FLOAT32:  # already a dtype, e.g. from np.result_type
        return dtype
    if dtype is None:
        raise TypeError("dtype must be float32 or float64, got None")
    try:
        dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}: {error}") from None
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def as_flag(name, value):
    """``value`` as a bool; TypeError unless it is one (numpy's included).

    Every flag of the library goes through here, so a truthy string such as ``"no"`` is refused, not taken for True.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(what, value, known):
    """Raise ValueError unless ``value`` is one of the names ``known``."""
    if not isinstance(value, str) or value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")


# Overflow: the one silent failure of finite inputs


# Half the dtype's max: the computed q, k, v and q·k exceed their exact bounds by at most a relative
# D·eps of rounding (D the widths summed over), far less than the factor 2 (D < 1.6e7 even in float32).
_LOG10_LIMIT = {dtype: math.log10(float(np.finfo(dtype).max) / 2) for dtype in SUPPORTED_DTYPES}
# The fast path's bound on squared norms, far inside either dtype's range: (float32 max / 64)².
_FAST_LIMIT_SQUARED = (float(np.finfo(np.float32).max) / 64) ** 2
_vdot = np.vdot  # one BLAS dot per array; unlike np.dot it raises no floating-point warning when a square overflows


def sum_of_squares(a):
    """Σ a² as a float, by BLAS dots: NaN or inf if ``a`` holds NaN/inf or a square overflows.

    A view such as a cache's ``k_cache[..., :T, :]`` is read block by block (one
    dot per ``[T, D]`` matrix), never copied whole as ``np.vdot`` would copy it.
    """
    if a.ndim < 3 or a.flags.c_contiguous:
        return float(_vdot(a, a))
    return float(sum(_vdot(m, m) for m in a.reshape((-1,) + a.shape[-2:])))


def check_finite_array(name, a):
    """Raise ValueError naming ``name`` if ``a`` holds NaN/inf: one BLAS pass, ``np.isfinite`` only when it is not finite."""
    if not math.isfinite(sum_of_squares(a)) and not np.isfinite(a).all():
        raise NonFiniteError(f"{name} contains NaN or inf")


def all_finite(*arrays):
    """True if every array holds only finite values: one BLAS dot each, ``np.isfinite`` only where a square overflows."""
    return all(math.isfinite(sum_of_squares(a)) or np.isfinite(a).all() for a in arrays)


def check_score_range(x, w_q, w_k, w_v, dtype, stored_k=None):
    """Raise ValueError if x, w_q, w_k or w_v hold NaN/inf, or q, k, v or any partial sum of q·k could overflow ``dtype``.

    By Cauchy–Schwarz every partial sum of q_t·k_s is at most |q_t|·|k_s|, and
    |q_t| <= |x_t|·|w_q|_F (likewise k, v). Checking this bound once up front
    rules out the one silent failure of finite inputs: a score that overflows
    to -inf would get softmax weight 0 instead of raising. ``stored_k``,
    ``[..., S, D_k]``, are keys already in a cache, which enter the bound too.

    Fast path: one BLAS dot per array gives its squared norm (|x|_F for |x_t|,
    a looser bound); it is NaN or inf if the array holds NaN/inf or squaring
    overflows, and then, or when the loose bound is not far inside float32's
    range, :func:`_check_score_range_exactly` decides without squaring anything large.
    """
    x2 = sum_of_squares(x)
    q2, k2, v2 = x2 * sum_of_squares(w_q), x2 * sum_of_squares(w_k), x2 * sum_of_squares(w_v)
    if stored_k is not None:
        k2 += sum_of_squares(stored_k)
    limit = _FAST_LIMIT_SQUARED
    if not (q2 <= limit and k2 <= limit and v2 <= limit and q2 * k2 <= limit):  # NaN compares False
        _check_score_range_exactly(x, w_q, w_k, w_v, dtype, stored_k)


def _check_score_range_exactly(x, w_q, w_k, w_v, dtype, stored_k):
    """:func:`check_score_range` with each norm scaled before squaring and the bounds combined in log10."""
    for name, a in (("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("k_cache (its stored keys)", stored_k)):
        if a is not None and not np.isfinite(a).all():
            raise NonFiniteError(f"{name} contains NaN or inf")
    x_norm = _log10_max_norm(x)  # |x_t|, the largest over t
    q, k, v = (x_norm + _log10_max_norm(w.reshape(1, -1)) for w in (w_q, w_k, w_v))  # |x_t|·|w|_F
    k_bound, qk_bound, k_from_x = "|x_t|·|w_k|_F", "|q|·|k|", k
    if stored_k is not None:
        k, k_bound = max(k, _log10_max_norm(stored_k)), "max(|x_t|·|w_k|_F, the cache's |k_s|)"
        qk_bound = "|q|·|k|, the cache's keys included"
    bounds = {"|q|": (q, "|x_t|·|w_q|_F"), "|k|": (k, k_bound), "|v|": (v, "|x_t|·|w_v|_F"), "|q·k|": (q + k, qk_bound)}
    limit = _LOG10_LIMIT[np.dtype(dtype)]
    keys_tripped = k > limit or q + k > limit
    if stored_k is None or not (keys_tripped and _log10_max_norm(stored_k) > k_from_x):
        raise_if_too_large("x and the weights are", bounds, dtype, "rescale x or the weights")
    raise_if_too_large("x, the weights and the cache's keys are", bounds, dtype, "rescale x, the weights or the cache's keys")


def raise_if_too_large(subject, bounds, dtype, remedy):
    """Raise ValueError naming every bound (label -> (log10 value, formula)) above ``dtype``'s max / 2, with its figure.

    ``subject`` starts the message, e.g. "x and the weights are"; ``remedy`` ends it.
    """
    limit = _LOG10_LIMIT[np.dtype(dtype)]
    tripped = {label: f"{label} <= {formula} = {_power_of_ten(value)}" for label, (value, formula) in bounds.items() if value > limit}
    if tripped:
        raise NonFiniteError(
            f"{subject} too large for {np.dtype(dtype)}: {' and '.join(tripped)} could overflow "
            f"({', '.join(tripped.values())}; the limit is {_power_of_ten(limit)}, half the dtype's max); {remedy}"
        )


def _log10_max_norm(a):
    """log10 of the largest Euclidean norm over the last axis of finite ``a`` (-inf if it is 0).

    Scaled before squaring, by the largest |entry|: no step can overflow, whatever the magnitudes.
    """
    a = np.abs(a, dtype=np.float64)
    scale = float(a.max(initial=0.0))
    if scale == 0.0:
        return -math.inf
    with np.errstate(under="ignore"):  # tiny entries may flush to 0: the sum of squares loses nothing that counts
        a /= scale  # entries in [0, 1]: a row's sum of squares is at most its length
        squares = float(np.einsum("...d,...d->...", a, a).max())
    return math.log10(scale) + 0.5 * math.log10(squares)


def _power_of_ten(log10_value):
    """``10 ** log10_value`` as text such as "2.5e+309", even beyond any float's range."""
    if log10_value == -math.inf:
        return "0"
    exponent = math.floor(log10_value)
    mantissa = f"{10 ** (log10_value - exponent):.3g}"
    if mantissa == "10":
        mantissa, exponent = "1", exponent + 1
    return f"{mantissa}e{exponent:+d}"


def check_finite_output(out):
    """Raise ValueError if ``out`` holds inf/NaN (overflow, or a cache holding inf/NaN)."""
    if not np.isfinite(out).all():
        raise overflowed(out.dtype)


def overflowed(dtype):
    """The ValueError of :func:`check_finite_output` for a computation in ``dtype``."""
    return NonFiniteError(
        f"attention overflowed {np.dtype(dtype)}: the projections, scores or a given "
        "cache's keys/values are too large for the dtype (or not finite)"
    )
