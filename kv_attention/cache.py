"""K/V caches: the :class:`Cache` base class, grown by concatenation (dynamic) or preallocated (static).

A cache holds ``k_cache: [..., T, D_k]`` and ``v_cache: [..., T, D_v]``; the leading
axes are free (``[]`` one sequence, ``[B]`` a batch, ``[B, H_kv]`` multi-head), and
new positions are appended along axis -2. ``update(k, v)`` returns the keys and
values to attend to. The interface is Hugging Face ``transformers``' ``cache_utils``
(``Cache``, ``DynamicCache``, ``StaticCache``, ``update``, ``get_seq_length``, ``crop``).

What differs from the static caches of Hugging Face and gpt-fast (``KVCache`` in
gpt-fast's ``model.py``): both allocate ``[B, H, max_seq_len, D]`` once and write new
positions in place, as :class:`StaticCache` does, but they return the whole buffer
and mask the positions past the length, a fixed shape that a compiled graph needs.
:class:`StaticCache` returns views ``[..., :T, :]`` instead, so a NumPy decode
attends without a mask.

Storage in bfloat16 or float16 (``dtype=ml_dtypes.bfloat16`` or ``np.float16``), as
engines store K/V in the model's dtype: ``update`` takes float32 k, v and rounds them
to the nearest stored value (ties to even, as ``astype``); it returns the stored
2-byte arrays, and attention reads them upcast to float32, so the bytes a decode
reads are the bytes stored and ``nbytes`` counts 2 per element. With unit roundoff
u (2^-8 bfloat16, 2^-11 float16) a stored element is within u·|x| + η of x (η, half
the smallest subnormal: 2^-25 float16, 2^-134 bfloat16), and output column d of one
query's attention, o = Σ_i p_i v_i, is within

    |Δo_d| <= u·max_i |v_id| + η + tanh(δ/2)·(max_i v_id - min_i v_id),
    δ = max_i (u·Σ_d |q_d k_id| + η·‖q‖₁) / sqrt(D_k)

of float32 storage's, in exact arithmetic (δ bounds each logit's change; the float32
computation adds its own rounding). docs/mechanisms.md derives it;
tests/kv_attention/test_storage_dtype.py holds a seeded sweep to it.

Errors: ``update`` raises TypeError for k, v that are not float32/float64 arrays of
one dtype (or float64 into a float32, bfloat16 or float16 cache), ValueError for
NaN/inf (unless ``check_finite=False``), for values beyond a float16/bfloat16
cache's largest finite value (which would be stored as inf), or shapes that do not
fit; a full static cache raises :class:`StaticCacheFullError`. Every check runs
before anything is written, so a call that raises leaves the cache unchanged.
"""

import abc

import numpy as np

from ._validation import (SUPPORTED_DTYPES, as_array, as_float_dtype, as_size, as_stored, check_finite_array,
                          compute_dtype, is_storage_dtype)


class CacheFullError(Exception):
    """A cache has no room for the positions a call brings; the cache was left unchanged.

    The base of :class:`StaticCacheFullError` (a ValueError) and
    :class:`~kv_attention.paged.OutOfBlocksError` (a RuntimeError).
    """


class StaticCacheFullError(CacheFullError, ValueError):
    """A cache of ``max_seq_len`` positions cannot take the positions of an update or a decode."""


class Cache(abc.ABC):
    """What a decode needs of a K/V cache, written down once, as transformers' ``cache_utils.Cache``.

    A subclass implements :meth:`update`, :meth:`get_seq_length` and :meth:`crop`, and
    sets what differs from a cache of every position: ``k_cache``/``v_cache`` (a decode
    checks their leading axes, widths and dtype: :attr:`layout`), ``max_seq_len`` (None:
    unbounded; :meth:`check_room`), ``window``/``n_sink`` (a cache that keeps only a
    window), :meth:`key_positions`.
    """

    k_cache = v_cache = None
    max_seq_len = None
    window = None
    n_sink = 0

    @abc.abstractmethod
    def update(self, k, v):
        """Store ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return ``(k, v)`` to attend to, these included."""

    @abc.abstractmethod
    def get_seq_length(self):
        """Number of positions stored (int)."""

    @abc.abstractmethod
    def crop(self, length):
        """Keep only the first ``length`` positions."""

    def key_positions(self, t_new):
        """The positions of the keys :meth:`update` returns for ``t_new`` new positions (int64 ``[S]``)."""
        return np.arange(self.get_seq_length() + as_size("t_new", t_new))

    @property
    def layout(self):
        """``(batch_shape, k_dim, v_dim, storage dtype)`` that an update must fit; None for what is not fixed yet."""
        k, v = self.k_cache, self.v_cache
        return (None,) * 4 if k is None else (k.shape[:-2], k.shape[-1], v.shape[-1], k.dtype)

    def check_room(self, t_new):
        """Raise :class:`StaticCacheFullError` unless ``t_new`` more positions fit ``max_seq_len``."""
        stored, room = self.get_seq_length(), self.max_seq_len
        if room is not None and stored + t_new > room:
            raise StaticCacheFullError(f"cache is too short: {stored} of max_seq_len={room} positions used, "
                                       f"the call writes {t_new} more")


