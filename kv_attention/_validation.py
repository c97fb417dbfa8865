"""The input checks the library's modules share: arrays, sizes, dtypes, flags, memory and the overflow guard.

Entry points call these before they compute or mutate anything, so bad input
raises TypeError (a type or dtype) or ValueError (a value or a shape), naming
the argument and the shapes, and changes nothing. Arrays must be float32 or
float64; a computation runs in ``np.result_type`` of its inputs. Sizes: D_k >= 1
wherever there are queries and keys (a cache's or a pool's ``k_dim`` too); every other
array size (D_v, D_model, T, B, S, a cache's length or batch axes) may be 0 and gives
empty arrays. A ``block_size`` or ``window`` (tokens a block or a window holds) is >= 1.

The checks of one module's own arguments and state live in that module, beside
what they guard: a cache's in ``cache.py`` and ``window.py`` (a cache given to a
decode included), the paged cache's and the allocators' as their methods, a
ragged decode's in ``ragged.py``, a serve's in ``scheduler.py``.
"""

import contextlib
import math
import os

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_FLOAT32, _FLOAT64 = SUPPORTED_DTYPES
_MAX_STEP = 2**62  # a ragged decode's start_steps[i] + lengths[i] must stay within int64


# Arrays, sizes, dtypes and names


def as_float_array(name, value):
    """Return ``value`` as a native-byte-order float32/float64 ndarray; never writes it.

    TypeError for another dtype or a masked array; ValueError for NaN/inf or a ragged array.
    """
    array = _as_array(name, value)
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or inf")
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


def as_itemsize(dtype, named):
    """Bytes per element of ``dtype``: a float or integer numpy dtype, or a name in ``named`` (name -> bytes).

    A dtype whose name is in ``named`` (as ml_dtypes registers ``bfloat16``) counts
    as that name, and one named ``<family>_<variant>`` whose family is in ``named``
    with its size (``float8_e5m3fnu``, 1 byte) counts as the family. TypeError for
    anything else, None included (``np.dtype(None)`` would silently mean float64).
    """
    if isinstance(dtype, str) and dtype in named:
        return named[dtype]
    names = f"a name in NAMED_ITEMSIZES ({', '.join(map(repr, list(named)[:3]))}, ...)"
    if dtype is None:
        raise TypeError(f"dtype must be a numeric numpy dtype such as np.float16 or {names}, got None")
    try:
        dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"dtype must be a numeric numpy dtype such as np.float16 or {names}, got {dtype!r}: {error}") from None
    if dtype.name in named:
        return named[dtype.name]
    family = dtype.name.partition("_")[0]
    if family in named and dtype.itemsize == named[family]:
        return dtype.itemsize
    if dtype.kind not in "fiu":
        raise TypeError(f"dtype must be a float or integer dtype, got {dtype} (or {names})")
    return dtype.itemsize


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


# x and the projection weights

_X_LAYOUTS = {2: "[T, D_model]", 3: "[B, T, D_model]"}
_WEIGHT_NAMES = ("w_q", "w_k", "w_v", "w_o")


def _check_shapes(x, weights, x_ndims, matrix):
    """Raise ValueError unless x has ``x_ndims`` axes and each weight is 2-D with D_model rows (w_o: any rows)."""
    if x.ndim not in x_ndims:
        layouts = " or ".join(_X_LAYOUTS[n] for n in x_ndims)
        raise ValueError(f"x must be {layouts}, got shape {x.shape}")
    for name, w in zip(_WEIGHT_NAMES, weights):
        if w.ndim != 2:
            raise ValueError(f"{name} must be {matrix}, got shape {w.shape}")
        if w.shape[0] != x.shape[-1] and name != "w_o":
            raise ValueError(f"{name} has {w.shape[0]} rows but x has D_model={x.shape[-1]}: x {x.shape}, {name} {w.shape}")


