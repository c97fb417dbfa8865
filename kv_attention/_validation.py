"""Every input check of the library, grouped by what it checks.

Entry points call these before they compute or mutate anything, so bad input
raises TypeError (a type or dtype) or ValueError (a value or a shape), naming
the argument and the shapes, and changes nothing. Arrays must be float32 or
float64; a computation runs in ``np.result_type`` of its inputs. Sizes: D_k >= 1
wherever there are queries and keys (a cache's or a pool's ``k_dim`` too); every other
array size (D_v, D_model, T, B, S, a cache's length or batch axes) may be 0 and gives
empty arrays. A ``block_size`` or ``window`` (tokens a block or a window holds) is >= 1.

Two kinds of rule live elsewhere. Whether an object is a cache at all is the
``isinstance`` test of the ``Cache`` protocol (``cache.check_is_cache``: this
module cannot import cache.py, which imports it). And a store running out of
room is the store's own state, not bad input: ``StaticCache.update`` past
max_seq_len, and ``paged.OutOfBlocksError``. (A decode checks a given cache's
room up front, in ``decode.check_cache_fits``.) A ``PagedKVCache`` given to a
ragged decode and the ``Request`` objects given to ``serve`` are checked here,
their classes imported inside the check (paged.py and scheduler.py import this module).
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


def check_projection_inputs(x, w_q, w_k, w_v, x_ndims, check_finite=True):
    """Validate ``x`` (``x_ndims`` axes, e.g. ``(2,)`` or ``(2, 3)``) and single-head weights.

    Returns ``(x, w_q, w_k, w_v, dtype)``, the weights in ``dtype``. ValueError also
    for D_k of w_q != D_k of w_k, or D_k == 0. Written for speed (it runs on every
    decode call): one test of the types and dtypes, one of every shape, and the
    conversions or messages only when a test fails. ``check_finite``: also run
    :func:`check_score_range` (NaN/inf and the overflow bound), which reads every element.
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
    if check_finite:
        check_score_range(x, w_q, w_k, w_v, dtype)
    return x, w_q, w_k, w_v, dtype


def _in_common_dtype_converted(x, w_q, w_k, w_v):
    """``x`` and the weights as float arrays, the weights cast to ``dtype = np.result_type`` of all four, and dtype."""
    x, w_q, w_k, w_v = _as_array("x", x), _as_array("w_q", w_q), _as_array("w_k", w_k), _as_array("w_v", w_v)
    dtype = np.result_type(x, w_q, w_k, w_v)
    return x, w_q.astype(dtype, copy=False), w_k.astype(dtype, copy=False), w_v.astype(dtype, copy=False), dtype


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
        raise ValueError(f"{name} contains NaN or inf")


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


# Caches: their own arguments, and a cache given to a decode


def as_batch_shape(batch_shape):
    """``batch_shape`` as a tuple of ints >= 0; TypeError unless it is a tuple or list."""
    if not isinstance(batch_shape, (tuple, list)):
        raise TypeError(f"batch_shape must be a tuple of ints such as () or (B,), got {batch_shape!r}")
    if not batch_shape:
        return ()
    return tuple(as_size(f"batch_shape[{i}]", n) for i, n in enumerate(batch_shape))


