"""Every input check of the library, grouped by what it checks.

Entry points call these before they compute or mutate anything, so bad input
raises TypeError (a type or dtype) or ValueError (a value or a shape), naming
the argument and the shapes, and changes nothing. Arrays must be float32 or
float64; a computation runs in ``np.result_type`` of its inputs.

Two kinds of rule live elsewhere. Whether an object is a cache at all is the
``isinstance`` test of the ``Cache`` protocol (``cache.check_is_cache``: this
module cannot import cache.py, which imports it). And a store running out of
room is the store's own state, not bad input: ``StaticCache.update`` past
max_seq_len, and ``paged.OutOfBlocksError``. (A decode checks a given cache's
room up front, here, in :func:`check_cache_fits`.)
"""

import math

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
    """Return ``np.dtype(dtype)``; TypeError unless it is float32 or float64."""
    if dtype is _FLOAT64 or dtype is _FLOAT32:  # already a dtype, e.g. from np.result_type
        return dtype
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def as_itemsize(dtype, named):
    """Bytes per element of ``dtype``: a float or integer numpy dtype, or a name in ``named`` (name -> bytes).

    A dtype whose name is in ``named`` (as ml_dtypes registers ``bfloat16``) counts
    as that name. TypeError for anything else, None included (``np.dtype(None)``
    would silently mean float64).
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
    if dtype.kind not in "fiu":
        raise TypeError(f"dtype must be a float or integer dtype, got {dtype} (or {names})")
    return dtype.itemsize


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
    raise_if_too_large("x and the weights", bounds, dtype, "rescale x or the weights")


def raise_if_too_large(what, bounds, dtype, remedy):
    """Raise ValueError naming every bound (label -> (log10 value, formula)) above ``dtype``'s max / 2, with its figure."""
    limit = _LOG10_LIMIT[np.dtype(dtype)]
    tripped = {label: f"{label} <= {formula} = {_power_of_ten(value)}" for label, (value, formula) in bounds.items() if value > limit}
    if tripped:
        raise ValueError(
            f"{what} are too large for {np.dtype(dtype)}: {' and '.join(tripped)} could overflow "
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


# One attention step on given q, k, v


def check_attention_inputs(q, k, v, valid=None):
    """Validate ``q: [..., T_q, D_k]``, ``k: [..., S, D_k]``, ``v: [..., S, D_v]`` and ``valid: [..., S]`` bool.

    Returns ``(q, k, v, valid)``. ValueError also for leading axes that differ,
    D_k = 0, S = 0 without ``valid``, or a partial sum of q·k or of the output
    that could overflow (the bounds take the valid keys only).
    """
    q, k, v = as_float_array("q", q), as_float_array("k", k), as_float_array("v", v)
    if not (q.ndim >= 2 and k.ndim == v.ndim == q.ndim and k.shape[:-2] == q.shape[:-2]
            and v.shape[:-1] == k.shape[:-1] and k.shape[-1] == q.shape[-1]):
        raise ValueError(
            "q, k and v must be [..., T_q, D_k], [..., S, D_k] and [..., S, D_v] with the same "
            f"leading axes: got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"D_k must be at least 1: q {q.shape}")
    keys, values = k, v
    if valid is None and k.shape[-2] == 0:
        raise ValueError(f"k and v hold no key position (S = 0): k {k.shape}, v {v.shape}")
    if valid is not None:
        valid = np.asarray(valid)
        if valid.dtype != np.bool_:
            raise TypeError(f"valid must be a bool array, got dtype {valid.dtype}")
        if valid.shape != k.shape[:-1]:
            raise ValueError(f"valid must be [..., S] = {list(k.shape[:-1])} for k {k.shape}, got shape {valid.shape}")
        keys, values = k[valid], v[valid]  # [valid keys, D_k], [valid keys, D_v]
    log_qk = _log10_max_norm(q) + _log10_max_norm(keys)
    bounds = {"|q·k|": (log_qk, "|q_t|·|k_s|"), "|v|": (_log10_max_norm(values), "|v_s|")}
    raise_if_too_large("q, k and v", bounds, np.result_type(q, k, v), "rescale q, k or v")
    return q, k, v, valid


# Caches: their own arguments, and a cache given to a decode


def as_batch_shape(batch_shape):
    """``batch_shape`` as a tuple of ints >= 0; TypeError unless it is a tuple or list."""
    if not isinstance(batch_shape, (tuple, list)):
        raise TypeError(f"batch_shape must be a tuple of ints such as () or (B,), got {batch_shape!r}")
    if not batch_shape:
        return ()
    return tuple(as_size(f"batch_shape[{i}]", n) for i, n in enumerate(batch_shape))


def check_new_positions(k, v, cache):
    """Raise unless ``k: [..., T_new, D_k]`` and ``v: [..., T_new, D_v]`` fit ``cache``."""
    if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
        raise TypeError(f"k and v must be numpy arrays, got {type(k).__name__}, {type(v).__name__}")
    if k.ndim < 2 or k.ndim != v.ndim or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must be [..., T_new, D_k] and [..., T_new, D_v] with the same "
            f"leading axes, got k {k.shape}, v {v.shape}"
        )
    if k.dtype not in SUPPORTED_DTYPES or v.dtype != k.dtype:
        raise TypeError(f"k and v must both be float32 or both float64, got {k.dtype} and {v.dtype}")
    if cache.k_cache is None:
        return
    expected_k = cache.k_cache.shape[:-2] + (k.shape[-2], cache.k_cache.shape[-1])
    expected_v = cache.v_cache.shape[:-2] + (v.shape[-2], cache.v_cache.shape[-1])
    if k.shape != expected_k or v.shape != expected_v:
        raise ValueError(
            f"k {k.shape} and v {v.shape} do not fit the cache's "
            f"k_cache {cache.k_cache.shape} and v_cache {cache.v_cache.shape}"
        )
    if not np.can_cast(k.dtype, cache.k_cache.dtype, casting="safe"):
        raise TypeError(f"k and v are {k.dtype}, which the cache's {cache.k_cache.dtype} cannot hold without loss")


def check_crop(length, stored):
    """Return ``length`` as an int, or raise unless it is an integer in [0, stored]."""
    length = as_size("crop length", length)
    if length > stored:
        raise ValueError(f"crop length must be in [0, {stored}], got {length}")
    return length


def check_cache_fits(cache, x, w_q, w_k, w_v, dtype, layout=None):
    """Raise unless a given cache fits ``x``'s leading axes, the widths, ``dtype`` and T more positions.

    ``layout`` is ``(expected_k, expected_v, text)``: the shapes ``k_cache`` and
    ``v_cache`` must have without their T axis, and the layout to name in the
    error; by default ``x``'s leading axes with D_k and D_v (single head). Keys
    already in the cache (a prefill) also enter the overflow bound of q·k.
    """
    k_cache, v_cache = getattr(cache, "k_cache", None), getattr(cache, "v_cache", None)
    if k_cache is None:
        return
    if layout is None:
        layout = (x.shape[:-2] + (w_k.shape[1],), x.shape[:-2] + (w_v.shape[1],),
                  f"vs x {x.shape}, D_k={w_k.shape[1]}, D_v={w_v.shape[1]}")
    expected_k, expected_v, text = layout
    if k_cache.shape[:-2] + k_cache.shape[-1:] != expected_k or v_cache.shape[:-2] + v_cache.shape[-1:] != expected_v:
        raise ValueError(f"cache does not fit x: k_cache {k_cache.shape} and v_cache {v_cache.shape} {text}")
    if k_cache.dtype != dtype:
        raise TypeError(f"cache holds {k_cache.dtype} but the computation is {dtype}")
    stored, room = cache.get_seq_length(), getattr(cache, "max_seq_len", None)
    if room is not None and stored + x.shape[-2] > room:
        raise ValueError(
            f"cache too short: {stored} of max_seq_len={room} positions used, x needs T={x.shape[-2]} more"
        )
    if stored:
        check_score_range(x, w_q, w_k, w_v, dtype, stored_k=k_cache[..., :stored, :])


def check_head_cache_fits(cache, x, w_q, w_k, w_v, n_kv_heads, head_dim, dtype):
    """:func:`check_cache_fits` for the multi-head layout ``[*x.shape[:-2], H_kv, T_max, D_head]``."""
    expected = x.shape[:-2] + (n_kv_heads, head_dim)  # the cache's shape without its T_max axis
    layout = ", ".join(map(str, x.shape[:-2] + (n_kv_heads, "T_max", head_dim)))
    text = f"must be [{layout}] for x {x.shape}, n_kv_heads={n_kv_heads}, head_dim={head_dim}"
    check_cache_fits(cache, x, w_q, w_k, w_v, dtype, layout=(expected, expected, text))


# The paged cache: sequence ids and new positions


def as_id_list(seq_ids):
    """``seq_ids`` as a list; TypeError unless it is an ordered sequence (list, tuple, array, range)."""
    if not isinstance(seq_ids, (list, tuple, np.ndarray, range)):
        raise TypeError(
            f"seq_ids must be a list, tuple or array of sequence ids (ordered: row i is seq_ids[i]), "
            f"got {type(seq_ids).__name__} {seq_ids!r}"
        )
    return list(seq_ids)


def check_hashable(seq_id):
    try:
        hash(seq_id)
    except TypeError:
        raise TypeError(f"a sequence id must be hashable, got {seq_id!r}") from None


def check_new_id(seq_id, known):
    """Raise unless ``seq_id`` is hashable and not among the ids ``known``."""
    check_hashable(seq_id)
    if seq_id in known:
        raise ValueError(f"sequence {seq_id!r} is already in the cache")


def check_known_ids(seq_ids, known):
    """Raise unless every one of ``seq_ids`` is among the ids ``known``."""
    for seq_id in seq_ids:
        check_hashable(seq_id)
        if seq_id not in known:
            raise ValueError(f"sequence {seq_id!r} is not in the cache; known: {list(known)}")


def check_update_ids(seq_ids, known):
    """``seq_ids`` as a list of distinct ids, each among ``known``."""
    seq_ids = as_id_list(seq_ids)
    check_known_ids(seq_ids, known)
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"seq_ids repeats a sequence: {seq_ids}")
    return seq_ids