def _in_common_dtype(x, weights):
    """The weights cast to ``dtype = np.result_type`` of all inputs (copied only if it differs), and dtype.

    ``weights`` start with w_q, w_k, w_v: |q_h| <= |x|·|w_q|_F, so one overflow bound covers every head.
    NaN/inf in x, w_q, w_k and w_v is found by the bound's norms (:func:`check_score_range`).
    """
    dtype = np.result_type(x, *weights)
    check_score_range(x, *weights[:3], dtype)
    return [w.astype(dtype, copy=False) for w in weights], dtype


def check_projection_inputs(x, w_q, w_k, w_v, x_ndims):
    """Validate ``x`` (``x_ndims`` axes, e.g. ``(2,)`` or ``(2, 3)``) and single-head weights.

    Returns ``(x, w_q, w_k, w_v, dtype)``, the weights in ``dtype``. ValueError also
    for D_k of w_q != D_k of w_k, or D_k == 0. Written for speed (it runs on every
    decode call): one test of the types and dtypes, one of every shape, and the
    conversions or messages only when a test fails.
    """
    dtype = getattr(x, "dtype", None)
    if not (type(x) is type(w_q) is type(w_k) is type(w_v) is np.ndarray
            and w_q.dtype is w_k.dtype is w_v.dtype is dtype and (dtype is _FLOAT64 or dtype is _FLOAT32)):
        x, w_q, w_k, w_v, dtype = _in_common_dtype_converted(x, w_q, w_k, w_v)  # anything but 4 arrays of one dtype
    x_shape, q_shape, k_shape, v_shape = x.shape, w_q.shape, w_k.shape, w_v.shape
    if not (len(x_shape) in x_ndims and len(q_shape) == len(k_shape) == len(v_shape) == 2
            and x_shape[-1] == q_shape[0] == k_shape[0] == v_shape[0] and q_shape[1] == k_shape[1] > 0):
        _check_shapes(x, (w_q, w_k, w_v), x_ndims, "[D_model, D]")
        if q_shape[1] != k_shape[1]:
            raise ValueError(f"w_q and w_k must share D_k: w_q {q_shape}, w_k {k_shape}")
        raise ValueError(f"D_k must be at least 1: w_q {q_shape}")
    check_score_range(x, w_q, w_k, w_v, dtype)
    return x, w_q, w_k, w_v, dtype


def _in_common_dtype_converted(x, w_q, w_k, w_v):
    """``x`` and the weights as float arrays, the weights cast to ``dtype = np.result_type`` of all four, and dtype."""
    x, w_q, w_k, w_v = _as_array("x", x), _as_array("w_q", w_q), _as_array("w_k", w_k), _as_array("w_v", w_v)
    dtype = np.result_type(x, w_q, w_k, w_v)
    return x, w_q.astype(dtype, copy=False), w_k.astype(dtype, copy=False), w_v.astype(dtype, copy=False), dtype


def check_head_counts(n_heads, n_kv_heads):
    """Return ``(n_heads, n_kv_heads)`` as ints >= 1, with n_heads a multiple of n_kv_heads."""
    n_heads = as_size("n_heads", n_heads, minimum=1)
    n_kv_heads = as_size("n_kv_heads", n_kv_heads, minimum=1)
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: "
            "every K/V head must serve the same number of query heads"
        )
    return n_heads, n_kv_heads