def check_new_positions(k, v, cache):
    """``k: [..., T_new, D_k]`` and ``v: [..., T_new, D_v]`` as :func:`as_float_array` gives them, or raise
    unless they fit ``cache``.

    As every entry point: TypeError for a masked array, ValueError for NaN/inf; a
    big-endian array is converted, and an np.matrix is taken as a plain array.
    """
    if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
        raise TypeError(f"k and v must be numpy arrays, got {type(k).__name__}, {type(v).__name__}")
    k_dtype, v_dtype = k.dtype.newbyteorder("="), v.dtype.newbyteorder("=")  # '>f8' counts as float64
    if k_dtype not in SUPPORTED_DTYPES or v_dtype != k_dtype:
        raise TypeError(f"k and v must both be float32 or both float64, got {k.dtype} and {v.dtype}")
    k, v = as_float_array("k", k), as_float_array("v", v)
    if k.ndim < 2 or k.ndim != v.ndim or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must be [..., T_new, D_k] and [..., T_new, D_v] with the same "
            f"leading axes, got k {k.shape}, v {v.shape}"
        )
    if cache.k_cache is None:
        return k, v
    expected_k = cache.k_cache.shape[:-2] + (k.shape[-2], cache.k_cache.shape[-1])
    expected_v = cache.v_cache.shape[:-2] + (v.shape[-2], cache.v_cache.shape[-1])
    if k.shape != expected_k or v.shape != expected_v:
        raise ValueError(
            f"k {k.shape} and v {v.shape} do not fit the cache's "
            f"k_cache {cache.k_cache.shape} and v_cache {cache.v_cache.shape}"
        )
    if not np.can_cast(k.dtype, cache.k_cache.dtype, casting="safe"):
        raise TypeError(f"k and v are {k.dtype}, which the cache's {cache.k_cache.dtype} cannot hold without loss")
    return k, v


def check_crop(length, stored):
    """Return ``length`` as an int, or raise unless it is an integer in [0, stored]."""
    length = as_size("crop length", length)
    if length > stored:
        raise ValueError(f"crop length must be in [0, {stored}], got {length}")
    return length


# Windows, chunks and the sliding-window cache


def check_window_crop(length, stored, first_held, window, n_sink):
    """Raise unless a sliding-window cache cut to ``length`` (already in [0, stored]) still holds every key
    position ``length`` would attend to: the sinks, and ``length - window + 1 .. length - 1``.

    ``first_held`` is the oldest window position the ring still holds (>= n_sink).
    """
    lowest = max(n_sink, length - window + 1)  # the oldest window position that position `length` attends to
    if lowest < min(length, first_held):
        raise ValueError(
            f"cannot crop the sliding-window cache (window={window}, n_sink={n_sink}) from {stored} to "
            f"{length} positions: position {length} attends to positions from {length - window + 1}, but the "
            f"ring has overwritten every position before {first_held}; crop to a length in "
            f"[{first_held + window - 1}, {stored}] or in [0, {n_sink}]"
        )


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


def check_pool_size(num_blocks, block_size, k_dim, v_dim, dtype, bookkeeping):
    """The bytes a paged pool needs (``k_cache``, ``v_cache``, ``bookkeeping``); ValueError beyond physical memory."""
    nbytes = num_blocks * block_size * (k_dim + v_dim) * dtype.itemsize + bookkeeping
    return check_memory(nbytes, pool_description(num_blocks, block_size, k_dim, v_dim, dtype))


def pool_description(num_blocks, block_size, k_dim, v_dim, dtype):
    return f"a pool of num_blocks={num_blocks} blocks of block_size={block_size}, k_dim={k_dim}, v_dim={v_dim} in {dtype}"


def check_buffer_size(what, batch_shape, slots, k_dim, v_dim, dtype):
    """``(nbytes, text)``: the bytes of buffers ``[*batch_shape, slots, k_dim]`` and ``[*batch_shape, slots, v_dim]``
    in ``dtype`` (a cache's), and ``what`` (e.g. "a StaticCache") with the sizes; ValueError beyond physical memory."""
    nbytes = math.prod(batch_shape) * slots * (k_dim + v_dim) * dtype.itemsize
    text = f"{what} of batch_shape={batch_shape}, {slots} positions, k_dim={k_dim}, v_dim={v_dim} in {dtype}"
    return check_memory(nbytes, text), text


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


def _as_integer_array(name, values):
    """``values`` as an int64 array of token ids; TypeError unless integers (an empty list counts),
    ValueError for a negative id or one beyond int64."""
    array = np.asarray(values)
    if array.size == 0 and array.dtype.kind == "f":  # np.asarray([]) is float64
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds an id beyond int64: {array.max()}")
    negative = np.argwhere(array < 0)
    if negative.size:
        j = tuple(negative[0].tolist())
        index = ", ".join(map(str, j))
        raise ValueError(f"{name}[{index}] = {array[j]} is negative: token ids are integers >= 0")
    return array.astype(np.int64)


