"""K/V caches: the :class:`Cache` base class, grown by concatenation (dynamic) or preallocated (static).

A cache holds ``k_cache: [..., T, D_k]`` and ``v_cache: [..., T, D_v]``; the
leading ``...`` axes are free (``[]`` one sequence, ``[B]`` a batch, ``[B, H_kv]``
multi-head), and new positions are appended along axis -2. The interface is that
of Hugging Face ``transformers`` ``cache_utils`` (its ``Cache`` base class,
``DynamicCache``, ``StaticCache``); the static cache is also gpt-fast's ``KVCache``.

Errors: ``update`` raises TypeError for non-arrays or masked arrays, k and v not
both float32 or both float64 (either byte order: a big-endian array is converted),
or float64 into a float32 cache, and ValueError for NaN/inf (unless
``check_finite=False``) or shapes that do not fit each other or the cache; a
static cache with no room for them raises :class:`StaticCacheFullError`, a
ValueError and a :class:`CacheFullError`. ``crop`` takes an integer in [0,
get_seq_length()]; a constructor raises TypeError for a size that is not an
integer or a dtype other than float32/float64 (None included), and ValueError for
a negative size or buffers larger than memory (with the bytes they need). A call
that raises leaves the cache unchanged.
"""

import abc
import math

import numpy as np

from ._validation import (
    SUPPORTED_DTYPES,
    NonFiniteError,
    _as_array,
    as_float_dtype,
    as_size,
)
from ._memory import check_memory, named_allocation_failure


class CacheFullError(Exception):
    """A cache has no room for the positions a call brings; the cache was left unchanged.

    The common base of :class:`StaticCacheFullError` (also a ValueError, as a full
    StaticCache always raised) and :class:`~kv_attention.paged.OutOfBlocksError`
    (also a RuntimeError, as a full pool always raised): ``except CacheFullError``
    catches either.
    """


class StaticCacheFullError(CacheFullError, ValueError):
    """A cache of ``max_seq_len`` positions cannot take the positions of an update or a decode."""


