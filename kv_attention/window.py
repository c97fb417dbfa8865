"""The sliding-window K/V cache: ``n_sink`` fixed positions beside a ring buffer of ``window`` positions.

A model that attends with a window of W (the mask of
:func:`~kv_attention.attention.band_mask`) never reads a key more than W - 1
positions back, apart from its ``n_sink`` attention sinks (StreamingLLM, Xiao
et al. 2023). So its cache needs ``n_sink + W`` slots whatever the length: the
sinks keep slots ``0..n_sink-1`` for good, and position p >= n_sink lives in
ring slot ``n_sink + (p - n_sink) % W``, overwriting position p - W. This is
Hugging Face ``cache_utils``' sliding-window layer (``DynamicSlidingWindowLayer``
keeps W - 1 positions, ``StaticSlidingWindowLayer`` W slots) and Mistral's
rotating buffer, plus the sinks; the cache interface is that of ``cache.py``.

The ring overwrites, so a chunk of new positions must be attended to before it
replaces the keys its own first queries need (a chunk longer than W overwrites
all of them): :meth:`SlidingWindowCache.update` returns the positions held
*before* the chunk, followed by the whole chunk, and only then writes the chunk's
last W positions into the ring. The caller masks them by position
(:meth:`~SlidingWindowCache.held_positions` + the new ones), as Hugging Face's
layer returns ``cat(kept, new)`` and masks them.

Errors: as ``cache.py``'s caches (``update``: TypeError, ValueError for shapes
that do not fit); the constructor also needs an integer ``window >= 1`` and
``n_sink >= 0``; ``crop`` refuses what the ring can no longer serve (see
:meth:`~SlidingWindowCache.crop`). A call that raises leaves the cache unchanged.
"""

import numpy as np

from ._validation import (
    as_batch_shape,
    as_float_dtype,
    as_size,
    check_crop,
    check_new_positions,
    check_window_crop,
)