def as_token_ids(name, token_ids):
    """``token_ids`` as a 1-D int64 array; TypeError unless integers, ValueError unless 1-D."""
    array = _as_integer_array(name, token_ids)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {array.shape}")
    return array


def check_paged_token_ids(token_ids, n_seqs, t_new):
    """The token ids of an update's new positions as ``[N, T_new]`` int64 (None stays None)."""
    if token_ids is None:
        return None
    array = _as_integer_array("token_ids", token_ids)
    if array.shape != (n_seqs, t_new):
        raise ValueError(
            f"token_ids must be [N, T_new] = [{n_seqs}, {t_new}], one per new position, got shape {array.shape}"
        )
    return array


# Blocks of a paged pool


def check_block_id(block, num_blocks):
    """``block`` as an int in [0, num_blocks); TypeError unless an integer, ValueError out of range."""
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise TypeError(f"a block id must be an integer, got {block!r}")
    if not 0 <= block < num_blocks:
        raise ValueError(f"block {block} is out of range: the pool has blocks 0..{num_blocks - 1}")
    return int(block)


def check_blocks_held(blocks, ref_counts, action, cached=()):
    """``blocks`` as a list of distinct ints in range; for an ``action``, each held (refcount >= 1) or in ``cached``.

    ``action`` (``"free"``, ``"share"``, ``"cache"``) names the call in the message; None checks the range only.
    """
    blocks = [check_block_id(block, len(ref_counts)) for block in blocks]
    if len(set(blocks)) != len(blocks):
        raise ValueError(f"blocks repeat a block: {blocks}")
    if action is not None:
        for block in blocks:
            if ref_counts[block] < 1 and block not in cached:
                what = "Double free! " if action == "free" else ""
                raise ValueError(f"{what}cannot {action} block {block}: it is free (refcount 0)")
    return blocks



def check_paged_cache_fits(cache, strategy, n_seqs, d_k, d_v, dtype, block_size, num_blocks):
    """Raise unless a caller's ``cache`` is a PagedKVCache a ragged decode of ``n_seqs`` sequences can use.

    It must be for ``strategy="paged"``, hold ``dtype`` with widths D_k and D_v,
    match ``block_size`` when one is given, come without ``num_blocks`` (the
    pool is the cache's) and not hold the decode's sequence ids 0..n_seqs-1.
    """
    from .paged import PagedKVCache  # paged.py imports this module

    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    if strategy != "paged":
        raise ValueError(f"cache= is for strategy='paged', got strategy={strategy!r}")
    if num_blocks is not None:
        raise ValueError(f"num_blocks={num_blocks} was given with a cache, whose pool has {cache.num_blocks} blocks")
    if block_size is not None and block_size != cache.block_size:
        raise ValueError(f"block_size={block_size} does not fit the cache's block_size={cache.block_size}")
    widths = (cache.k_cache.shape[-1], cache.v_cache.shape[-1])
    if widths != (d_k, d_v):
        raise ValueError(
            f"cache does not fit the weights: k_cache {cache.k_cache.shape} and v_cache {cache.v_cache.shape} "
            f"need D_k={d_k}, D_v={d_v}"
        )
    if cache.k_cache.dtype != dtype:
        raise TypeError(f"cache holds {cache.k_cache.dtype} but the computation is {dtype}")
    held = set(cache.seq_ids)
    taken = [s for s in range(n_seqs) if s in held]
    if taken:
        raise ValueError(f"cache already holds sequence(s) {taken}; the decode's sequences are 0..{n_seqs - 1}")


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


# Serving: requests and the scheduler's options