def _head_dim(w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """D_head = ``w_q.shape[1] // n_heads``; ValueError unless every weight's width is heads × D_head."""
    head_dim, rest = divmod(w_q.shape[1], n_heads)
    if rest or head_dim == 0:
        raise ValueError(
            f"w_q has {w_q.shape[1]} columns, which is not n_heads={n_heads} × head_dim "
            f"for any head_dim >= 1: w_q {w_q.shape}"
        )
    for name, w in (("w_k", w_k), ("w_v", w_v)):
        if w.shape[1] != n_kv_heads * head_dim:
            raise ValueError(
                f"{name} has {w.shape[1]} columns but n_kv_heads × head_dim = {n_kv_heads} × {head_dim} "
                f"= {n_kv_heads * head_dim} (head_dim from w_q {w_q.shape}, n_heads={n_heads}): "
                f"{name} {w.shape}"
            )
    if w_o.shape[0] != n_heads * head_dim:
        raise ValueError(
            f"w_o has {w_o.shape[0]} rows but n_heads × head_dim = {n_heads} × {head_dim} "
            f"= {n_heads * head_dim}: w_o {w_o.shape}"
        )
    return head_dim


def check_head_inputs(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads):
    """Validate ``x`` and the four weights of multi-head attention (counts already checked).

    Returns ``(x, w_q, w_k, w_v, w_o, head_dim, dtype)``, the weights in ``dtype``.
    """
    x = _as_array("x", x)
    weights = [_as_array(name, w) for name, w in zip(_WEIGHT_NAMES, (w_q, w_k, w_v))] + [as_float_array("w_o", w_o)]
    _check_shapes(x, weights, (2, 3), "a matrix [rows, columns]")
    head_dim = _head_dim(*weights, n_heads, n_kv_heads)
    (w_q, w_k, w_v, w_o), dtype = _in_common_dtype(x, weights)
    return x, w_q, w_k, w_v, w_o, head_dim, dtype


def check_model_shape(n_layers, n_heads, n_kv_heads, head_dim):
    """Raise unless every count is an integer >= 1 and n_kv_heads divides n_heads."""
    counts = {"n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}
    for name, n in counts.items():
        as_size(name, n, minimum=1)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")


# Overflow: the one silent failure of finite inputs


# Half the dtype's max: the computed q, k, v and q·k exceed their exact bounds by at most a relative
# D·eps of rounding (D the widths summed over), far less than the factor 2 (D < 1.6e7 even in float32).
_LOG10_LIMIT = {dtype: math.log10(float(np.finfo(dtype).max) / 2) for dtype in SUPPORTED_DTYPES}
# The fast path's bound on squared norms, far inside either dtype's range: (float32 max / 64)².
_FAST_LIMIT_SQUARED = (float(np.finfo(np.float32).max) / 64) ** 2
_vdot = np.vdot  # one BLAS dot per array; unlike np.dot it raises no floating-point warning when a square overflows


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
    x2 = float(_vdot(x, x))
    q2, k2, v2 = x2 * float(_vdot(w_q, w_q)), x2 * float(_vdot(w_k, w_k)), x2 * float(_vdot(w_v, w_v))
    if stored_k is not None:
        k2 += float(_vdot(stored_k, stored_k))
    limit = _FAST_LIMIT_SQUARED
    if not (q2 <= limit and k2 <= limit and v2 <= limit and q2 * k2 <= limit):  # NaN compares False
        _check_score_range_exactly(x, w_q, w_k, w_v, dtype, stored_k)


def _check_score_range_exactly(x, w_q, w_k, w_v, dtype, stored_k):
    """:func:`check_score_range` with each norm scaled before squaring and the bounds combined in log10."""
    for name, a in (("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v), ("k_cache (its stored keys)", stored_k)):
        if a is not None and not np.isfinite(a).all():
            raise ValueError(f"{name} contains NaN or inf")
    x_norm = _log10_max_norm(x)  # |x_t|, the largest over t
    q, k, v = (x_norm + _log10_max_norm(w.reshape(1, -1)) for w in (w_q, w_k, w_v))  # |x_t|·|w|_F
    k_bound, qk_bound = "|x_t|·|w_k|_F", "|q|·|k|"
    if stored_k is not None:
        k, k_bound = max(k, _log10_max_norm(stored_k)), "max(|x_t|·|w_k|_F, the cache's |k_s|)"
        qk_bound = "|q|·|k|, the cache's keys included"
    bounds = {"|q|": (q, "|x_t|·|w_q|_F"), "|k|": (k, k_bound), "|v|": (v, "|x_t|·|w_v|_F"), "|q·k|": (q + k, qk_bound)}
    raise_if_too_large("x and the weights are", bounds, dtype, "rescale x or the weights")


def raise_if_too_large(subject, bounds, dtype, remedy):
    """Raise ValueError naming every bound (label -> (log10 value, formula)) above ``dtype``'s max / 2, with its figure.

    ``subject`` starts the message, e.g. "x and the weights are"; ``remedy`` ends it.
    """
    limit = _LOG10_LIMIT[np.dtype(dtype)]
    tripped = {label: f"{label} <= {formula} = {_power_of_ten(value)}" for label, (value, formula) in bounds.items() if value > limit}
    if tripped:
        raise ValueError(
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
        raise ValueError(
            f"attention overflowed {out.dtype}: the projections, scores or a given "
            "cache's keys/values are too large for the dtype (or not finite)"
        )


# Windows


def check_window(window, n_sink):
    """Return ``(window, n_sink)`` as ints: ``window`` None or >= 1, ``n_sink`` >= 0."""
    if window is not None:
        window = as_size("window", window, minimum=1)
    return window, as_size("n_sink", n_sink)


# Memory: constructors that allocate from their sizes


def check_memory(nbytes, what):
    """``nbytes``, the bytes ``what`` (text, e.g. "a pool of ...") needs; ValueError beyond physical memory.

    Every constructor that allocates from its sizes checks them here first, so that
    a size too large for the machine is a ValueError naming the bytes, not a MemoryError.
    """
    memory = physical_memory()
    if memory is not None and nbytes > memory:
        raise too_large_for_memory(nbytes, what, f"this machine has {memory} bytes")
    return nbytes


def physical_memory():
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


_NUMPY_SHAPE_REFUSALS = ("array is too big", "Maximum allowed dimension exceeded")  # numpy's ValueErrors for a shape


@contextlib.contextmanager
def named_allocation_failure(nbytes, what):
    """Context manager for the allocation of ``what`` (text naming the sizes), which :func:`check_memory` passed.

    A MemoryError in the block becomes the ValueError of :func:`too_large_for_memory`.
    numpy's own refusal of a shape (a size, or the product of the nonzero ones
    in bytes, beyond 2**63 - 1) becomes a ValueError naming ``what``: out of
    memory only if the arrays hold bytes (``StaticCache((0, 10**30), 4, 1, 1)`` holds 0).
    Any other error propagates as it is.
    """
    try:
        yield
    except MemoryError:
        raise too_large_for_memory(nbytes, what, "the allocation failed") from None
    except ValueError as error:
        if not str(error).startswith(_NUMPY_SHAPE_REFUSALS):
            raise
        if nbytes:
            raise too_large_for_memory(nbytes, what, f"numpy: {error}") from None
        raise ValueError(
            f"{what} holds 0 bytes, but numpy cannot make arrays of these sizes ({error}): every size, "
            "and the product of the nonzero ones in bytes, must be at most 2**63 - 1"
        ) from None


def too_large_for_memory(nbytes, what, why):
    """The ValueError for ``what`` (text), which needs ``nbytes`` bytes that memory cannot hold (``why``)."""
    return ValueError(f"{what} needs {nbytes} bytes ({nbytes / 2**30:.3g} GiB), more than memory can hold ({why})")


# One attention step on given q, k, v (attention.py); attention states, split-KV and cascade attention (split.py)


def as_num_splits(num_splits):
    """``num_splits`` as an int >= 1; TypeError for a non-integer (bools included), ValueError below 1."""
    return as_size("num_splits", num_splits, minimum=1)


def as_lse(name, value):
    """``value`` as a float32/float64 ndarray of log-sum-exps: each finite, or -inf for a state with no keys.

    TypeError for another dtype or a masked array; ValueError for NaN or +inf.
    """
    array = _as_array(name, value)
    if np.isnan(array).any() or np.isposinf(array).any():
        raise ValueError(
            f"{name} contains NaN or +inf: an lse is finite, or -inf for a state with no keys "
            "(FlashAttention before its PR #978 wrote +inf there; pass -inf)"
        )
    return array


def check_scores_fit(dtype, q, *keys):
    """Raise ValueError if a score q·k, or any partial sum of it, could overflow ``dtype``.

    Cauchy–Schwarz bounds every partial sum by |q_t|·|k_s|, the largest norms over
    the last axis of ``q: [..., D_k]`` and of the ``keys`` arrays ``[..., D_k]``,
    scaled before squaring and compared as in :func:`check_score_range`.
    """
    log_k = max((_log10_max_norm(k) for k in keys), default=-math.inf)
    bounds = {"|q·k|": (_log10_max_norm(q) + log_k, "|q_t|·|k_s|")}
    raise_if_too_large("q and k are", bounds, dtype, "rescale q or k")


_NO_MASK = object()  # check_attention_inputs without valid= (attend's): None is a bad mask, not "no mask"


def check_attention_inputs(q, k, v, valid=_NO_MASK):
    """Validate ``q: [..., T_q, D_k]``, ``k: [..., S, D_k]``, ``v: [..., S, D_v]`` (the same leading axes).

    Returns ``(q, k, v, dtype)``, each in ``dtype = np.result_type(q, k, v)``.
    ``valid``, when given (masked_attend's; None is refused), is a key-padding mask:
    a bool array ``[..., S]`` (k's shape without D_k). The checks of k and v then
    take only the keys and values it marks: NaN/inf is refused there only, and the
    overflow bounds take only those; a masked key or value holding NaN/inf is
    returned as 0 (in a copy), so that its weight 0 leaves the output exactly as
    for any finite content. ValueError also for D_k = 0, or a partial sum of q·k
    (|q_t|·|k_s|) or of the output (|v_s|) that could overflow.
    """
    masked = valid is not _NO_MASK
    read = _as_array if masked else as_float_array  # with a mask, only the valid keys and values must be finite
    q, k, v = as_float_array("q", q), read("k", k), read("v", v)
    shapes = f"q {q.shape}, k {k.shape}, v {v.shape}"
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k and v must be [..., T_q, D_k], [..., S, D_k] and [..., S, D_v] "
            f"with the same leading axes, got {shapes}"
        )
    if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        raise ValueError(f"q and k must share D_k, and k and v the S axis: {shapes}")
    if q.shape[-1] == 0:
        raise ValueError(f"D_k must be at least 1: {shapes}")
    keys, values = k, v
    if masked:
        valid = as_key_mask(valid, k)  # then only the valid keys and values must be finite
        keys, values = k[valid], v[valid]  # [valid keys, D_k], [valid keys, D_v]
        k, v = _finite_where_valid("k", k, keys, valid), _finite_where_valid("v", v, values, valid)
    dtype = np.result_type(q, k, v)
    check_scores_fit(dtype, q, keys)
    raise_if_too_large("v is", {"|v|": (_log10_max_norm(values), "|v_s|")}, dtype, "rescale v")
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False), dtype


def _finite_where_valid(name, array, held, valid, where="at a valid key"):
    """``array: [..., S, D]`` itself if it is finite, else a copy with 0 at every key ``valid: [..., S]`` masks;
    ValueError naming ``name`` (and ``where``) if ``held``, ``array[valid]``, holds NaN/inf.

    0 · NaN is NaN, so a masked value holding NaN/inf would reach the output through
    its weight 0; 0 · a finite value is 0, so zeros leave the output as any finite content does.
    """
    if np.isfinite(array).all():  # the common case: one pass, as as_float_array
        return array
    if not np.isfinite(held).all():
        raise ValueError(f"{name} contains NaN or inf {where}")
    return np.where(valid[..., None], array, 0.0).astype(array.dtype, copy=False)


def as_key_mask(valid, k):
    """``valid`` as a bool array ``[..., S]`` of ``k: [..., S, D_k]``'s shape without D_k; TypeError or ValueError.

    TypeError also for None and for a masked array (whose mask np.asarray would drop).
    """
    expected = f"[..., S] = {list(k.shape[:-1])} for k {k.shape}"
    if valid is None or isinstance(valid, np.ma.MaskedArray):
        what = "None" if valid is None else "a masked array"
        raise TypeError(f"valid must be a bool array {expected}, got {what}")
    valid = np.asarray(valid)
    if valid.dtype != np.bool_:
        raise TypeError(f"valid must be a bool array, got dtype {valid.dtype}")
    if valid.shape != k.shape[:-1]:
        raise ValueError(f"valid must be {expected}, got shape {valid.shape}")
    return valid


def check_attention_states(states):
    """Validate ``states``, a non-empty sequence of ``(out, lse)`` pairs of one shape.

    ``out: [..., T_q, D_v]`` finite, ``lse: [..., T_q]`` finite or -inf. Returns
    ``(outs, lses, dtype)``: two lists of arrays in ``dtype = np.result_type`` of them all.
    """
    if isinstance(states, (str, bytes, np.ndarray)) or not hasattr(states, "__iter__"):
        raise TypeError(f"states must be a sequence of (out, lse) pairs, got {type(states).__name__}")
    states = list(states)
    if not states:
        raise ValueError("states must hold at least one (out, lse) pair")
    outs, lses = [], []
    for i, state in enumerate(states):
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"states[{i}] must be an (out, lse) pair, got {type(state).__name__}")
        out, lse = as_float_array(f"states[{i}] out", state[0]), as_lse(f"states[{i}] lse", state[1])
        if out.ndim < 2 or lse.shape != out.shape[:-1]:
            raise ValueError(
                f"states[{i}] must be out [..., T_q, D_v] and lse [..., T_q], got out {out.shape}, lse {lse.shape}"
            )
        if outs and out.shape != outs[0].shape:
            raise ValueError(
                f"every state must have the shape of states[0]: out {outs[0].shape}, states[{i}] out {out.shape}"
            )
        outs.append(out)
        lses.append(lse)
    dtype = np.result_type(*outs, *lses)
    return [o.astype(dtype, copy=False) for o in outs], [s.astype(dtype, copy=False) for s in lses], dtype


def _padded(arrays, s_max, width):
    """B arrays ``[S_i, width]`` as one ``[B, s_max, width]`` array, zero past each S_i."""
    padded = np.zeros((len(arrays), s_max, width), np.result_type(*arrays) if arrays else np.float64)
    for b, a in enumerate(arrays):
        padded[b, : len(a)] = a
    return padded


def _as_suffixes(k_suffix, v_suffix, suffix_lengths, d_k, d_v):
    """The suffixes padded, ``[B, S_max, D_k]`` and ``[B, S_max, D_v]``, and their lengths ``[B]`` (None: all S_max).

    Lists of B arrays ``[S_i, D]`` are padded with zeros; arrays ``[B, S_max, D]``
    come with ``suffix_lengths`` (default: every suffix S_max long), and only the keys
    and values within the lengths must be finite: the padding may hold anything, and
    padding that holds NaN/inf is returned as 0 (in a copy), as masked_attend takes a masked key.
    """
    if isinstance(k_suffix, (list, tuple)) and isinstance(v_suffix, (list, tuple)):
        if suffix_lengths is not None:
            raise ValueError("suffix_lengths is for padded suffixes [B, S_max, D]; lists of suffixes carry their own")
        ks = [as_float_array(f"k_suffix[{i}]", k) for i, k in enumerate(k_suffix)]
        vs = [as_float_array(f"v_suffix[{i}]", v) for i, v in enumerate(v_suffix)]
        if len(ks) != len(vs):
            raise ValueError(f"k_suffix has {len(ks)} suffixes but v_suffix has {len(vs)}")
        for i, (k, v) in enumerate(zip(ks, vs)):
            if k.ndim != 2 or v.ndim != 2 or len(k) != len(v) or k.shape[1] != d_k or v.shape[1] != d_v:
                raise ValueError(
                    f"k_suffix[{i}] and v_suffix[{i}] must be [S_i, D_k={d_k}] and [S_i, D_v={d_v}], "
                    f"got {k.shape} and {v.shape}"
                )
        lengths = np.array([len(k) for k in ks], dtype=np.int64)
        s_max = int(lengths.max(initial=0))
        full = bool((lengths == s_max).all())
        return _padded(ks, s_max, d_k), _padded(vs, s_max, d_v), None if full else lengths
    if not isinstance(k_suffix, np.ndarray) or not isinstance(v_suffix, np.ndarray):
        raise TypeError(
            "k_suffix and v_suffix must both be lists of B arrays [S_i, D] or both arrays [B, S_max, D], "
            f"got {type(k_suffix).__name__} and {type(v_suffix).__name__}"
        )
    read = as_float_array if suffix_lengths is None else _as_array  # with lengths, the padding is not checked
    k_suffix, v_suffix = read("k_suffix", k_suffix), read("v_suffix", v_suffix)
    if (k_suffix.ndim != 3 or v_suffix.ndim != 3 or k_suffix.shape[:2] != v_suffix.shape[:2]
            or k_suffix.shape[2] != d_k or v_suffix.shape[2] != d_v):
        raise ValueError(
            f"k_suffix and v_suffix must be [B, S_max, D_k={d_k}] and [B, S_max, D_v={d_v}] (or lists of "
            f"B arrays [S_i, D]), got k_suffix {k_suffix.shape}, v_suffix {v_suffix.shape}"
        )
    if suffix_lengths is None:
        return k_suffix, v_suffix, None
    lengths = as_sizes_per_sequence("suffix_lengths", suffix_lengths, k_suffix.shape[0])
    if lengths.size and lengths.max() > k_suffix.shape[1]:
        raise ValueError(f"suffix_lengths must be at most S_max={k_suffix.shape[1]}, got {lengths.tolist()}")
    held = _held_suffix_keys(k_suffix, lengths)  # [B, S_max]
    k_suffix = _finite_where_valid("k_suffix", k_suffix, k_suffix[held], held, "within suffix_lengths")
    v_suffix = _finite_where_valid("v_suffix", v_suffix, v_suffix[held], held, "within suffix_lengths")
    return k_suffix, v_suffix, lengths


def _held_suffix_keys(k_suffix, lengths):
    """``[B, S_max]`` bool: True at the keys of ``k_suffix: [B, S_max, D_k]`` within ``lengths`` (None: all)."""
    return np.arange(k_suffix.shape[1]) < (k_suffix.shape[1] if lengths is None else lengths[:, None])


def check_cascade_inputs(q, k_shared, v_shared, k_suffix, v_suffix, suffix_lengths):
    """Validate cascade attention's inputs: ``q: [B, T_q, D_k]``, a shared prefix, B suffixes.

    Returns ``(q, k_shared, v_shared, k_suffix, v_suffix, lengths, dtype)``: the
    arrays in ``dtype = np.result_type`` of them all, the suffixes padded to
    ``[B, S_max, D]``, ``lengths`` ``[B]`` int64 or None when every suffix is S_max long.
    The overflow bound takes the suffix keys within the lengths only, as masked_attend takes its valid keys.
    """
    q = as_float_array("q", q)
    k_shared, v_shared = as_float_array("k_shared", k_shared), as_float_array("v_shared", v_shared)
    if q.ndim != 3 or q.shape[-1] == 0:
        raise ValueError(f"q must be [B, T_q, D_k] with D_k >= 1, got shape {q.shape}")
    if k_shared.ndim != 2 or v_shared.ndim != 2 or len(k_shared) != len(v_shared) or k_shared.shape[1] != q.shape[2]:
        raise ValueError(
            f"k_shared and v_shared must be [S_p, D_k={q.shape[2]}] and [S_p, D_v], "
            f"got k_shared {k_shared.shape}, v_shared {v_shared.shape}"
        )
    k_suffix, v_suffix, lengths = _as_suffixes(k_suffix, v_suffix, suffix_lengths, q.shape[2], v_shared.shape[1])
    if len(k_suffix) != len(q):
        raise ValueError(f"q has B={len(q)} sequences but there are {len(k_suffix)} suffixes: q {q.shape}")
    arrays = (q, k_shared, v_shared, k_suffix, v_suffix)
    dtype = np.result_type(*arrays)
    suffix_keys = k_suffix if lengths is None else k_suffix[_held_suffix_keys(k_suffix, lengths)]  # [..., D_k]
    check_scores_fit(dtype, q, k_shared, suffix_keys)
    return (*(a.astype(dtype, copy=False) for a in arrays), lengths, dtype)
