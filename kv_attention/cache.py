"""K/V caches: the :class:`Cache` base class, grown by concatenation (dynamic) or preallocated (static).

A cache holds ``k_cache: [..., T, D_k]`` and ``v_cache: [..., T, D_v]``; the leading axes are free (``[]``,
``[B]``, ``[B, H_kv]``), new positions are appended along axis -2, and ``update(k, v)`` returns the keys and values
to attend to. The interface is transformers' ``cache_utils`` (``update``, ``get_seq_length``, ``crop``); what
differs (a static cache returns views ``[..., :T, :]``, no mask): docs/mechanisms.md#the-model.

Dtype: a cache built without one takes its first update's (the model's), as HF 5's layers (``cache_utils``:
``DynamicLayer``, ``StaticLayer.lazy_initialization``); a preallocated one allocates its buffers then (``k_cache``
None before). Storage in bfloat16 or float16 (``dtype=ml_dtypes.bfloat16`` or ``np.float16``): ``update`` rounds
float32 k, v to it (as ``astype``) and returns the stored 2-byte arrays, read upcast to float32; the bound this puts
on an output: docs/mechanisms.md#bfloat16-and-float16-storage.

Errors: ``update`` raises TypeError for k, v not float32/float64 of one dtype (or float64 into a float32 or 2-byte
cache), ValueError for NaN/inf (unless ``check_finite=False``), values a 2-byte cache would store as inf, or shapes
that do not fit, StaticCacheFullError past ``max_seq_len``; all before anything is written.
"""

import abc
import contextlib

import numpy as np

from ._validation import (SUPPORTED_DTYPES, as_array, as_float_dtype, as_size, as_stored, check_finite_array,
                          compute_dtype, is_storage_dtype)
from .attention import attention_forward, band_mask


class CacheFullError(Exception):
    """A cache has no room for a call's positions (left unchanged): base of StaticCacheFullError, OutOfBlocksError."""


class StaticCacheFullError(CacheFullError, ValueError):
    """A cache of ``max_seq_len`` positions cannot take the positions of an update or a decode."""