def check_serve_inputs(requests, embedding, w_q, w_k, w_v, block_size, num_blocks, budget, max_num_seqs, caching):
    """Validate the inputs of ``serve``.

    Returns ``(specs, embedding, (w_q, w_k, w_v), dtype, (block_size, num_blocks,
    budget, max_num_seqs, caching))``: one ``(request_id, token_ids [L] int64,
    prompt_len, arrival_step)`` per request, and the embedding and weights in ``dtype``.
    """
    options = (
        as_size("block_size", block_size, minimum=1),
        as_size("num_blocks", num_blocks),
        as_size("max_num_batched_tokens", budget, minimum=1),
        None if max_num_seqs is None else as_size("max_num_seqs", max_num_seqs, minimum=1),
        as_flag("enable_prefix_caching", caching),
    )
    embedding = as_float_array("embedding", embedding)
    if embedding.ndim != 2:
        raise ValueError(f"embedding must be [V, D_model], got shape {embedding.shape}")
    w_q, w_k, w_v = (_as_array(name, w) for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)))  # before any shape
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if w.ndim == 2 and w.shape[0] != embedding.shape[1]:
            raise ValueError(
                f"{name} has {w.shape[0]} rows but embedding has D_model={embedding.shape[1]}: "
                f"embedding {embedding.shape}, {name} {w.shape}"
            )
    # x = embedding[token_ids]: the bound on |q|·|k| over every embedding row covers every token.
    embedding, w_q, w_k, w_v, dtype = check_projection_inputs(embedding, w_q, w_k, w_v, x_ndims=(2,))
    specs = _check_requests(requests, len(embedding), options[0], options[1])
    return specs, embedding.astype(dtype, copy=False), (w_q, w_k, w_v), dtype, options


def _check_requests(requests, vocab_size, block_size, num_blocks):
    """One ``(request_id, token_ids, prompt_len, arrival_step)`` per request, or raise naming the request."""
    from .scheduler import Request  # scheduler.py imports this module

    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests must be a list of Request, got {type(requests).__name__}")
    specs, seen = [], {}
    for i, request in enumerate(requests):
        if not isinstance(request, Request):
            raise TypeError(f"requests[{i}] must be a Request, got {type(request).__name__}")
        try:
            hash(request.request_id)
        except TypeError:
            raise TypeError(f"requests[{i}]: request_id must be hashable, got {request.request_id!r}") from None
        if request.request_id != request.request_id:  # NaN: two of them would both pass as distinct keys
            raise ValueError(f"requests[{i}]: request_id must equal itself to key the outputs, got "
                             f"{request.request_id!r}")
        name = f"request {request.request_id!r} (requests[{i}])"
        if request.request_id in seen:
            raise ValueError(f"{name} repeats the request_id of requests[{seen[request.request_id]}]")
        seen[request.request_id] = i
        specs.append(_check_request(name, request, vocab_size, block_size, num_blocks))
    return specs


def _check_request(name, request, vocab_size, block_size, num_blocks):
    tokens = as_token_ids(f"{name}: token_ids", request.token_ids)
    outside = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if outside.size:
        j = int(outside[0])
        raise ValueError(
            f"{name}: token_ids[{j}] = {tokens[j]} is not a row of the embedding: ids must be in [0, V={vocab_size})"
        )
    prompt_len = as_size(f"{name}: prompt_len", request.prompt_len, minimum=1)
    if prompt_len > len(tokens):
        raise ValueError(f"{name}: prompt_len must be in [1, len(token_ids)={len(tokens)}], got {prompt_len}")
    arrival_step = as_size(f"{name}: arrival_step", request.arrival_step)
    if arrival_step > _MAX_STEP:
        raise ValueError(f"{name}: arrival_step={arrival_step} is too large: at most 2**62")
    blocks = math.ceil(len(tokens) / block_size)
    if blocks > num_blocks:
        raise ValueError(
            f"{name} can never fit the pool: its {len(tokens)} tokens need {blocks} blocks of "
            f"block_size={block_size}, and num_blocks={num_blocks}"
        )
    return request.request_id, tokens, prompt_len, arrival_step