class Cache(abc.ABC):
    """What a decode needs of a K/V cache, written down once, as transformers' ``cache_utils.Cache``.

    A subclass implements :meth:`update`, :meth:`get_seq_length` and :meth:`crop`.
    The rest has the defaults of a cache of every position, which a subclass
    overrides where it differs; a decode reads these and nothing else:

    - ``k_cache``, ``v_cache``: the buffers ``[..., T, D_k]``, ``[..., T, D_v]``
      (None while empty, or for a cache that does not expose them); a decode checks
      a given cache's leading axes, widths and dtype against them.
    - ``max_seq_len``: the capacity in positions, None when unbounded.
    - ``window``, ``n_sink``: a cache that keeps only the last ``window`` positions
      and ``n_sink`` sinks (``SlidingWindowCache``); None and 0 for a full cache.
    - :meth:`key_positions`: the position of each key ``update`` returns.
    - :meth:`snapshot` / :meth:`restore`: what :class:`rolled_back_on_error` puts back
      after a failed decode; by default the length, restored by :meth:`crop`.

    The paged cache is not one: it holds many sequences, and its ``update`` takes their ids.
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
        """The positions of the keys :meth:`update` returns for ``t_new`` new positions (int64 ``[S]``).

        A full cache returns every position in order: ``0 .. get_seq_length() + t_new - 1``.
        """
        return np.arange(self.get_seq_length() + as_size("t_new", t_new))

    def snapshot(self):
        """What :meth:`restore` needs to undo later updates: by default the length."""
        return self.get_seq_length()

    def restore(self, snapshot):
        """Put back a :meth:`snapshot` of this cache: by default ``crop`` to its length."""
        self.crop(snapshot)


class _UserCache(Cache):
    """A user's cache that has update(), get_seq_length() and crop() but does not subclass :class:`Cache`.

    Used through those three methods only, as a cache of every position: no other
    attribute of it is read, so one named ``window`` changes nothing.
    """

    def __init__(self, cache):
        self.cache = cache

    def update(self, k, v):
        """The user's ``update``, held to a full cache's contract: it returns every position, as ``k`` and ``v`` are.

        TypeError or ValueError naming what it returned otherwise (fewer positions, as a cache
        keeping a window would, another dtype, layout or width), so a decode never attends to
        what it did not mean to.
        """
        length = self.cache.get_seq_length() + k.shape[-2]  # a full cache holds what it held and the new positions
        returned = self.cache.update(k, v)
        if not (isinstance(returned, tuple) and len(returned) == 2
                and all(type(a) is np.ndarray for a in returned)):
            raise TypeError(f"cache.update must return (k, v), two numpy arrays, got {returned!r:.200}")
        k_all, v_all = returned
        if self.cache.get_seq_length() != length:
            raise ValueError(f"cache.get_seq_length() is {self.cache.get_seq_length()} after an update of "
                             f"{k.shape[-2]} positions, not {length}: a cache given to a decode must hold every position")
        for name, new, held in (("k", k, k_all), ("v", v, v_all)):
            expected = new.shape[:-2] + (length, new.shape[-1])
            if held.dtype != new.dtype:
                raise TypeError(f"cache.update returned {name} of {held.dtype} for {name} of {new.dtype}")
            if held.shape != expected:
                raise ValueError(
                    f"cache.update returned {name} {held.shape}, but a cache given to a decode must return every "
                    f"position it holds, {expected}; a cache that keeps a window must "
                    "subclass kv_attention.Cache and state its window"
                )
        return k_all, v_all

    def get_seq_length(self):
        return self.cache.get_seq_length()

    def crop(self, length):
        self.cache.crop(length)


def as_cache(cache):
    """``cache`` as a :class:`Cache`: itself if it subclasses Cache, a :class:`_UserCache` if it has its three methods.

    TypeError for anything else, a class included.
    """
    if isinstance(cache, Cache):
        return cache
    methods = ("update", "get_seq_length", "crop")
    if isinstance(cache, type) or not all(callable(getattr(cache, name, None)) for name in methods):
        raise TypeError(
            "cache must be a cache instance with update(), get_seq_length() and crop() "
            f"(e.g. DynamicCache() or StaticCache(...)), got {cache!r}"
        )
    return _UserCache(cache)


class rolled_back_on_error:
    """Context manager: on any error in the block, ``cache.restore`` its :meth:`~Cache.snapshot`; the error propagates.

    "Any error" includes the GeneratorExit of a generator closed inside the block,
    so a decode abandoned midway rolls back too. A class, as ``contextlib.suppress``
    is: it runs on every decode call, and a generator-based one would execute four
    times as many Python lines.
    """

    def __init__(self, cache):
        # One line, so that a decode executes as many Python lines as before (bench_work counts them).
        self.cache, self.saved = cache, cache.snapshot()

    def __enter__(self):
        return self.cache

    def __exit__(self, error_type, error, traceback):
        if error_type is not None:
            self.cache.restore(self.saved)


# The checks of a cache's own arguments, and of a cache given to a decode


def as_batch_shape(batch_shape):
    """``batch_shape`` as a tuple of ints >= 0; TypeError unless it is a tuple or list."""
    if not isinstance(batch_shape, (tuple, list)):
        raise TypeError(f"batch_shape must be a tuple of ints such as () or (B,), got {batch_shape!r}")
    if not batch_shape:
        return ()
    return tuple(as_size(f"batch_shape[{i}]", n) for i, n in enumerate(batch_shape))


def check_buffer_size(what, batch_shape, slots, k_dim, v_dim, dtype):
    """``(nbytes, text)``: the bytes of buffers ``[*batch_shape, slots, k_dim]`` and ``[*batch_shape, slots, v_dim]``
    in ``dtype`` (a cache's), and ``what`` (e.g. "a StaticCache") with the sizes; ValueError beyond physical memory."""
    nbytes = math.prod(batch_shape) * slots * (k_dim + v_dim) * dtype.itemsize
    text = _Described(what, batch_shape, slots, k_dim, v_dim, dtype)
    return check_memory(nbytes, text), text


class _Described:
    """The text naming a cache's sizes, formatted only when an error shows it (formatting a dtype takes microseconds)."""

    def __init__(self, what, batch_shape, slots, k_dim, v_dim, dtype):
        self.sizes = what, batch_shape, slots, k_dim, v_dim, dtype

    def __str__(self):
        what, batch_shape, slots, k_dim, v_dim, dtype = self.sizes
        return f"{what} of batch_shape={batch_shape}, {slots} positions, k_dim={k_dim}, v_dim={v_dim} in {dtype}"


def check_new_positions(k, v, cache, check_finite=True):
    """``k: [..., T_new, D_k]`` and ``v: [..., T_new, D_v]`` as native float arrays, or raise
    unless they fit ``cache``.

    As every entry point: TypeError for a masked array, ValueError for NaN/inf
    (not looked for with ``check_finite=False``); a big-endian array is converted,
    and an np.matrix is taken as a plain array. The common case, plain arrays of
    the cache's dtype and layout, is one test; the conversions and messages come after it.
    """
    if not _fits_as_it_is(k, v, cache.k_cache, cache.v_cache):
        return _as_new_positions(k, v, cache, check_finite)
    if check_finite:
        _refuse_non_finite(k, v)
    return k, v


def _fits_as_it_is(k, v, k_cache, v_cache):
    """Whether ``k``, ``v`` are plain arrays of the cache's dtype, axes, leading sizes and widths (one test)."""
    if type(k) is not np.ndarray or type(v) is not np.ndarray or k_cache is None:
        return False
    k_shape, v_shape, c_shape = k.shape, v.shape, k_cache.shape  # each .shape builds a tuple: read once
    layout = k.dtype, len(k_shape), k_shape[:-2]  # dtype, axes and leading sizes: k's, v's and the cache's agree
    same = layout == (v.dtype, len(v_shape), v_shape[:-2]) == (k_cache.dtype, len(c_shape), c_shape[:-2])
    return same and (k_shape[-2], k_shape[-1], v_shape[-1]) == (v_shape[-2], c_shape[-1], v_cache.shape[-1])


def _refuse_non_finite(k, v):
    for name, array in (("k", k), ("v", v)):
        if not np.isfinite(array).all():
            raise NonFiniteError(f"{name} contains NaN or inf")


def _as_new_positions(k, v, cache, check_finite):
    """:func:`check_new_positions` for any other input: convert what can be, or raise naming what does not fit."""
    if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
        raise TypeError(f"k and v must be numpy arrays, got {type(k).__name__}, {type(v).__name__}")
    k_dtype, v_dtype = k.dtype.newbyteorder("="), v.dtype.newbyteorder("=")  # '>f8' counts as float64
    if k_dtype not in SUPPORTED_DTYPES or v_dtype != k_dtype:
        raise TypeError(f"k and v must both be float32 or both float64, got {k.dtype} and {v.dtype}")
    k, v = _as_array("k", k), _as_array("v", v)
    if check_finite:
        _refuse_non_finite(k, v)
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


def check_cache_fits(cache, x, w_k, w_v, dtype, layout=None, window=None, n_sink=0):
    """Raise unless a given :class:`Cache` fits ``x``'s leading axes, the widths, ``dtype`` and T more positions.

    ``layout`` is ``(expected_k, expected_v, text)``: the shapes ``k_cache`` and
    ``v_cache`` must have without their T axis, and the layout to name in the
    error; by default ``x``'s leading axes with D_k and D_v (single head). A
    cache that keeps only a window must keep the call's ``window`` and ``n_sink``
    (:func:`check_cache_window`). Returns the keys already in the cache
    ``[..., S, D_k]`` (a prefill), which enter the overflow bound of q·k, or None.
    """
    check_cache_window(cache, window, n_sink)
    k_cache, v_cache = cache.k_cache, cache.v_cache
    if k_cache is None:
        return None
    if layout is None:
        layout = (x.shape[:-2] + (w_k.shape[1],), x.shape[:-2] + (w_v.shape[1],),
                  f"vs x {x.shape}, D_k={w_k.shape[1]}, D_v={w_v.shape[1]}")
    expected_k, expected_v, text = layout
    if k_cache.shape[:-2] + k_cache.shape[-1:] != expected_k or v_cache.shape[:-2] + v_cache.shape[-1:] != expected_v:
        raise ValueError(f"cache does not fit x: k_cache {k_cache.shape} and v_cache {v_cache.shape} {text}")
    if k_cache.dtype != dtype:
        raise TypeError(f"cache holds {k_cache.dtype} but the computation is {dtype}")
    stored, room = cache.get_seq_length(), cache.max_seq_len
    if room is not None and stored + x.shape[-2] > room:
        raise StaticCacheFullError(
            f"cache too short: {stored} of max_seq_len={room} positions used, x needs T={x.shape[-2]} more"
        )
    return k_cache[..., :stored, :] if stored else None


def check_cache_window(cache, window, n_sink):
    """Raise unless a cache that keeps a window (``cache.window`` not None) keeps the call's ``window`` and ``n_sink``.

    Such a cache has dropped the keys outside its window, so it can serve only a
    call with the same window and sinks; a cache of every position serves any call.
    """
    if cache.window is None:
        return
    if (cache.window, cache.n_sink) != (window, n_sink):
        hint = "; full attention needs a cache of every position, e.g. StaticCache" if window is None else ""
        raise ValueError(
            f"cache keeps window={cache.window}, n_sink={cache.n_sink} but the call has window={window}, "
            f"n_sink={n_sink}{hint}"
        )


def check_head_cache_fits(cache, x, n_kv_heads, head_dim, dtype):
    """:func:`check_cache_fits` for the multi-head layout ``[*x.shape[:-2], H_kv, T_max, D_head]``; its stored keys."""
    expected = x.shape[:-2] + (n_kv_heads, head_dim)  # the cache's shape without its T_max axis
    layout = ", ".join(map(str, x.shape[:-2] + (n_kv_heads, "T_max", head_dim)))
    text = f"must be [{layout}] for x {x.shape}, n_kv_heads={n_kv_heads}, head_dim={head_dim}"
    return check_cache_fits(cache, x, None, None, dtype, layout=(expected, expected, text))


def _are_buffers(k, v):
    """Whether ``k``, ``v`` can be a cache's buffers ``[..., T, D_k]``, ``[..., T, D_v]``: one float dtype, same axes but D."""
    return (type(k) is np.ndarray and type(v) is np.ndarray and k.ndim >= 2 and k.ndim == v.ndim
            and k.dtype in SUPPORTED_DTYPES and v.dtype == k.dtype and k.shape[:-1] == v.shape[:-1])


class DynamicCache(Cache):
    """A K/V cache that grows by ``np.concatenate`` at every update.

    Each update allocates new ``k_cache``/``v_cache`` arrays and copies all
    previous positions into them, so decoding T tokens copies O(T²) values:
    the cost the preallocated :class:`StaticCache` avoids. The dtype and the
    leading axes are fixed by the first update.

    ``k_cache`` and ``v_cache`` are None before the first update.
    """

    def __init__(self):
        self.k_cache = None
        self.v_cache = None

    def __repr__(self):
        if self.k_cache is None:
            return "DynamicCache(seq_length=0)"
        return (f"DynamicCache(k_cache={list(self.k_cache.shape)}, v_cache={list(self.v_cache.shape)}, "
                f"dtype={self.k_cache.dtype}, seq_length={self.get_seq_length()})")

    def update(self, k, v, *, check_finite=True):
        """Append ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return ``(k_cache, v_cache)``.

        The returned arrays are the cache's own: do not write to them.
        ``check_finite=False`` skips the scan for NaN/inf (a decode's own keys, finite by its overflow guard).
        """
        k, v = check_new_positions(k, v, self, check_finite)
        if self.k_cache is None:
            self.k_cache, self.v_cache = k.copy(), v.copy()
        else:
            self.k_cache = np.concatenate([self.k_cache, k], axis=-2)  # [..., T + T_new, D_k]
            self.v_cache = np.concatenate([self.v_cache, v], axis=-2)  # [..., T + T_new, D_v]
        return self.k_cache, self.v_cache

    def get_seq_length(self):
        """Number of positions stored (int)."""
        return 0 if self.k_cache is None else self.k_cache.shape[-2]

    def snapshot(self):
        """The buffers themselves: ``update`` and ``crop`` make new arrays and never write into these."""
        return self.k_cache, self.v_cache

    def restore(self, snapshot):
        """Put back the buffers of a :meth:`snapshot`, their dtype and leading axes too (``crop(0)`` would drop them).

        TypeError for anything but what :meth:`snapshot` returns; the cache is then unchanged.
        """
        if not (isinstance(snapshot, tuple) and len(snapshot) == 2
                and (all(a is None for a in snapshot) or _are_buffers(*snapshot))):
            raise TypeError(
                "restore takes what snapshot() returned: (k_cache, v_cache), both None or arrays [..., T, D] of "
                f"float32 or float64 with the same dtype and the same axes but D, got {snapshot!r:.200}"
            )
        self.k_cache, self.v_cache = snapshot

    def crop(self, length):
        """Keep only the first ``length`` positions (0 <= length <= get_seq_length()).

        ``crop(0)`` empties the cache as new: the next update may set another dtype or leading axes.
        """
        length = check_crop(length, self.get_seq_length())
        if length == 0:
            self.k_cache = self.v_cache = None
        elif self.k_cache is not None:
            self.k_cache = self.k_cache[..., :length, :].copy()
            self.v_cache = self.v_cache[..., :length, :].copy()

    @property
    def nbytes(self):
        """Logical size of the stored keys and values, in bytes (int)."""
        return 0 if self.k_cache is None else self.k_cache.nbytes + self.v_cache.nbytes


class StaticCache(Cache):
    """A K/V cache whose buffers are allocated once and written in place.

    ``batch_shape`` is the leading axes, e.g. ``()``, ``(B,)`` or ``(B, H_kv)``; the
    buffers ``k_cache: [*batch_shape, max_seq_len, k_dim]`` and ``v_cache:
    [*batch_shape, max_seq_len, v_dim]`` are zero past ``get_seq_length()``. ``k_dim`` (D_k)
    >= 1 and every other size >= 0, as throughout the library.
    ``dtype``: float32 or float64 (default float64).
    """

    def __init__(self, batch_shape, max_seq_len, k_dim, v_dim, dtype=np.float64):
        batch_shape = as_batch_shape(batch_shape)
        max_seq_len, v_dim = as_size("max_seq_len", max_seq_len), as_size("v_dim", v_dim)
        k_dim = as_size("k_dim", k_dim, minimum=1)  # D_k >= 1, every other size >= 0: the library's rule
        dtype = as_float_dtype(dtype)
        nbytes, what = check_buffer_size("a StaticCache", batch_shape, max_seq_len, k_dim, v_dim, dtype)
        with named_allocation_failure(nbytes, what):
            self.k_cache = np.zeros(batch_shape + (max_seq_len, k_dim), dtype)  # [*batch_shape, T_max, D_k]
            self.v_cache = np.zeros(batch_shape + (max_seq_len, v_dim), dtype)  # [*batch_shape, T_max, D_v]
        self._length = 0

    def __repr__(self):
        *batch_shape, max_seq_len, k_dim = self.k_cache.shape
        return (f"StaticCache(batch_shape={tuple(batch_shape)}, max_seq_len={max_seq_len}, k_dim={k_dim}, "
                f"v_dim={self.v_cache.shape[-1]}, dtype={self.k_cache.dtype}, seq_length={self._length})")

    @property
    def max_seq_len(self):
        """T_max, the capacity in positions (int)."""
        return self.k_cache.shape[-2]

    def update(self, k, v, *, check_finite=True):
        """Write ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` after the stored positions.

        Returns views ``[..., T, D_k]``, ``[..., T, D_v]`` of the buffers; do not write to them.
        :class:`StaticCacheFullError` (a ValueError) past ``max_seq_len``. ``check_finite=False``
        skips the scan for NaN/inf (a decode's own keys, finite by its overflow guard).
        """
        k, v = check_new_positions(k, v, self, check_finite)
        start, stop = self._length, self._length + k.shape[-2]
        if stop > self.k_cache.shape[-2]:  # max_seq_len: the cache's own state, as paged's OutOfBlocksError
            raise StaticCacheFullError(
                f"cache is full: {self._length} of max_seq_len={self.max_seq_len} positions "
                f"used, cannot write {k.shape[-2]} more"
            )
        self.k_cache[..., start:stop, :] = k
        self.v_cache[..., start:stop, :] = v
        self._length = stop
        return self.k_cache[..., :stop, :], self.v_cache[..., :stop, :]

    def get_seq_length(self):
        """Number of positions stored (int)."""
        return self._length

    def crop(self, length):
        """Keep only the first ``length`` positions (0 <= length <= get_seq_length())."""
        length = check_crop(length, self._length)
        self.k_cache[..., length:, :] = 0
        self.v_cache[..., length:, :] = 0
        self._length = length

    @property
    def nbytes(self):
        """Logical size of the stored keys and values, in bytes (int); not the capacity."""
        per_position = (self.k_cache.nbytes + self.v_cache.nbytes) // max(self.max_seq_len, 1)
        return per_position * self._length

