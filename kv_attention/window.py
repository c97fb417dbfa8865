"""The sliding-window K/V cache: ``n_sink`` fixed slots beside a ring buffer of ``window`` slots.

A model attending with a window of W (:func:`~kv_attention.attention.band_mask`) never reads a key more than W - 1
back, apart from its ``n_sink`` sinks (StreamingLLM), so position p >= n_sink lives in ring slot
``n_sink + (p - n_sink) % W``. As HF's sliding-window layers (``cache_utils``) and Mistral's rotating buffer, a chunk
is attended to before it overwrites the ring; what differs: the sinks, and one new position is written first and
attended on the buffers' views in slot order. Dtypes and errors as cache.py's; ``crop`` also refuses what the ring
no longer holds.
"""

import numpy as np

from ._validation import as_float_dtype, as_size
from .cache import Cache, as_batch_shape, check_crop, check_new_positions


class SlidingWindowCache(Cache):
    """``k_cache: [*batch_shape, n_sink + window, k_dim]``, ``v_cache`` likewise, in slot order, allocated once.
    ``get_seq_length()`` counts every position seen, ``nbytes`` those held; ``can_crop`` False (a wrapped ring)."""

    preallocated, can_crop = True, False

    def __init__(self, batch_shape, window, k_dim, v_dim, n_sink=0, dtype=None):
        batch_shape = as_batch_shape(batch_shape)
        window, n_sink = as_size("window", window, minimum=1), as_size("n_sink", n_sink)
        k_dim, v_dim = as_size("k_dim", k_dim, minimum=1), as_size("v_dim", v_dim)  # the library's rule for widths
        self.window, self.n_sink = window, n_sink
        slots = n_sink + window
        self._shapes = batch_shape + (slots, k_dim), batch_shape + (slots, v_dim)  # [*batch_shape, n_sink + W, D]
        if dtype is not None:  # bfloat16/float16: as cache.py's caches; None: the first update's
            self._allocate(as_float_dtype(dtype, storage=True))
        self._length = 0  # positions seen
        self._first = n_sink  # the oldest window position held; the ring holds _first.._length-1

    def __repr__(self):
        batch_shape, k_dim, v_dim, dtype = self.layout
        return (f"SlidingWindowCache(batch_shape={batch_shape}, window={self.window}, k_dim={k_dim}, v_dim={v_dim}, "
                f"n_sink={self.n_sink}, dtype={dtype}, seq_length={self._length})")

    def _ring(self, first, count):
        """The slots of ring positions ``first..first+count-1``, in position order: one slice, or two that wrap."""
        begin = self.n_sink + (first - self.n_sink) % self.window
        head = min(count, self.n_sink + self.window - begin)  # up to the end of the buffer
        if head == count:
            return (slice(begin, begin + count),)
        return slice(begin, begin + head), slice(self.n_sink, self.n_sink + count - head)

    def _held(self):
        """The slots of every position held, in position order: the sinks seen, then the ring from its oldest."""
        ring = self._ring(self._first, max(self._length - self._first, 0))
        return ring if self.n_sink == 0 else (slice(0, min(self.n_sink, self._length)), *ring)

    def held_positions(self):
        """The positions held, ascending (int64 ``[S]``): the sinks seen, then the window positions still in the ring."""
        sinks = np.arange(min(self.n_sink, self._length))
        return np.concatenate([sinks, np.arange(self._first, self._length)])

    def key_positions(self, t_new):
        """The positions of the keys :meth:`update` returns for ``t_new`` new positions, in its order (int64 ``[S]``)."""
        t_new = as_size("t_new", t_new)
        if t_new != 1:  # the held positions, ascending, then the new ones
            return np.concatenate([self.held_positions(), np.arange(self._length, self._length + t_new)])
        newest = self._length  # a decode step: the buffers' filled slots, in slot order
        slots = np.arange(min(newest + 1, self.n_sink + self.window))
        newest_slot = self.n_sink + (newest - self.n_sink) % self.window
        return np.where(slots < self.n_sink, slots, newest - (newest_slot - slots) % self.window)

    def update(self, k, v, layer_idx=0, *, check_finite=True):
        """Add ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]``; return every key and value they may attend to:
        T_new != 1, new arrays of the positions held then the new ones (written after); T_new = 1, written first
        (over position p - W, never attended to), the buffers' filled slots as views (do not write)."""
        if layer_idx:
            return self.layer(layer_idx).update(k, v, check_finite=check_finite)
        k, v = check_new_positions(k, v, self, check_finite)
        if self.k_cache is None:
            self._allocate(k.dtype)
        start, stop = self._length, self._length + k.shape[-2]
        if stop - start == 1:
            self._write(k, v, start, stop)
            filled = min(stop, self.n_sink + self.window)
            return self.k_cache[..., :filled, :], self.v_cache[..., :filled, :]
        held = self._held()
        k_seen = np.concatenate([*(self.k_cache[..., s, :] for s in held), k], axis=-2)  # [..., S + T_new, D_k]
        v_seen = np.concatenate([*(self.v_cache[..., s, :] for s in held), v], axis=-2)  # [..., S + T_new, D_v]
        self._write(k, v, start, stop)
        return k_seen, v_seen

    def _write(self, k, v, start, stop):
        """Write new positions ``start..stop-1``: sinks into their own slots, the last ``window`` others into the ring."""
        if start < self.n_sink:
            n = min(stop, self.n_sink) - start
            self.k_cache[..., start : start + n, :] = k[..., :n, :]
            self.v_cache[..., start : start + n, :] = v[..., :n, :]
        first = max(start, self.n_sink, stop - self.window)  # the oldest new position the ring keeps
        if first < stop:
            offset = first - start
            for slots in self._ring(first, stop - first):
                n = slots.stop - slots.start
                self.k_cache[..., slots, :] = k[..., offset : offset + n, :]
                self.v_cache[..., slots, :] = v[..., offset : offset + n, :]
                offset += n
        self._length, self._first = stop, max(self._first, stop - self.window)

    def get_seq_length(self, layer_idx=0):
        """Number of positions seen (int), held or not."""
        return self.layer(layer_idx).get_seq_length() if layer_idx else self._length

    def crop(self, length):
        """Keep the first ``length`` positions, if the ring still holds every key position ``length`` attends to
        (once wrapped, one position back: a rejected draft token); else ValueError."""
        length = check_crop(length, self._length)
        self._check_crop(length)
        for c in self._more:
            c.crop(length)
        if self.k_cache is None:  # nothing stored: length 0
            return
        first = max(length, self._first)  # the dropped window positions: first.._length-1
        for slots in self._ring(first, max(self._length - first, 0)):
            self.k_cache[..., slots, :] = 0
            self.v_cache[..., slots, :] = 0
        self.k_cache[..., length : self.n_sink, :] = 0  # dropped sinks, if any
        self.v_cache[..., length : self.n_sink, :] = 0
        self._length = length
        self._first = max(min(self._first, length), self.n_sink)  # with length <= n_sink the ring holds nothing

    def _check_crop(self, length):
        """Raise unless the ring cut to ``length`` still holds positions ``length - window + 1 .. length - 1``."""
        lowest = max(self.n_sink, length - self.window + 1)  # the oldest window position `length` attends to
        if lowest < min(length, self._first):
            raise ValueError(f"cannot crop the sliding-window cache (window={self.window}, n_sink={self.n_sink}) from "
                             f"{self._length} to {length} positions: position {length} attends to positions from "
                             f"{length - self.window + 1}, but the ring has overwritten every position before {self._first}; "
                             f"crop to a length in [{self._first + self.window - 1}, {self._length}] or in [0, {self.n_sink}]")

    def _snapshot(self, t_new):  # the slots t_new more positions write (at most n_sink + window), as they are
        if self.k_cache is None:
            return None
        p = np.arange(self._length, self._length + min(t_new, self.n_sink + self.window))
        slots = np.where(p < self.n_sink, p, self.n_sink + (p - self.n_sink) % self.window)
        return self._length, self._first, slots, self.k_cache[..., slots, :], self.v_cache[..., slots, :]  # copies

    def _restore(self, state):
        if state is None:  # back to no buffers
            self.k_cache = self.v_cache = None
            self._length, self._first = 0, self.n_sink
            return
        self._length, self._first, slots, self.k_cache[..., slots, :], self.v_cache[..., slots, :] = state

    def _nbytes(self):  # the positions held
        if self.k_cache is None:
            return 0
        per_position = (self.k_cache.nbytes + self.v_cache.nbytes) // self.k_cache.shape[-2]
        held = min(self.n_sink, self._length) + max(self._length - self._first, 0)
        return per_position * held