class Cache(abc.ABC):
    """What a decode needs of a K/V cache, as transformers' ``cache_utils.Cache``: a subclass implements
    :meth:`update`, :meth:`get_seq_length` and :meth:`crop` of one layer and sets what differs (``max_seq_len``
    None: unbounded; ``window``/``n_sink``; ``can_crop`` False: a crop may refuse a length).

    One object for every layer, as HF 5's ``Cache.layers``: this object is layer 0, :meth:`layer` makes the others
    as this one was made (HF's ``layer_class_to_replicate``). The model reaches every kind (a PagedCacheView too)
    through :meth:`check_update`, :meth:`attend`, ``get_seq_length``, ``crop``, ``nbytes*`` and :func:`atomic`.
    """

    k_cache = v_cache = None
    max_seq_len = None
    window = None
    n_sink = 0
    can_crop = True
    preallocated = False  # buffers of max_seq_len (or the window) allocated up front: nbytes_reserved

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._made_with, self._more = (args, kwargs), []  # layers 1.. (made by layer())
        return self

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
        if self.preallocated:
            (k_shape, v_shape), k = self._shapes, self.k_cache
            return k_shape[:-2], k_shape[-1], v_shape[-1], None if k is None else k.dtype
        k, v = self.k_cache, self.v_cache
        return (None,) * 4 if k is None else (k.shape[:-2], k.shape[-1], v.shape[-1], k.dtype)

    def _allocate(self, dtype):
        """A preallocated cache's zero buffers ``_shapes`` in ``dtype``: at construction, or at the first update
        of a cache built without a dtype (HF's ``StaticLayer.lazy_initialization``)."""
        self.k_cache, self.v_cache = (np.zeros(shape, dtype) for shape in self._shapes)

    # One object for every layer

    @property
    def layers(self):
        """The layers made so far, this object first (list)."""
        return [self, *self._more]

    def layer(self, layer_idx):
        """Layer ``layer_idx``'s cache: this object for 0; the others made, empty, the first time they are asked for."""
        while len(self._more) < layer_idx:
            args, kwargs = self._made_with
            self._more.append(type(self)(*args, **kwargs))
        return self._more[layer_idx - 1] if layer_idx else self

    @property
    def nbytes(self):
        """Bytes of the keys and values every layer holds (int)."""
        return sum(layer._nbytes() for layer in self.layers)

    @property
    def nbytes_reserved(self):
        """Bytes of every layer's buffers allocated up front (int; 0 before the first update of one built without
        a dtype); None for a cache that grows."""
        if not self.preallocated:
            return None
        return sum(c.k_cache.nbytes + c.v_cache.nbytes for c in self.layers if c.k_cache is not None)

    def check_update(self, num_layers, batch_shape, k_dim, v_dim, dtype, t_new, input_ids=None):
        """Raise, before a model's call writes, unless each of ``num_layers`` layers, all of one length, takes ``t_new``
        more k, v ``[*batch_shape, t_new, k_dim | v_dim]`` in ``dtype`` (StaticCacheFullError past max_seq_len)."""
        layers = self.layers
        if len(layers) > num_layers:
            raise ValueError(f"cache holds {len(layers)} layers, more than num_hidden_layers={num_layers}")
        lengths = sorted({str(c.get_seq_length()) for c in layers})
        if len(lengths) > 1:
            raise ValueError(f"cache: the layers hold different lengths {lengths}")
        for i, c in enumerate(layers):
            shape, *widths, stored = c.layout
            if shape is not None and (shape, *widths) != (batch_shape, k_dim, v_dim):
                raise ValueError(f"cache layer {i} holds batch shape {shape}, k, v widths {widths}; needed "
                                 f"{(batch_shape, k_dim, v_dim)}")
            if stored is not None and not np.can_cast(dtype, compute_dtype(stored), casting="safe"):
                raise TypeError(f"cache layer {i} stores {stored}, which cannot hold the model's {dtype} k and v")
            if c.max_seq_len is not None and c.get_seq_length() + t_new > c.max_seq_len:
                raise StaticCacheFullError(f"cache is too short: {c.get_seq_length()} of max_seq_len={c.max_seq_len} "
                                           f"positions used, the call writes {t_new} more")

    def attend(self, q, k, v, layer_idx=0):
        """Store ``k``, ``v`` ``[B, H_kv, T, D]`` in layer ``layer_idx``; return the causal (a window's: banded)
        attention of ``q [B, H, T, D]`` over its keys, ``[B, H, T, D_v]``: query head h reads K/V head h // G, a
        group's G·T rows one matmul with it. The cache attends, as vLLM's attention backends, so a view can too."""
        c, (B, H, T, D), H_kv = self.layer(layer_idx), q.shape, k.shape[1]
        start, key_positions = c.get_seq_length(), c.key_positions(T)
        keys, values = c.update(k, v)  # [B, H_kv, S, D]: the keys this chunk may attend to
        allowed = band_mask(np.arange(start, start + T), key_positions, c.window, c.n_sink)  # [T, S]
        mask = None if allowed.all() else np.tile(allowed, (H // H_kv, 1))  # [G·T, S]
        out = attention_forward(q.reshape(B, H_kv, H // H_kv * T, D), keys.astype(q.dtype, copy=False),
                                values.astype(q.dtype, copy=False), mask)  # [B, H_kv, G·T, D_v]
        return out.reshape(B, H, T, values.shape[-1])

    def snapshot(self, t_new):
        """What a call writing up to ``t_new`` positions a layer may change, for :meth:`restore` (:func:`atomic`)."""
        return len(self._more), [c._snapshot(t_new) for c in self.layers]

    def restore(self, snapshot):
        """Every layer as at ``snapshot``; the layers made since dropped."""
        made, states = snapshot
        del self._more[made:]
        for c, state in zip(self.layers, states):
            c._restore(state)

    def commit(self):
        """The end of a call that succeeded (a paged view caches the blocks it filled)."""

    def _snapshot(self, t_new):  # a layer's: its length, cropped back to (a cache that never writes over what it holds)
        return self.get_seq_length()

    def _restore(self, length):
        if self.get_seq_length() != length:
            self.crop(length)


@contextlib.contextmanager
def atomic(cache, t_new):
    """The body as one call writing up to ``t_new`` positions a layer of ``cache`` (None: nothing to undo): if it
    raises anything (a MemoryError, a KeyboardInterrupt), ``cache.restore(cache.snapshot(t_new))`` and the error goes
    on as it was; else ``cache.commit()``. The one rollback of forward, generate and prompt lookup."""
    snapshot = None if cache is None else cache.snapshot(t_new)
    try:
        yield
        if cache is not None:
            cache.commit()  # inside: a commit interrupted half-way is undone too
    except BaseException:
        if cache is not None:
            cache.restore(snapshot)
        raise


def as_batch_shape(batch_shape):
    """``batch_shape`` as a tuple of ints >= 0; TypeError unless it is a tuple or list."""
    if not isinstance(batch_shape, (tuple, list)):
        raise TypeError(f"batch_shape must be a tuple of ints such as () or (B,), got {batch_shape!r}")
    return tuple(as_size(f"batch_shape[{i}]", n) for i, n in enumerate(batch_shape))


def check_new_positions(k, v, cache, check_finite=True):
    """``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` checked to fit ``cache``'s layout, rounded to its
    bfloat16/float16 storage."""
    if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
        raise TypeError(f"k and v must be numpy arrays, got {type(k).__name__}, {type(v).__name__}")
    k_dtype, v_dtype = k.dtype.newbyteorder("="), v.dtype.newbyteorder("=")  # '>f8' counts as float64
    if k_dtype not in SUPPORTED_DTYPES or v_dtype != k_dtype:
        raise TypeError(f"k and v must both be float32 or both float64, got {k.dtype} and {v.dtype}")
    k, v = as_array("k", k), as_array("v", v)
    if k.ndim < 2 or k.ndim != v.ndim or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must be [..., T_new, D_k] and [..., T_new, D_v] with the same leading axes, "
                         f"got k {k.shape}, v {v.shape}")
    shape, k_dim, v_dim, dtype = cache.layout
    if shape is not None and (k.shape[:-2], k.shape[-1], v.shape[-1]) != (shape, k_dim, v_dim):
        raise ValueError(f"k {k.shape} and v {v.shape} do not fit the cache's {_buffers(shape, k_dim, v_dim)}")
    if dtype is not None and not np.can_cast(k.dtype, compute_dtype(dtype), casting="safe"):
        raise TypeError(f"k and v are {k.dtype}, which the cache's {dtype} cannot hold without loss"
                        + (" (it stores float32 rounded)" if is_storage_dtype(dtype) else ""))
    if check_finite:
        check_finite_array("k", k)
        check_finite_array("v", v)
    if dtype is not None:
        k, v = as_stored("k", k, dtype), as_stored("v", v, dtype)
    return k, v


def _buffers(shape, k_dim, v_dim):
    """``k_cache [*shape, T, k_dim] and v_cache [...]``, for an error."""
    k, v = (", ".join(map(str, (*shape, "T", d))) for d in (k_dim, v_dim))
    return f"k_cache [{k}] and v_cache [{v}]"


def check_crop(length, stored):
    """``length`` as an int, or raise unless it is an integer in [0, stored]."""
    length = as_size("crop length", length)
    if length > stored:
        raise ValueError(f"crop length must be in [0, {stored}], got {length}")
    return length


def check_cache_fits(cache, kv_shape, t_new, dtype, window=None, n_sink=0):
    """Raise unless a given cache fits: ``kv_shape = (k_shape, v_shape)`` without the T axis, ``dtype``,
    room for ``t_new`` more positions, and (a cache that keeps a window) the call's ``window`` and ``n_sink``."""
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be a kv_attention.Cache instance (e.g. DynamicCache()), got {cache!r:.100}")
    if cache.window is not None and (cache.window, cache.n_sink) != (window, n_sink):
        hint = "; full attention needs a cache of every position, e.g. StaticCache" if window is None else ""
        raise ValueError(f"cache keeps window={cache.window}, n_sink={cache.n_sink} but the call has "
                         f"window={window}, n_sink={n_sink}{hint}")
    shape, k_dim, v_dim, stored = cache.layout
    if shape is not None and (shape + (k_dim,), shape + (v_dim,)) != kv_shape:
        k_shape, v_shape = (", ".join(map(str, (*s[:-1], "T", s[-1]))) for s in kv_shape)
        raise ValueError(f"cache does not fit x: {_buffers(shape, k_dim, v_dim)} must be [{k_shape}] and [{v_shape}]")
    if stored is not None and compute_dtype(stored) != dtype:
        raise TypeError(f"cache holds {stored} but the computation is {dtype}")
    stored, room = cache.get_seq_length(), cache.max_seq_len
    if room is not None and stored + t_new > room:
        raise StaticCacheFullError(f"cache too short: {stored} of max_seq_len={room} positions used, "
                                   f"x needs T={t_new} more")
    return cache


class DynamicCache(Cache):
    """A K/V cache grown by ``np.concatenate`` (each update copies every position: O(T²) for T steps); its leading
    axes and, with ``dtype`` None (HF's: the model's), its dtype are fixed by the first update (None before it)."""

    def __init__(self, dtype=None):
        self.k_cache = self.v_cache = None
        self._dtype = None if dtype is None else as_float_dtype(dtype, storage=True)

    def __repr__(self):
        if self.k_cache is None:
            return "DynamicCache(seq_length=0)"
        return (f"DynamicCache(k_cache={list(self.k_cache.shape)}, v_cache={list(self.v_cache.shape)}, "
                f"dtype={self.k_cache.dtype}, seq_length={self.get_seq_length()})")

    def update(self, k, v, layer_idx=0, *, check_finite=True):
        """Append ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` to layer ``layer_idx``; return its own arrays
        (do not write)."""
        if layer_idx:
            return self.layer(layer_idx).update(k, v, check_finite=check_finite)
        return self._append(*check_new_positions(k, v, self, check_finite))

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

    def get_seq_length(self, layer_idx=0):
        if layer_idx:
            return self.layer(layer_idx).get_seq_length()
        return 0 if self.k_cache is None else self.k_cache.shape[-2]

    def crop(self, length):
        """Keep the first ``length`` positions of every layer; ``crop(0)`` empties the cache as new."""
        length = check_crop(length, self.get_seq_length())
        for c in self._more:
            c.crop(length)
        if length == 0:
            self.k_cache = self.v_cache = None
        elif self.k_cache is not None:  # views, as HF's DynamicLayer.crop: the kept positions are not copied
            self.k_cache, self.v_cache = self.k_cache[..., :length, :], self.v_cache[..., :length, :]

    def _nbytes(self):
        return 0 if self.k_cache is None else self.k_cache.nbytes + self.v_cache.nbytes


class StaticCache(Cache):
    """A K/V cache ``[*batch_shape, max_seq_len, k_dim | v_dim]`` allocated once (zero past the length), written in
    place. ``batch_shape`` e.g. ``()``, ``(B,)`` or ``(B, H_kv)``; ``k_dim`` >= 1; ``dtype`` None: the first
    update's."""

    preallocated = True

    def __init__(self, batch_shape, max_seq_len, k_dim, v_dim, dtype=None):
        batch_shape = as_batch_shape(batch_shape)
        max_seq_len, v_dim = as_size("max_seq_len", max_seq_len), as_size("v_dim", v_dim)
        k_dim = as_size("k_dim", k_dim, minimum=1)
        self._length = 0
        self._shapes = batch_shape + (max_seq_len, k_dim), batch_shape + (max_seq_len, v_dim)  # [..., T_max, D]
        if dtype is not None:
            self._allocate(as_float_dtype(dtype, storage=True))

    max_seq_len = property(lambda self: self._shapes[0][-2])

    def __repr__(self):
        batch_shape, k_dim, v_dim, dtype = self.layout
        return (f"StaticCache(batch_shape={batch_shape}, max_seq_len={self.max_seq_len}, k_dim={k_dim}, "
                f"v_dim={v_dim}, dtype={dtype}, seq_length={self._length})")

    def update(self, k, v, layer_idx=0, *, check_finite=True):
        """Write ``k: [..., T_new, D_k]``, ``v: [..., T_new, D_v]`` after layer ``layer_idx``'s positions; return views
        ``[..., T, D]`` of the buffers (do not write); StaticCacheFullError past ``max_seq_len``."""
        if layer_idx:
            return self.layer(layer_idx).update(k, v, check_finite=check_finite)
        k, v = check_new_positions(k, v, self, check_finite)
        if self._length + k.shape[-2] > self.max_seq_len:
            raise StaticCacheFullError(f"cache is full: {self._length} of max_seq_len={self.max_seq_len} positions "
                                       f"used, cannot write {k.shape[-2]} more")
        if self.k_cache is None:
            self._allocate(k.dtype)
        return self._append(k, v)

    def _append(self, k, v):
        """:meth:`update` of checked k, v that fit, its buffers allocated (a decode's own cache: its lean step)."""
        start, stop = self._length, self._length + k.shape[-2]
        self.k_cache[..., start:stop, :] = k
        self.v_cache[..., start:stop, :] = v
        self._length = stop
        return self.k_cache[..., :stop, :], self.v_cache[..., :stop, :]

    def get_seq_length(self, layer_idx=0):
        return self.layer(layer_idx).get_seq_length() if layer_idx else self._length

    def crop(self, length):
        """Keep the first ``length`` positions of every layer; those dropped, and only they, are zeroed."""
        length = check_crop(length, self._length)
        for c in self._more:
            c.crop(length)
        self._restore((length, self._length - length, self.k_cache is None))

    def _snapshot(self, t_new):
        return self._length, t_new, self.k_cache is None

    def _restore(self, state):
        """Back to ``length``, the ``t_new`` positions after it zeroed (those a call may have written), or to no
        buffers."""
        length, t_new, unallocated = state
        if unallocated:
            self.k_cache = self.v_cache = None
        else:
            self.k_cache[..., length : length + t_new, :] = 0
            self.v_cache[..., length : length + t_new, :] = 0
        self._length = length

    def _nbytes(self):  # the positions held, not the capacity
        if self.k_cache is None:
            return 0
        return (self.k_cache.nbytes + self.v_cache.nbytes) // max(self.max_seq_len, 1) * self._length