def as_cache(cache):
    """``cache`` itself; TypeError unless it is a :class:`Cache` instance."""
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be a kv_attention.Cache instance (e.g. DynamicCache()), got {cache!r:.100}")
    return cache


def as_batch_shape(batch_shape):
    """``batch_shape`` as a tuple of ints >= 0; TypeError unless it is a tuple or list."""
    if not isinstance(batch_shape, (tuple, list)):
        raise TypeError(f"batch_shape must be a tuple of ints such as () or (B,), got {batch_shape!r}")
    return tuple(as_size(f"batch_shape[{i}]", n) for i, n in enumerate(batch_shape))


def check_new_positions(k, v, cache, check_finite=True, dtype=None):
    """``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` as float arrays, or raise unless they fit ``cache``.

    Into bfloat16/float16 storage (the cache's, or ``dtype`` while it has no buffers)
    they are returned rounded to it, and refused if that overflows.
    """
    if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
        raise TypeError(f"k and v must be numpy arrays, got {type(k).__name__}, {type(v).__name__}")
    k_dtype, v_dtype = k.dtype.newbyteorder("="), v.dtype.newbyteorder("=")  # '>f8' counts as float64
    if k_dtype not in SUPPORTED_DTYPES or v_dtype != k_dtype:
        raise TypeError(f"k and v must both be float32 or both float64, got {k.dtype} and {v.dtype}")
    k, v = as_array("k", k), as_array("v", v)
    if k.ndim < 2 or k.ndim != v.ndim or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must be [..., T_new, D_k] and [..., T_new, D_v] with the same leading axes, "
                         f"got k {k.shape}, v {v.shape}")
    k_cache, v_cache = cache.k_cache, cache.v_cache
    if k_cache is not None:
        if (k.shape[:-2], k.shape[-1], v.shape[-1]) != (k_cache.shape[:-2], k_cache.shape[-1], v_cache.shape[-1]):
            raise ValueError(f"k {k.shape} and v {v.shape} do not fit the cache's "
                             f"k_cache {k_cache.shape} and v_cache {v_cache.shape}")
        dtype = k_cache.dtype
    if dtype is not None and not np.can_cast(k.dtype, compute_dtype(dtype), casting="safe"):
        raise TypeError(f"k and v are {k.dtype}, which the cache's {dtype} cannot hold without loss"
                        + (" (it stores float32 rounded)" if is_storage_dtype(dtype) else ""))
    if check_finite:
        check_finite_array("k", k)
        check_finite_array("v", v)
    if dtype is not None:
        k, v = as_stored("k", k, dtype), as_stored("v", v, dtype)
    return k, v


def check_crop(length, stored):
    """``length`` as an int, or raise unless it is an integer in [0, stored]."""
    length = as_size("crop length", length)
    if length > stored:
        raise ValueError(f"crop length must be in [0, {stored}], got {length}")
    return length


def check_cache_fits(cache, kv_shape, t_new, dtype, window=None, n_sink=0):
    """Raise unless a given cache fits: ``kv_shape = (k_shape, v_shape)`` without the T axis, ``dtype``,
    room for ``t_new`` more positions, and (a cache that keeps a window) the call's ``window`` and ``n_sink``."""
    cache = as_cache(cache)
    if cache.window is not None and (cache.window, cache.n_sink) != (window, n_sink):
        hint = "; full attention needs a cache of every position, e.g. StaticCache" if window is None else ""
        raise ValueError(f"cache keeps window={cache.window}, n_sink={cache.n_sink} but the call has "
                         f"window={window}, n_sink={n_sink}{hint}")
    k_cache, v_cache = cache.k_cache, cache.v_cache
    if k_cache is not None:
        if (k_cache.shape[:-2] + k_cache.shape[-1:], v_cache.shape[:-2] + v_cache.shape[-1:]) != kv_shape:
            k_shape, v_shape = (", ".join(map(str, (*s[:-1], "T", s[-1]))) for s in kv_shape)
            raise ValueError(f"cache does not fit x: k_cache {k_cache.shape} and v_cache {v_cache.shape} "
                             f"must be [{k_shape}] and [{v_shape}]")
        if compute_dtype(k_cache.dtype) != dtype:
            raise TypeError(f"cache holds {k_cache.dtype} but the computation is {dtype}")
    stored, room = cache.get_seq_length(), cache.max_seq_len
    if room is not None and stored + t_new > room:
        raise StaticCacheFullError(f"cache too short: {stored} of max_seq_len={room} positions used, "
                                   f"x needs T={t_new} more")
    return cache