def check_paged_positions(k, v, n_seqs, cache):
    """Return k, v as arrays, or raise unless they are ``[N, T_new, D_k]``/``[N, T_new, D_v]`` for the pool."""
    k, v = as_float_array("k", k), as_float_array("v", v)
    expected_k = (n_seqs, k.shape[1] if k.ndim == 3 else "T_new", cache.k_cache.shape[-1])
    expected_v = (n_seqs, expected_k[1], cache.v_cache.shape[-1])
    if k.shape != expected_k or v.shape != expected_v:
        raise ValueError(
            f"k and v must be [N, T_new, D_k] and [N, T_new, D_v] for N={n_seqs} seq_ids, "
            f"D_k={expected_k[2]}, D_v={expected_v[2]}: got k {k.shape}, v {v.shape}"
        )
    if v.dtype != k.dtype or not np.can_cast(k.dtype, cache.k_cache.dtype, casting="safe"):
        raise TypeError(
            f"k and v must both be float32 or both float64 and fit the pool's {cache.k_cache.dtype}: "
            f"got {k.dtype} and {v.dtype}"
        )
    return k, v


# Ragged batches


def _as_sequences(x, lengths):
    """The sequences of ``x``: a list of ``[T_i, D_model]`` arrays and whether x came padded."""
    if isinstance(x, (list, tuple)):
        if lengths is not None:
            raise ValueError("lengths is for a padded x [B, T_max, D_model]; a list of sequences carries its own")
        seqs = [as_float_array(f"x[{i}]", seq) for i, seq in enumerate(x)]
        for i, seq in enumerate(seqs):
            if seq.ndim != 2:
                raise ValueError(f"x[{i}] must be [T_i, D_model], got shape {seq.shape}")
        return seqs, False
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a list of [T_i, D_model] arrays or an ndarray [B, T_max, D_model], got {type(x)}")
    if x.ndim != 3:
        raise ValueError(f"a padded x must be [B, T_max, D_model], got shape {x.shape}")
    as_float_array("x", x[:, :0])  # the dtype, even when every length is 0
    if lengths is None:
        lengths = np.full(x.shape[0], x.shape[1])
    else:
        lengths = as_sizes_per_sequence("lengths", lengths, x.shape[0])
    if lengths.size and lengths.max() > x.shape[1]:
        raise ValueError(f"lengths must be at most T_max={x.shape[1]} of x {x.shape}, got {lengths.tolist()}")
    # Only x[b, :T_b] is read (checked, copied): the padding may hold anything.
    return [as_float_array(f"x[{b}, :{n}]", x[b, :n]) for b, n in enumerate(lengths)], True


