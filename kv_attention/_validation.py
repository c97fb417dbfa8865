"""Argument checks the modules share, run before anything is mutated: TypeError for a type or dtype, ValueError
for a value or a shape, the argument named. ``check_finite=True`` scans for NaN/inf, as ``scipy.linalg``.

Activations (x, q, weights, the k, v an ``update`` takes) are float32 or float64; storage (a cache's buffers, the
k, v attention reads) may also be bfloat16 or float16, computed in float32, known by its dtype's name (no ml_dtypes).
"""

import numpy as np

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_FLOAT32, _FLOAT64 = SUPPORTED_DTYPES
STORAGE_NAMES = ("bfloat16", "float16")  # 2-byte storage; computed in float32
_KINDS = {False: "float32 or float64", True: "float32, float64, bfloat16 or float16"}  # by storage=
_LARGEST = {"bfloat16": 3.3895313892515355e38, "float16": 65504.0}  # (2 - 2^-7)·2^127, (2 - 2^-10)·2^15
_MAX_STEP = 2**62  # a ragged decode's start_steps[i] + lengths[i] must stay within int64


def is_storage_dtype(dtype):
    """Whether ``dtype`` (a np.dtype) is bfloat16 or float16, a storage dtype computed in float32."""
    return dtype.name in STORAGE_NAMES and dtype.itemsize == 2


def compute_dtype(dtype):
    """The dtype a computation over storage of ``dtype`` runs in: float32 for bfloat16/float16, else ``dtype``."""
    return _FLOAT32 if is_storage_dtype(dtype) else dtype


def as_stored(name, x, dtype):
    """Float32 ``x`` rounded to storage ``dtype`` (nearest, ties to even, as ``astype``), else ``x`` itself;
    ValueError where a finite value would be stored as inf."""
    if not is_storage_dtype(dtype):
        return x
    with np.errstate(over="ignore"):
        stored = x.astype(dtype)
    if (np.isinf(stored) & np.isfinite(x)).any():
        raise ValueError(f"{name} holds values beyond {dtype}'s largest finite value, "
                         f"{_LARGEST[dtype.name]:g}: they would be stored as inf")
    return stored


def as_array(name, value, storage=False):
    """``value`` as a native-byte-order float32/float64 ndarray (never a copy of one already so);
    with ``storage=True`` bfloat16 and float16 too (k, v read from a cache)."""
    if type(value) is np.ndarray and (value.dtype is _FLOAT64 or value.dtype is _FLOAT32):
        return value
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; pass a plain ndarray (e.g. {name}.filled(0.0))")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{name} is not a rectangular array: {error}") from None
    if array.dtype.kind == "f" and not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if storage and is_storage_dtype(array.dtype):
        return array
    if array.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be a {_KINDS[storage]} array, got dtype {array.dtype}")
    return array


def check_finite_array(name, array):
    """Raise ValueError naming ``name`` if ``array`` holds NaN or inf."""
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or inf")


def as_float_array(name, value, storage=False):
    """:func:`as_array`, and NaN/inf refused."""
    array = as_array(name, value, storage)
    check_finite_array(name, array)
    return array


def as_integer_array(name, values):
    """``values`` as an int64 array of token ids; TypeError unless integers (an empty list counts),
    ValueError for a negative id or one beyond int64."""
    array = np.asarray(values)
    if array.size == 0 and array.dtype.kind == "f":  # np.asarray([]) is float64
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds an id beyond int64: {array.max()}")
    if (array < 0).any():
        j = tuple(np.argwhere(array < 0)[0].tolist())
        raise ValueError(f"{name}[{', '.join(map(str, j))}] = {array[j]} is negative: token ids are integers >= 0")
    return array.astype(np.int64, copy=False)


def as_size(name, value, minimum=0):
    """``value`` as an int >= ``minimum``; TypeError for a non-integer (bools included)."""
    if type(value) is int and value >= minimum:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def as_real(name, value, least, above=False):
    """``value``, a finite real number (not a bool) >= ``least`` (> with ``above``); TypeError, ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not (least < value if above else least <= value) or not value < np.inf:  # NaN fails too
        raise ValueError(f"{name} must be finite and {'>' if above else '>='} {least}, got {value!r}")
    return value


def as_sizes_per_sequence(name, values, count):
    """``values`` as an int64 array of ``count`` integers in [0, 2**62]."""
    if isinstance(values, (str, bytes)) or np.ndim(values) != 1 or len(values) != count:
        raise ValueError(f"{name} must be {count} integers, one per sequence, got {values!r}")
    sizes = [as_size(f"{name}[{i}]", n) for i, n in enumerate(values)]
    for i, n in enumerate(sizes):
        if n > _MAX_STEP:
            raise ValueError(f"{name}[{i}]={n} is too large: at most 2**62 decode steps")
    return np.array(sizes, dtype=np.int64)


def as_float_dtype(dtype, storage=False):
    """``np.dtype(dtype)``; TypeError unless float32 or float64 (None too: np.dtype(None) is float64),
    or with ``storage=True`` bfloat16 or float16 (a cache's buffers)."""
    if dtype is _FLOAT64 or dtype is _FLOAT32:
        return dtype
    try:
        dtype = "None" if dtype is None else np.dtype(dtype)  # a string: np.dtype == None compares as float64
    except TypeError:
        dtype = repr(dtype)
    if not isinstance(dtype, str) and (dtype in SUPPORTED_DTYPES or storage and is_storage_dtype(dtype)):
        return dtype
    raise TypeError(f"dtype must be {_KINDS[storage]}, got {dtype}")


def as_flag(name, value):
    """``value`` as a bool; TypeError unless it is one, so a truthy string is not taken for True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(what, value, known):
    """Raise ValueError unless ``value`` is one of the names ``known``."""
    if not isinstance(value, str) or value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
