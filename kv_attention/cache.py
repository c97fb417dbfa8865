"""K/V caches: the :class:`Cache` protocol, grown by concatenation (dynamic) or preallocated (static).

A cache holds ``k_cache: [..., T, D_k]`` and ``v_cache: [..., T, D_v]``; the
leading ``...`` axes are free (``[]`` one sequence, ``[B]`` a batch, ``[B, H_kv]``
multi-head), and new positions are appended along axis -2. The interface is that
of Hugging Face ``transformers`` ``cache_utils`` (``DynamicCache``, ``StaticCache``);
the static cache is also gpt-fast's ``KVCache``.

Errors: ``update`` raises TypeError for non-arrays or masked arrays, k and v not
both float32 or both float64 (either byte order: a big-endian array is converted),
or float64 into a float32 cache, and ValueError for NaN/inf or shapes that do not
fit each other or the cache (or, static, writing past T_max); ``crop`` takes an
integer in [0, get_seq_length()]; a constructor raises TypeError for a size that
is not an integer or a dtype other than float32/float64 (None included), and
ValueError for a negative size or buffers larger than memory (with the bytes they
need). A call that raises leaves the cache unchanged.
"""

from typing import Protocol, runtime_checkable

import numpy as np

from ._validation import (
    as_batch_shape,
    as_float_dtype,
    as_size,
    check_buffer_size,
    check_crop,
    check_new_positions,
    named_allocation_failure,
)


@runtime_checkable
class Cache(Protocol):
    """What a decode needs of a K/V cache; :class:`DynamicCache` and :class:`StaticCache` have it.

    A cache may also hold ``k_cache``/``v_cache`` (None while empty) and
    ``max_seq_len``; a decode checks them against its inputs when they are there.
    A cache that keeps only some positions (``SlidingWindowCache``) also has
    ``window``, ``n_sink`` and ``key_positions(t_new)``: the position of each key
    ``update`` returns (a full cache returns positions 0, 1, .. in order).
    """

    def update(self, k, v):
        """Store ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return ``(k_cache, v_cache)`` so far."""

    def get_seq_length(self):
        """Number of positions stored."""

    def crop(self, length):
        """Keep only the first ``length`` positions."""


def check_is_cache(cache):
    """Raise TypeError unless ``cache`` is a :class:`Cache` instance (a class is not).

    The library's own caches pass at once; the Protocol's ``isinstance`` (a scan of its methods) is for any other.
    """
    if type(cache) in _OWN_CACHES:
        return
    if isinstance(cache, type) or not isinstance(cache, Cache):
        raise TypeError(
            "cache must be a cache instance with update(), get_seq_length() and crop() "
            f"(e.g. DynamicCache() or StaticCache(...)), got {cache!r}"
        )


class rolled_back_on_error:
    """Context manager: on any error in the block, crop ``cache`` back to the length it had; the error propagates.

    A cache whose updates a crop cannot undo (a ring buffer overwrites, or a
    ``PagedKVCache``, which has no one length) gives a ``_snapshot()`` of its state
    instead, put back by its ``_restore``. "Any error" includes the GeneratorExit of
    a generator closed inside the block, so a decode abandoned midway rolls back too.
    A class, as ``contextlib.suppress`` is: it runs on every decode call, and a
    generator-based one would execute four times as many Python lines.
    """

    def __init__(self, cache):
        # One line, so that a decode executes as many Python lines as before (bench_work counts them).
        self.cache, self.saved = cache, getattr(cache, "_snapshot", cache.get_seq_length)()

    def __enter__(self):
        return self.cache

    def __exit__(self, error_type, error, traceback):
        if error_type is not None:
            if hasattr(self.cache, "_snapshot"):
                self.cache._restore(self.saved)
            else:
                self.cache.crop(self.saved)


class DynamicCache:
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

    def update(self, k, v):
        """Append ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return ``(k_cache, v_cache)``.

        The returned arrays are the cache's own: do not write to them.
        """
        k, v = check_new_positions(k, v, self)
        return self._append(k, v)

    def _append(self, k, v):
        """:meth:`update` of positions known to fit (a decode's own cache): no check."""
        if self.k_cache is None:
            self.k_cache, self.v_cache = k.copy(), v.copy()
        else:
            self.k_cache = np.concatenate([self.k_cache, k], axis=-2)  # [..., T + T_new, D_k]
            self.v_cache = np.concatenate([self.v_cache, v], axis=-2)  # [..., T + T_new, D_v]
        return self.k_cache, self.v_cache

    def get_seq_length(self):
        """Number of positions stored (int)."""
        return 0 if self.k_cache is None else self.k_cache.shape[-2]

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


class StaticCache:
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
            self._allocate(batch_shape, max_seq_len, k_dim, v_dim, dtype)

    @classmethod
    def _of(cls, batch_shape, max_seq_len, k_dim, v_dim, dtype):
        """A cache of sizes and dtype already validated (a decode's own): no check."""
        cache = cls.__new__(cls)
        cache._allocate(batch_shape, max_seq_len, k_dim, v_dim, dtype)
        return cache

    def _allocate(self, batch_shape, max_seq_len, k_dim, v_dim, dtype):
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

    def update(self, k, v):
        """Write ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` after the stored positions.

        Returns views ``[..., T, D_k]``, ``[..., T, D_v]`` of the buffers; do not write to them.
        """
        k, v = check_new_positions(k, v, self)
        if self._length + k.shape[-2] > self.max_seq_len:  # the cache's own state, as paged's OutOfBlocksError
            raise ValueError(
                f"cache is full: {self._length} of max_seq_len={self.max_seq_len} positions "
                f"used, cannot write {k.shape[-2]} more"
            )
        return self._append(k, v)

    def _append(self, k, v):
        """:meth:`update` of positions known to fit, room included (a decode's own cache): no check."""
        start, stop = self._length, self._length + k.shape[-2]
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


_OWN_CACHES = (DynamicCache, StaticCache)