def check_ragged_inputs(x, w_q, w_k, w_v, lengths, start_steps):
    """Validate a ragged decode's inputs.

    Returns ``(seqs, padded, (w_q, w_k, w_v), dtype, start_steps)``: the
    sequences as ``[T_i, D_model]`` arrays, whether ``x`` came padded, the weights
    in ``dtype`` and ``start_steps`` as ``[B]`` int64.
    """
    seqs, padded = _as_sequences(x, lengths)
    d_model = seqs[0].shape[1] if seqs else (np.shape(w_q)[:1] or (0,))[0]
    for i, seq in enumerate(seqs):
        if seq.shape[1] != d_model:
            raise ValueError(f"every sequence must share D_model: x[0] has {d_model}, x[{i}] has shape {seq.shape}")
    empty_dtype = x.dtype if isinstance(x, np.ndarray) else np.float64  # B = 0 keeps a padded x's dtype
    flat = np.concatenate(seqs) if seqs else np.empty((0, d_model), empty_dtype)  # [sum T_i, D_model]
    _, w_q, w_k, w_v, dtype = check_projection_inputs(flat, w_q, w_k, w_v, x_ndims=(2,))
    n_seqs = len(seqs)
    if start_steps is None:
        start_steps = np.zeros(n_seqs, np.int64)
    else:
        start_steps = as_sizes_per_sequence("start_steps", start_steps, n_seqs)
    return seqs, padded, (w_q, w_k, w_v), dtype, start_steps