class SlidingWindowCache:
    """A K/V cache of ``n_sink`` sink slots and a ring of ``window`` slots, allocated once.

    ``batch_shape`` is the leading axes, e.g. ``()``, ``(B,)`` or ``(B, H_kv)``;
    the buffers are ``k_cache: [*batch_shape, n_sink + window, k_dim]`` and
    ``v_cache: [*batch_shape, n_sink + window, v_dim]``, in slot order (not
    position order), zero in every slot that holds no position. ``dtype``:
    float32 or float64 (default float64). ``get_seq_length()`` counts every
    position seen, ``nbytes`` only those held: at most ``n_sink + window``.
    """

    def __init__(self, batch_shape, window, k_dim, v_dim, n_sink=0, dtype=np.float64):
        batch_shape = as_batch_shape(batch_shape)
        window, n_sink = as_size("window", window, minimum=1), as_size("n_sink", n_sink)
        k_dim, v_dim = as_size("k_dim", k_dim), as_size("v_dim", v_dim)
        dtype = as_float_dtype(dtype)
        self.window, self.n_sink = window, n_sink
        self.k_cache = np.zeros(batch_shape + (n_sink + window, k_dim), dtype)
        self.v_cache = np.zeros(batch_shape + (n_sink + window, v_dim), dtype)
        self._length = 0  # positions seen
        self._first = n_sink  # the oldest window position held; the ring holds _first.._length-1

    def _ring(self, first, count):
        """The slots of ring positions ``first..first+count-1`` (first >= n_sink, count <= W): two slices, in position order."""
        begin = self.n_sink + (first - self.n_sink) % self.window
        head = min(count, self.n_sink + self.window - begin)  # up to the end of the buffer, then from the ring's start
        return slice(begin, begin + head), slice(self.n_sink, self.n_sink + count - head)

    def _held(self):
        """The slots of every position held, in position order: the sinks seen, then the ring from its oldest."""
        sinks = slice(0, min(self.n_sink, self._length))
        return (sinks, *self._ring(self._first, max(self._length - self._first, 0)))

    def held_positions(self):
        """The positions held, ascending (int64 ``[S]``): the sinks seen, then the window positions still in the ring."""
        sinks = np.arange(min(self.n_sink, self._length))
        return np.concatenate([sinks, np.arange(self._first, self._length)])

    def update(self, k, v):
        """Add ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return every key and value they may attend to.

        Returns new arrays ``[..., S + T_new, D_k]``, ``[..., S + T_new, D_v]``: the
        S positions held before the update (:meth:`held_positions`, read before
        calling), then all T_new new ones, in position order. Only then are the
        new positions written: those below ``n_sink`` into their sink slots, the
        last ``window`` of the others into the ring.
        """
        check_new_positions(k, v, self)
        start, stop = self._length, self._length + k.shape[-2]
        held = self._held()
        k_seen = np.concatenate([self.k_cache[..., s, :] for s in held] + [k], axis=-2)  # [..., S + T_new, D_k]
        v_seen = np.concatenate([self.v_cache[..., s, :] for s in held] + [v], axis=-2)  # [..., S + T_new, D_v]
        sinks = max(min(stop, self.n_sink) - start, 0)  # new positions that are sinks
        self.k_cache[..., start : start + sinks, :] = k[..., :sinks, :]
        self.v_cache[..., start : start + sinks, :] = v[..., :sinks, :]
        first = max(start, self.n_sink, stop - self.window)  # the oldest new position the ring keeps
        offset = first - start
        for slots in self._ring(first, max(stop - first, 0)):
            n = slots.stop - slots.start
            self.k_cache[..., slots, :] = k[..., offset : offset + n, :]
            self.v_cache[..., slots, :] = v[..., offset : offset + n, :]
            offset += n
        self._length, self._first = stop, max(self._first, stop - self.window)
        return k_seen, v_seen

    def get_seq_length(self):
        """Number of positions seen (int), held or not."""
        return self._length

    def crop(self, length):
        """Keep only the first ``length`` positions, as if the later ones had never been added.

        Only a crop after which the cache still holds every key position
        ``length`` attends to: ``length <= n_sink`` (``crop(0)`` empties it), or
        ``length - window + 1`` at or after the oldest position the ring holds.
        With W slots for the W - 1 keys before a query, that is one position
        back once the ring has wrapped (one rejected draft token); anything
        further raises ValueError, as does a length outside [0, get_seq_length()].
        """
        length = check_crop(length, self._length)
        check_window_crop(length, self._length, self._first, self.window, self.n_sink)
        first = max(length, self._first)  # the dropped window positions: first.._length-1
        for slots in self._ring(first, max(self._length - first, 0)):
            self.k_cache[..., slots, :] = 0
            self.v_cache[..., slots, :] = 0
        self.k_cache[..., length : self.n_sink, :] = 0  # dropped sinks, if any
        self.v_cache[..., length : self.n_sink, :] = 0
        self._length = length
        self._first = max(min(self._first, length), self.n_sink)  # with length <= n_sink the ring holds nothing

    def _snapshot(self):
        """A copy of the whole state, for ``rolled_back_on_error``: a crop cannot undo overwritten slots."""
        return self.k_cache.copy(), self.v_cache.copy(), self._length, self._first

    def _restore(self, snapshot):
        """Put back a :meth:`_snapshot` of this cache, into the same buffers."""
        k_cache, v_cache, self._length, self._first = snapshot
        self.k_cache[...] = k_cache
        self.v_cache[...] = v_cache

    @property
    def nbytes(self):
        """Logical size of the keys and values held, in bytes (int): at most the buffers' ``n_sink + window`` positions."""
        per_position = (self.k_cache.nbytes + self.v_cache.nbytes) // self.k_cache.shape[-2]
        held = min(self.n_sink, self._length) + max(self._length - self._first, 0)
        return per_position * held