class DynamicCache(Cache):
    """A K/V cache that grows by ``np.concatenate``: each update copies every position so far, O(T²) for T steps.

    The leading axes are fixed by the first update; ``k_cache``/``v_cache`` are None before it.
    ``dtype``: None (default) stores k, v as given (Hugging Face's cache, in the model's
    dtype), fixed by the first update; bfloat16 or float16 stores float32 k, v rounded;
    float32 or float64 stores that dtype.
    """

    def __init__(self, dtype=None):
        self.k_cache = self.v_cache = None
        self._dtype = None if dtype is None else as_float_dtype(dtype, storage=True)

    def __repr__(self):
        if self.k_cache is None:
            return "DynamicCache(seq_length=0)"
        return (f"DynamicCache(k_cache={list(self.k_cache.shape)}, v_cache={list(self.v_cache.shape)}, "
                f"dtype={self.k_cache.dtype}, seq_length={self.get_seq_length()})")

    def update(self, k, v, *, check_finite=True):
        """Append ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return the cache's own arrays (do not write)."""
        return self._append(*check_new_positions(k, v, self, check_finite, self._dtype))

    def _append(self, k, v):
        """:meth:`update` of checked k, v (a decode's own cache: its k, v come from checked inputs)."""
        if self.k_cache is None:
            dtype = k.dtype if self._dtype is None else self._dtype
            self.k_cache, self.v_cache = k.astype(dtype), v.astype(dtype)  # copies
        else:
            self.k_cache = np.concatenate([self.k_cache, k], axis=-2)  # [..., T + T_new, D_k]
            self.v_cache = np.concatenate([self.v_cache, v], axis=-2)  # [..., T + T_new, D_v]
        return self.k_cache, self.v_cache

    @property
    def layout(self):
        return super().layout if self.k_cache is not None else (None, None, None, self._dtype)

    def get_seq_length(self):
        return 0 if self.k_cache is None else self.k_cache.shape[-2]

    def crop(self, length):
        """Keep the first ``length`` positions; ``crop(0)`` empties the cache as new."""
        length = check_crop(length, self.get_seq_length())
        if length == 0:
            self.k_cache = self.v_cache = None
        elif self.k_cache is not None:
            self.k_cache = self.k_cache[..., :length, :].copy()
            self.v_cache = self.v_cache[..., :length, :].copy()

    @property
    def nbytes(self):
        """Bytes of the stored keys and values (int)."""
        return 0 if self.k_cache is None else self.k_cache.nbytes + self.v_cache.nbytes


class StaticCache(Cache):
    """A K/V cache allocated once, ``[*batch_shape, max_seq_len, D]``, written in place; zero past the length.

    ``batch_shape``: the leading axes, e.g. ``()``, ``(B,)`` or ``(B, H_kv)``; ``k_dim`` (D_k)
    >= 1, every other size >= 0; ``dtype`` float32, float64 (default), or bfloat16/float16
    storage (see the module's docstring).
    """

    def __init__(self, batch_shape, max_seq_len, k_dim, v_dim, dtype=np.float64):
        batch_shape = as_batch_shape(batch_shape)
        max_seq_len, v_dim = as_size("max_seq_len", max_seq_len), as_size("v_dim", v_dim)
        k_dim, dtype = as_size("k_dim", k_dim, minimum=1), as_float_dtype(dtype, storage=True)
        self.k_cache = np.zeros(batch_shape + (max_seq_len, k_dim), dtype)  # [*batch_shape, T_max, D_k]
        self.v_cache = np.zeros(batch_shape + (max_seq_len, v_dim), dtype)  # [*batch_shape, T_max, D_v]
        self._length = 0

    def __repr__(self):
        *batch_shape, max_seq_len, k_dim = self.k_cache.shape
        return (f"StaticCache(batch_shape={tuple(batch_shape)}, max_seq_len={max_seq_len}, k_dim={k_dim}, "
                f"v_dim={self.v_cache.shape[-1]}, dtype={self.k_cache.dtype}, seq_length={self._length})")

    @property
    def max_seq_len(self):
        return self.k_cache.shape[-2]

    def update(self, k, v, *, check_finite=True):
        """Write ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` after the stored positions.

        Returns views ``[..., T, D]`` of the buffers (do not write to them);
        :class:`StaticCacheFullError` past ``max_seq_len``.
        """
        k, v = check_new_positions(k, v, self, check_finite)
        if self._length + k.shape[-2] > self.max_seq_len:
            raise StaticCacheFullError(f"cache is full: {self._length} of max_seq_len={self.max_seq_len} positions "
                                       f"used, cannot write {k.shape[-2]} more")
        return self._append(k, v)

    def _append(self, k, v):
        """:meth:`update` of checked k, v that fit (a decode's own cache)."""
        start, stop = self._length, self._length + k.shape[-2]
        self.k_cache[..., start:stop, :] = k
        self.v_cache[..., start:stop, :] = v
        self._length = stop
        return self.k_cache[..., :stop, :], self.v_cache[..., :stop, :]

    def get_seq_length(self):
        return self._length

    def crop(self, length):
        """Keep the first ``length`` positions; the rest are zeroed."""
        length = check_crop(length, self._length)
        self.k_cache[..., length:, :] = 0
        self.v_cache[..., length:, :] = 0
        self._length = length

    @property
    def nbytes(self):
        """Bytes of the stored keys and values (int), not the capacity."""
        return (self.k_cache.nbytes + self.v_cache.nbytes) // max(self.max_seq_len, 1) * self._length
