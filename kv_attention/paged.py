"""A paged K/V cache: fixed-size blocks from a shared pool, one block table per sequence, and paged attention.

PagedAttention (Kwon et al. 2023, the vLLM paper), in vLLM's terms: ``block_size``
tokens per block, ``num_blocks`` in the pool, a ``block_table`` per sequence
(logical block j -> physical block), a ``slot_mapping`` per new token
(``physical_block * block_size + offset``), a refcount per block. The allocator
(:mod:`~kv_attention.block_allocator`) keeps V1's free block queue and the refcounts; this
class the map of sequence -> block table. :meth:`PagedKVCache.fork` shares the
parent's blocks, and the first write into a shared last block copies it
(copy-on-write); with ``enable_prefix_caching`` full blocks are cached under a
chained hash (:mod:`~kv_attention.prefix_caching`).

:func:`paged_attention` reads each stored token's k and v once per step, through its
sequence's block table: in NumPy, reading through a block table copies (``k_cache[table]``),
as a GPU kernel loads a block into shared memory before attending to it, so a step copies
each sequence's blocks once (no table padded to the longest; of a last block, its empty
slots too). Sequences of one length are gathered together and attended in one call, one
softmax over a sequence's keys. What matches vLLM's v1 kernel
(``csrc/attention/attention_kernels.cuh``): the keys of a sequence are read through its
block table and take one softmax. What differs: a CUDA thread block per sequence and head
reads each block from HBM into shared memory and never writes a gathered copy back; here
the copy is an array, and a group of sequences one NumPy call.

Errors: TypeError or ValueError naming the argument (ids, shapes, dtypes, token ids,
sizes, NaN/inf), :class:`OutOfBlocksError` when an update needs more blocks than are
free. Every check, the count of free blocks included, runs before anything is
written, so a call that raises changes nothing.
"""

import math

import numpy as np

from ._validation import (as_array, as_flag, as_float_array, as_float_dtype, as_integer_array, as_size,
                          as_sizes_per_sequence, as_stored, compute_dtype)
from .attention import attention_forward
from .block_allocator import BlockAllocator, OutOfBlocksError
from .cache import check_crop
from .prefix_caching import PrefixCachingAllocator, hash_block_tokens


def as_id_list(seq_ids):
    """``seq_ids`` as a list; TypeError unless it is an ordered sequence (list, tuple, array, range)."""
    if not isinstance(seq_ids, (list, tuple, np.ndarray, range)):
        raise TypeError(f"seq_ids must be a list, tuple or array of sequence ids (ordered: row i is seq_ids[i]), "
                        f"got {type(seq_ids).__name__} {seq_ids!r}")
    return list(seq_ids)


def _check_hashable(seq_id):
    try:
        hash(seq_id)
    except TypeError:
        raise TypeError(f"a sequence id must be hashable, got {seq_id!r}") from None


def as_token_ids(name, token_ids):
    """``token_ids`` as a 1-D int64 array; TypeError unless integers, ValueError unless 1-D."""
    array = as_integer_array(name, token_ids)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {array.shape}")
    return array


def _as_update_token_ids(token_ids, n_seqs, t_new):
    """The token ids of an update's new positions as ``[N, T_new]`` int64 (None stays None)."""
    if token_ids is None:
        return None
    array = as_integer_array("token_ids", token_ids)
    if array.shape != (n_seqs, t_new):
        raise ValueError(f"token_ids must be [N, T_new] = [{n_seqs}, {t_new}], one per new position, got shape {array.shape}")
    return array


class PagedKVCache:
    """K/V of many sequences in pools ``k_cache: [num_blocks, block_size, D_k]``, ``v_cache: [..., D_v]``.

    A sequence holds ``ceil(length / block_size)`` blocks, plus any reserved by
    :meth:`allocate_slots`; tokens never move once written. With ``num_layers``, one
    block table per sequence, one allocator and its prefix-cache hashes serve every
    layer, and each layer has its own pools ``k_caches[layer]``, ``v_caches[layer]``
    (``k_cache`` is layer 0's), as vLLM V1's ``KVCacheManager`` serves the per-layer
    ``kv_caches`` of a model. With ``num_kv_heads``
    the pools are ``[num_blocks, block_size, num_kv_heads, D]`` and a token's k/v
    ``[num_kv_heads, D]``: vLLM's layer pool (``FlashAttentionBackend.get_kv_cache_shape``
    in ``vllm/v1/attention/backends/flash_attn.py``: ``(2, num_blocks, block_size,
    num_kv_heads, head_size)``, K and V stacked, its "NHD" layout).
    """

    def __init__(self, num_blocks, block_size, k_dim, v_dim, dtype=np.float64, *, enable_prefix_caching=False,
                 num_kv_heads=None, num_layers=1):
        num_blocks = as_size("num_blocks", num_blocks)
        k_dim, v_dim = as_size("k_dim", k_dim, minimum=1), as_size("v_dim", v_dim)  # the library's rule for widths
        block_size = as_size("block_size", block_size, minimum=1)
        dtype = as_float_dtype(dtype, storage=True)  # bfloat16/float16 as cache.py's caches
        enable_prefix_caching = as_flag("enable_prefix_caching", enable_prefix_caching)
        heads = () if num_kv_heads is None else (as_size("num_kv_heads", num_kv_heads, minimum=1),)
        num_layers = as_size("num_layers", num_layers, minimum=1)
        self.k_caches = [np.zeros((num_blocks, block_size, *heads, k_dim), dtype) for _ in range(num_layers)]
        self.v_caches = [np.zeros((num_blocks, block_size, *heads, v_dim), dtype) for _ in range(num_layers)]
        self.allocator = (PrefixCachingAllocator if enable_prefix_caching else BlockAllocator)(num_blocks)
        self._block_tables = {}  # seq_id -> [physical block, ...]
        self._lengths = {}  # seq_id -> tokens stored
        self._token_ids = {}  # prefix caching: seq_id -> its token ids, or None once a write had none
        self._block_hashes = {}  # prefix caching: seq_id -> hashes of its full blocks
        self._num_cached = {}  # prefix caching: seq_id -> its first blocks that are cached (V1's num_cached_block)
        self._peak_blocks = 0

    def __repr__(self):
        return (f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"k_dim={self.k_cache.shape[-1]}, v_dim={self.v_cache.shape[-1]}, dtype={self.k_cache.dtype}, "
                f"{'' if self.num_kv_heads is None else f'num_kv_heads={self.num_kv_heads}, '}"
                f"{'' if self.num_layers == 1 else f'num_layers={self.num_layers}, '}"
                f"blocks_in_use={self.blocks_in_use}, sequences={len(self._block_tables)})")

    @property
    def k_cache(self):
        """Layer 0's key pool ``[num_blocks, block_size, (H_kv,) D_k]``."""
        return self.k_caches[0]

    @property
    def v_cache(self):
        """Layer 0's value pool ``[num_blocks, block_size, (H_kv,) D_v]``."""
        return self.v_caches[0]

    @property
    def num_layers(self):
        """Layers whose K/V the pool holds, all through the same block tables (int)."""
        return len(self.k_caches)

    @property
    def num_blocks(self):
        """Physical blocks in the pool (int)."""
        return self.k_cache.shape[0]

    @property
    def block_size(self):
        """Token slots per block (int)."""
        return self.k_cache.shape[1]

    @property
    def num_kv_heads(self):
        """K/V heads of each token (int), or None for a pool of one head without the axis."""
        return self.k_cache.shape[2] if self.k_cache.ndim == 4 else None

    @property
    def enable_prefix_caching(self):
        """Whether full blocks are cached by the hash of their tokens (bool)."""
        return isinstance(self.allocator, PrefixCachingAllocator)

    @property
    def seq_ids(self):
        """The sequences held, in the order they were added (tuple)."""
        return tuple(self._block_tables)

    def add_sequence(self, seq_id, token_ids=None):
        """Start sequence ``seq_id`` (any hashable); returns the tokens it starts with.

        With prefix caching and ``token_ids``, it holds the longest run of cached full
        blocks of ``token_ids`` (a hit) and returns their tokens; else 0.
        """
        self._check_new(seq_id)
        token_ids = None if token_ids is None else as_token_ids("token_ids", token_ids)
        blocks, hashes = self._cached_prefix(token_ids)
        self.allocator.share(blocks)
        self._block_tables[seq_id] = blocks
        self._lengths[seq_id] = len(blocks) * self.block_size
        if self.enable_prefix_caching:
            self._token_ids[seq_id] = [] if token_ids is None else token_ids[: self._lengths[seq_id]].tolist()
            self._block_hashes[seq_id], self._num_cached[seq_id] = hashes, len(hashes)
        self._note_peak()
        return self._lengths[seq_id]

    def find_cached_blocks(self, token_ids):
        """The cached blocks :meth:`add_sequence` would start from with ``token_ids`` (tuple; changes nothing)."""
        return tuple(self._cached_prefix(as_token_ids("token_ids", token_ids))[0])

    def fork(self, parent_id, child_id):
        """Start ``child_id`` sharing ``parent_id``'s written blocks (each refcount + 1); copy-on-write after."""
        self._check_known([parent_id])
        self._check_new(child_id)
        blocks = self._block_tables[parent_id][: self._blocks_for(self._lengths[parent_id])]
        self.allocator.share(blocks)
        self._block_tables[child_id] = list(blocks)
        self._lengths[child_id] = self._lengths[parent_id]
        if self.enable_prefix_caching:
            tokens = self._token_ids[parent_id]
            self._token_ids[child_id] = None if tokens is None else list(tokens)
            self._block_hashes[child_id] = list(self._block_hashes[parent_id])
            self._num_cached[child_id] = self._num_cached[parent_id]

    def free(self, seq_id):
        """Remove ``seq_id``; the blocks no sequence holds go back on the free queue, its last block first (a cached
        one stays findable until taken)."""
        self._check_known([seq_id])
        self.allocator.free(self._block_tables.pop(seq_id)[::-1])  # tail first, as V1's free
        del self._lengths[seq_id]
        for state in (self._token_ids, self._block_hashes, self._num_cached):
            state.pop(seq_id, None)

    def get_seq_length(self, seq_id):
        """Tokens stored for ``seq_id`` (int)."""
        self._check_known([seq_id])
        return self._lengths[seq_id]

    def get_seq_lengths(self, seq_ids):
        """Tokens stored for each of ``seq_ids``: ``[N]`` int64."""
        seq_ids = as_id_list(seq_ids)
        self._check_known(seq_ids)
        return np.array([self._lengths[s] for s in seq_ids], dtype=np.int64)

    def block_table(self, seq_id):
        """The physical blocks of ``seq_id``, logical block 0 first (tuple of ints)."""
        self._check_known([seq_id])
        return tuple(self._block_tables[seq_id])

    def ref_count(self, block):
        """Block tables holding physical block ``block`` (int; 0 for a free or only cached block)."""
        return self.allocator.ref_count(block)

    def allocate_slots(self, seq_id, num_tokens):
        """Reserve blocks for ``num_tokens`` more tokens of ``seq_id`` (vLLM's ``allocate_slots``); returns how many.

        All or nothing: :class:`OutOfBlocksError` if fewer are free.
        """
        self._check_known([seq_id])
        num_tokens = as_size("num_tokens", num_tokens)
        needed = self._blocks_needed([seq_id], num_tokens)
        if needed > self.allocator.num_free_blocks:
            raise self._out_of_blocks(1, needed)
        self._make_room(seq_id, num_tokens)
        self._note_peak()
        return needed

    def crop(self, seq_id, length):
        """Keep the first ``length`` tokens of ``seq_id`` (a write taken back); its blocks past them are freed, tail
        first (a cached one stays findable). A cached block is never written again: a write into one, after a crop
        inside it, copies it first."""
        self._check_known([seq_id])
        length = check_crop(length, self._lengths[seq_id])
        table, full = self._block_tables[seq_id], length // self.block_size
        self.allocator.free(table[self._blocks_for(length) :][::-1])
        del table[self._blocks_for(length) :]
        self._lengths[seq_id] = length
        if self.enable_prefix_caching:
            del self._block_hashes[seq_id][full:]
            self._num_cached[seq_id] = min(self._num_cached[seq_id], full)
            if self._token_ids[seq_id] is not None:
                del self._token_ids[seq_id][length:]

    def update(self, seq_ids, k, v, token_ids=None):
        """Append ``k: [N, T_new, D_k]``, ``v: [N, T_new, D_v]``, row i to sequence ``seq_ids[i]``; return slot_mapping.

        With ``num_kv_heads``, ``k: [N, T_new, H_kv, D_k]`` and ``v: [N, T_new, H_kv, D_v]``.

        ``token_ids: [N, T_new]`` name the new tokens; with prefix caching each block they
        fill is cached (a write without them ends caching for those sequences).
        slot_mapping ``[N, T_new]`` int64 is the slot each new position was written to.
        A pool of one layer only: :meth:`append_slots`, :meth:`write_slots` and
        :meth:`cache_full_blocks` are its three steps, for a pool of several layers.
        """
        if self.num_layers != 1:
            raise ValueError(f"update writes a pool of one layer, this one has num_layers={self.num_layers}: "
                             f"append_slots, then write_slots for each layer, then cache_full_blocks")
        seq_ids = as_id_list(seq_ids)
        k, v = self._check_positions(k, v, len(seq_ids))
        slot_mapping = self.append_slots(seq_ids, k.shape[1], token_ids)
        self._write(0, slot_mapping, k, v)
        self.cache_full_blocks(seq_ids)
        return slot_mapping

    def append_slots(self, seq_ids, num_new_tokens, token_ids=None):
        """Give each of ``seq_ids`` ``num_new_tokens`` more tokens: ``slot_mapping [N, T_new]`` int64, their slots.

        The tokens count as stored at once, in every layer: each layer's k/v go to those
        slots by :meth:`write_slots` before it attends, and :meth:`cache_full_blocks`
        then caches the blocks they filled (vLLM V1's ``allocate_slots``, one
        slot_mapping for every layer). ``token_ids: [N, T_new]`` as :meth:`update`'s.
        """
        seq_ids = as_id_list(seq_ids)
        self._check_known(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids repeats a sequence: {seq_ids}")
        t_new = as_size("num_new_tokens", num_new_tokens)
        token_ids = _as_update_token_ids(token_ids, len(seq_ids), t_new)
        needed = self._blocks_needed(seq_ids, t_new)
        if needed > self.allocator.num_free_blocks:
            raise self._out_of_blocks(len(seq_ids), needed)
        for seq_id in seq_ids:
            self._make_room(seq_id, t_new)
        slot_mapping = self._slot_mapping(seq_ids, t_new)  # [N, T_new]
        for i, seq_id in enumerate(seq_ids):
            self._lengths[seq_id] += t_new
            if self.enable_prefix_caching and t_new:  # an empty write changes nothing, caching included
                self._record_tokens(seq_id, None if token_ids is None else token_ids[i])
        self._note_peak()
        return slot_mapping

    def write_slots(self, layer, slot_mapping, k, v):
        """Write layer ``layer``'s ``k: [N, T_new, (H_kv,) D_k]``, ``v: [N, T_new, (H_kv,) D_v]`` at the
        ``slot_mapping [N, T_new]`` that :meth:`append_slots` gave (vLLM's ``reshape_and_cache``)."""
        layer = self._check_layer(layer)
        slot_mapping = np.asarray(slot_mapping)
        if slot_mapping.dtype.kind not in "iu" or slot_mapping.ndim != 2:
            raise TypeError(f"slot_mapping must be integers [N, T_new], got {slot_mapping.dtype} {slot_mapping.shape}")
        if slot_mapping.size and not 0 <= slot_mapping.min() <= slot_mapping.max() < self.num_blocks * self.block_size:
            raise ValueError(f"slot_mapping holds a slot outside the pool's {self.num_blocks * self.block_size}")
        k, v = self._check_positions(k, v, len(slot_mapping))
        if k.shape[1] != slot_mapping.shape[1]:
            raise ValueError(f"k and v hold T_new={k.shape[1]} positions, slot_mapping {slot_mapping.shape[1]}")
        self._write(layer, slot_mapping, k, v)

    def cache_full_blocks(self, seq_ids):
        """With prefix caching, cache the full blocks of ``seq_ids`` not cached yet (V1's ``cache_full_blocks``)."""
        seq_ids = as_id_list(seq_ids)
        self._check_known(seq_ids)
        for seq_id in seq_ids if self.enable_prefix_caching else ():
            table, hashes = self._block_tables[seq_id], self._block_hashes[seq_id]
            for j in range(self._num_cached[seq_id], len(hashes)):
                if not self.allocator.is_cached(table[j]):  # a sharer cached it already (a fork)
                    self.allocator.cache(table[j], hashes[j])
            self._num_cached[seq_id] = len(hashes)

    def checkpoint(self, seq_ids, num_new_tokens):
        """The state that :meth:`append_slots` of ``num_new_tokens`` tokens of ``seq_ids`` changes, for :meth:`restore`.

        A model's call takes its slots once, then writes and attends layer by layer; when a later layer fails,
        :meth:`restore` puts the pool back as it was (for a generate, ``num_new_tokens`` counts every step's, run
        or not). The checkpoint holds the blocks the call may take, the contents of the cached ones among them
        (the layers write over them), each sequence's table, length, token ids and block hashes, and the peak:
        O(blocks taken + the sequences' blocks and tokens), not O(num_blocks).
        """
        seq_ids = as_id_list(seq_ids)
        self._check_known(seq_ids)
        needed = self._blocks_needed(seq_ids, as_size("num_new_tokens", num_new_tokens))
        evicted = [b for b in self.allocator.free_blocks(needed) if self._cached(b)]
        tokens = {s: self._token_ids.get(s) for s in seq_ids}  # None: caching ended (or no prefix caching)
        seqs = {s: (list(self._block_tables[s]), self._lengths[s], None if tokens[s] is None else list(tokens[s]),
                    list(self._block_hashes.get(s, ()))) for s in seq_ids}
        contents = [pool[evicted] for pool in self.k_caches + self.v_caches] if evicted else []  # [n, size, (H,) D]
        return self.allocator.checkpoint(needed), evicted, contents, seqs, self._peak_blocks

    def restore(self, checkpoint):
        """Undo the :meth:`append_slots` and :meth:`write_slots` made since ``checkpoint`` (:meth:`checkpoint`; nothing
        else may have changed the pool since): each copied shared last block held again, the blocks taken back on the
        free queue in their places, the cached ones cached again with their contents."""
        allocator, evicted, contents, seqs, self._peak_blocks = checkpoint
        for seq_id, (table, length, tokens, hashes) in seqs.items():
            now = self._block_tables[seq_id]
            self.allocator.share([b for b, b_now in zip(table, now) if b != b_now])  # copy-on-write: the original
            self._block_tables[seq_id], self._lengths[seq_id] = table, length
            if self.enable_prefix_caching:
                self._token_ids[seq_id], self._block_hashes[seq_id] = tokens, hashes
        self.allocator.restore(allocator)
        for pool, saved in zip(self.k_caches + self.v_caches, contents):
            pool[evicted] = saved

    def _write(self, layer, slot_mapping, k, v):
        slots, new = self.num_blocks * self.block_size, slot_mapping.size  # explicit: reshape(-1, 0) is ambiguous
        self.k_caches[layer].reshape(slots, *k.shape[2:])[slot_mapping.ravel()] = k.reshape(new, *k.shape[2:])
        self.v_caches[layer].reshape(slots, *v.shape[2:])[slot_mapping.ravel()] = v.reshape(new, *v.shape[2:])

    def _check_layer(self, layer):
        layer = as_size("layer", layer)
        if layer >= self.num_layers:
            raise ValueError(f"layer={layer} is not a layer of the pool: num_layers={self.num_layers}")
        return layer

    def gather(self, seq_ids, layer=0):
        """Layer ``layer``'s copies ``(k [N, S, (H_kv,) D_k], v [N, S, (H_kv,) D_v], lengths [N])`` of ``seq_ids``.

        Row i holds ``seq_ids[i]``'s tokens at positions ``< lengths[i]``; past that, slots of
        its own last block (mask them).
        """
        seq_ids = as_id_list(seq_ids)
        lengths = self.get_seq_lengths(seq_ids)  # checks every id
        tables = [self._block_tables[s][: self._blocks_for(n)] for s, n in zip(seq_ids, lengths.tolist())]
        n, width = len(seq_ids), max((len(t) for t in tables), default=0)
        # Pad each table with its own last block, so that no row reads another sequence's block.
        held = [t + t[-1:] * (width - len(t)) for t in tables if t]
        index = np.array(held, dtype=np.int64).reshape(len(held), width)  # [N_held, blocks]
        layer = self._check_layer(layer)
        k = self._gather_pool(self.k_caches[layer], index, tables, n)  # [N, S, D_k]
        v = self._gather_pool(self.v_caches[layer], index, tables, n)  # [N, S, D_v]
        return k, v, lengths

    def _gather_pool(self, pool, index, tables, n):
        """``pool[index]`` as ``[N, S, D]``; zero rows for the sequences that hold no block."""
        gathered = pool[index].reshape(len(index), index.shape[1] * self.block_size, *pool.shape[2:])  # [N_held, S, D]
        if len(index) == n:
            return gathered
        out = np.zeros((n,) + gathered.shape[1:], dtype=pool.dtype)  # [N, S, D]
        out[[bool(t) for t in tables]] = gathered
        return out

    @property
    def blocks_in_use(self):
        """Blocks held by some sequence, a shared block once (int)."""
        return self.num_blocks - self.allocator.num_free_blocks

    @property
    def num_free_blocks(self):
        """Blocks that can be taken (int): those on the free queue, cached ones that no sequence holds included."""
        return self.allocator.num_free_blocks

    @property
    def peak_blocks(self):
        """The most blocks in use at once since the cache was made (int)."""
        return self._peak_blocks

    @property
    def slots_allocated(self):
        """Token slots in the blocks in use: blocks_in_use × block_size (int)."""
        return self.blocks_in_use * self.block_size

    @property
    def slots_used(self):
        """Token slots holding a token, a shared block's once: the sum of the lengths without sharing (int)."""
        filled = {}  # block -> tokens in it; sharers of a block agree, since a write into a shared block copies it
        for seq_id, table in self._block_tables.items():
            length = self._lengths[seq_id]
            for j in range(self._blocks_for(length)):
                filled[table[j]] = min(self.block_size, length - j * self.block_size)
        return sum(filled.values())

    @property
    def internal_fragmentation(self):
        """Allocated token slots that hold no token, slots_allocated - slots_used (int)."""
        return self.slots_allocated - self.slots_used

    @property
    def nbytes(self):
        """Logical size of the stored keys and values, in bytes (int); not the pool's size."""
        layer_bytes = self.k_cache.nbytes + self.v_cache.nbytes
        per_slot = self.num_layers * layer_bytes // max(self.num_blocks * self.block_size, 1)
        return per_slot * self.slots_used

    def _check_new(self, seq_id):
        """Raise unless ``seq_id`` is hashable and not in the cache."""
        _check_hashable(seq_id)
        if seq_id in self._block_tables:
            raise ValueError(f"sequence {seq_id!r} is already in the cache")

    def _check_known(self, seq_ids):
        """Raise unless every one of ``seq_ids`` is in the cache."""
        for seq_id in seq_ids:
            _check_hashable(seq_id)
            if seq_id not in self._block_tables:
                raise ValueError(f"sequence {seq_id!r} is not in the cache; known: {list(self._block_tables)}")

    def _check_positions(self, k, v, n_seqs):
        """Return k, v as arrays, or raise unless they are ``[N, T_new, D_k]``/``[N, T_new, D_v]`` for the pool."""
        k, v = as_float_array("k", k), as_float_array("v", v)
        expected_k = (n_seqs, k.shape[1] if k.ndim == self.k_cache.ndim else "T_new", *self.k_cache.shape[2:])
        expected_v = (n_seqs, expected_k[1], *self.v_cache.shape[2:])
        if k.shape != expected_k or v.shape != expected_v:
            heads, h = ("", "") if self.num_kv_heads is None else ("H_kv, ", f"H_kv={self.num_kv_heads}, ")
            raise ValueError(f"k and v must be [N, T_new, {heads}D_k] and [N, T_new, {heads}D_v] for N={n_seqs} "
                             f"seq_ids, {h}D_k={expected_k[-1]}, D_v={expected_v[-1]}: got k {k.shape}, v {v.shape}")
        if v.dtype != k.dtype or not np.can_cast(k.dtype, compute_dtype(self.k_cache.dtype), casting="safe"):
            raise TypeError(f"k and v must both be float32 or both float64 and fit the pool's {self.k_cache.dtype}: "
                            f"got {k.dtype} and {v.dtype}")
        return as_stored("k", k, self.k_cache.dtype), as_stored("v", v, self.v_cache.dtype)  # bfloat16/float16: rounded

    def _blocks_for(self, length):
        return math.ceil(length / self.block_size)

    def _blocks_needed(self, seq_ids, t_new):
        """Blocks that writing ``t_new`` more positions of each of ``seq_ids`` takes: new ones, and
        copies of a shared last block (for each writer but the last, when all its holders write)."""
        if t_new == 0:
            return 0
        size, new, writers = self.block_size, 0, {}
        for seq_id in seq_ids:
            table, length = self._block_tables[seq_id], self._lengths[seq_id]
            new += max(0, self._blocks_for(length + t_new) - len(table))
            if length % size:
                writers[table[length // size]] = writers.get(table[length // size], 0) + 1
        holders = {block: self.allocator.ref_count(block) for block in writers}
        return new + sum(m if self._cached(b) else m - (m == holders[b]) for b, m in writers.items()
                         if holders[b] > 1 or self._cached(b))

    def _cached(self, block):
        """A cached block is immutable (another sequence may find it): a write into it, after a crop, copies it."""
        return self.enable_prefix_caching and self.allocator.is_cached(block)

    def _make_room(self, seq_id, t_new):
        """Take the blocks of :meth:`_blocks_needed` (counted free): copy a shared or cached last block, then extend
        the table."""
        table, length = self._block_tables[seq_id], self._lengths[seq_id]
        last = table[length // self.block_size] if length % self.block_size else None
        if t_new and last is not None and (self.allocator.ref_count(last) > 1 or self._cached(last)):
            (fresh,) = self.allocator.allocate(1)
            for pool in self.k_caches + self.v_caches:  # every layer's
                pool[fresh] = pool[last]
            self.allocator.free([last])  # the other holders keep it (a cached one stays findable)
            table[length // self.block_size] = fresh
        new = self._blocks_for(length + t_new) - len(table)
        if new > 0:
            table.extend(self.allocator.allocate(new))
            assert all(self.allocator.ref_count(b) == 1 for b in table[-new:]), "a new block table entry is not held"

    def _out_of_blocks(self, n_seqs, needed):
        return OutOfBlocksError(f"out of blocks: {n_seqs} sequence(s) need {needed} new block(s) of "
                                f"block_size={self.block_size}, {self.num_free_blocks} of num_blocks={self.num_blocks} free")

    def _note_peak(self):
        self._peak_blocks = max(self._peak_blocks, self.blocks_in_use)

    def _cached_prefix(self, token_ids):
        """The longest run of cached full blocks that starts ``token_ids``: ``(blocks, their hashes)``."""
        blocks, hashes = [], []
        if token_ids is None or not self.enable_prefix_caching:
            return blocks, hashes
        size = self.block_size
        for j in range(len(token_ids) // size):
            block_hash = hash_block_tokens(hashes[-1] if hashes else None, token_ids[j * size : (j + 1) * size])
            block = self.allocator.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
        return blocks, hashes

    def _record_tokens(self, seq_id, token_ids):
        """Record ``seq_id``'s new token ids and hash each block they complete (cached by :meth:`cache_full_blocks`)."""
        tokens, hashes, size = self._token_ids[seq_id], self._block_hashes[seq_id], self.block_size
        if tokens is None or token_ids is None:  # a write without ids ends the sequence's caching
            self._token_ids[seq_id] = None
            return
        tokens.extend(token_ids.tolist())
        while len(tokens) >= (len(hashes) + 1) * size:
            j = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens[j * size : (j + 1) * size]))

    def _slot_mapping(self, seq_ids, t_new):
        """Slots ``[N, T_new]`` of the next ``t_new`` positions of each sequence (blocks already taken)."""
        size, slots = self.block_size, []
        for seq_id in seq_ids:
            table, start = self._block_tables[seq_id], self._lengths[seq_id]
            slots.append([table[p // size] * size + p % size for p in range(start, start + t_new)])
        return np.array(slots, dtype=np.int64).reshape(len(seq_ids), t_new)


def paged_attention(q, cache, seq_ids, *, causal=False, check_finite=True, layer=0):
    """Attention of ``q: [N, T_q, D_k]`` (row i of sequence ``seq_ids[i]``) over each sequence's keys in the pool.

    Returns ``[N, T_q, D_v]``, equal up to rounding to :func:`~kv_attention.attention.attend`
    over each sequence's stored keys; a sequence with none gives zeros. With ``num_kv_heads``,
    ``q: [N, H_q, T_q, D_k]`` -> ``[N, H_q, T_q, D_v]``, query head h reading K/V head
    ``h // (H_q / H_kv)``; a group's query heads are rows against one read of its K/V head,
    as vLLM's and FlashInfer's GQA decode kernels do. ``causal=True``: the queries are each
    sequence's last T_q positions, already written (a chunk), and query i attends to the keys
    before position ``length - T_q + i + 1``: the causal diagonal aligned bottom-right, as
    vLLM's prefill (FlashAttention's ``causal``) aligns it. ``check_finite`` scans ``q``; the
    pool's keys and values were scanned when they were written. ``layer``: whose pools to read.

    What is copied: each sequence's blocks, once, through its block table (``k_cache[table]``
    copies them, as a GPU kernel loads a block into shared memory before attending to it): the
    stored tokens, and the empty slots of each last block (at most ``block_size - 1`` a
    sequence). No block table is padded to another's length. Sequences of one length are
    gathered and attended together, in one call.
    """
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    lengths = cache.get_seq_lengths(seq_ids)  # [N]; checks every id
    seq_ids = as_id_list(seq_ids)
    causal, layer = as_flag("causal", causal), cache._check_layer(layer)
    q = (as_float_array if as_flag("check_finite", check_finite) else as_array)("q", q)
    n, d_k, h_kv = len(lengths), cache.k_cache.shape[-1], cache.num_kv_heads
    if h_kv is None:
        if q.ndim != 3 or q.shape[0] != n or q.shape[2] != d_k:
            raise ValueError(f"q must be [N={n}, T_q, D_k={d_k}], got shape {q.shape}")
        q_rows = q[:, None, :, None, :]  # [N, 1, T_q, 1, D_k]
    else:
        if q.ndim != 4 or q.shape[0] != n or q.shape[1] % h_kv or q.shape[3] != d_k:
            raise ValueError(f"q must be [N={n}, H_q, T_q, D_k={d_k}] with H_q a multiple of num_kv_heads={h_kv}, "
                             f"got shape {q.shape}")
        q_rows = q.reshape(n, h_kv, q.shape[1] // h_kv, *q.shape[2:]).swapaxes(2, 3)  # [N, H_kv, T_q, G, D_k]
    t_q, size = q_rows.shape[2], cache.block_size
    out = np.zeros(q_rows.shape[:-1] + cache.v_cache.shape[-1:], np.result_type(q, cache.v_cache))  # [..., G, D_v]
    groups = {}  # length -> the rows of the sequences holding that many tokens
    for i, length in enumerate(lengths.tolist()):
        if length:
            groups.setdefault(length, []).append(i)
    for length, rows in groups.items():
        tables = np.array([cache._block_tables[seq_ids[i]][: -(-length // size)] for i in rows])  # [n_g, blocks]
        k, v = (_gather(pool, tables, length).astype(out.dtype, copy=False)
                for pool in (cache.k_caches[layer], cache.v_caches[layer]))  # [n_g, H_kv, 1, S, D]
        mask = None  # a decode, or a chunk of T_q: query i sees the keys before length - T_q + i + 1
        if causal and t_q > 1:
            mask = (np.arange(length) < length - t_q + 1 + np.arange(t_q)[:, None])[:, None]  # [T_q, 1, S]
        out[rows] = attention_forward(q_rows[rows].astype(out.dtype, copy=False), k, v, mask)  # [n_g, H_kv, T_q, G, D]
    if h_kv is None:
        return out[:, 0, :, 0]  # [N, T_q, D_v]
    return out.swapaxes(2, 3).reshape(q.shape[:-1] + out.shape[-1:])  # [N, H_q, T_q, D_v]


def _gather(pool, tables, length):
    """The first ``length`` tokens through ``tables [n, blocks]``: ``pool[tables]`` copies each block once, and the
    tokens are its ``[n, H_kv, 1, S = length, D]`` view."""
    blocks = pool[tables]  # [n, blocks, block_size, (H_kv,) D]
    tokens = blocks.reshape(len(tables), blocks.shape[1] * blocks.shape[2], *pool.shape[2:])[:, :length]  # D may be 0
    if tokens.ndim == 3:
        return tokens[:, None, None]  # [n, 1, 1, S, D]
    return tokens.swapaxes(1, 2)[:, :, None]  # [n, H_kv, 1, S, D]


class PagedCacheView:
    """A paged cache bound to the sequences of a batch: one object of every layer, answering the model through
    :class:`~kv_attention.Cache`'s interface. ``cache``: a :class:`PagedKVCache` with ``num_kv_heads`` and one layer
    per model layer; ``seq_ids``: row i of the batch is ``seq_ids[i]``; ``token_ids``: ``[N, T_new]`` for prefix
    caching. A call reserves the blocks of every token it may write (:meth:`snapshot`: vLLM's ``allocate_slots``);
    layer 0's :meth:`attend` takes the slots of its T_new tokens for every layer (one ``slot_mapping`` a step), each
    layer writes its k/v there and attends through the same block tables; :meth:`commit` caches the blocks filled.
    """

    can_crop = True

    def __init__(self, cache, seq_ids, token_ids=None):
        if not isinstance(cache, PagedKVCache) or cache.num_kv_heads is None:
            raise TypeError(f"cache must be a PagedKVCache with num_kv_heads, got {cache!r:.100}")
        self.cache, self.seq_ids, self.token_ids = cache, as_id_list(seq_ids), token_ids
        self._slot_mapping = self._open = None  # the call's slots; [lengths, t_new, checkpoint] of its snapshot
        cache.get_seq_lengths(self.seq_ids)  # checks every id

    def get_seq_length(self):
        """Tokens stored for each sequence: ``[N]`` int64."""
        return self.cache.get_seq_lengths(self.seq_ids)

    @property
    def nbytes(self):
        return self.cache.nbytes

    @property
    def nbytes_reserved(self):
        return sum(a.nbytes for a in self.cache.k_caches + self.cache.v_caches)

    def check_update(self, num_layers, batch_shape, k_dim, v_dim, dtype, t_new, input_ids=None):
        """As :meth:`Cache.check_update`; the room of the pool is reserved by :meth:`snapshot`."""
        pool = self.cache
        self.get_seq_length()  # a sequence freed since the view was made: ValueError
        if pool.num_layers != num_layers:
            raise ValueError(f"cache must serve num_hidden_layers={num_layers} layers, got a PagedCacheView of "
                             f"{pool.num_layers} layers")
        if self.token_ids is not None and (t_new > input_ids.shape[1] or not np.array_equal(self.token_ids, input_ids)):
            raise ValueError(f"cache.token_ids must be input_ids, the tokens written (prefix caching keys blocks by "
                             f"them; a generate of more than one token takes none), got {self.token_ids!r:.100}")
        layout = ((len(self.seq_ids), pool.num_kv_heads), pool.k_cache.shape[-1], pool.v_cache.shape[-1])
        if layout != (batch_shape, k_dim, v_dim):
            raise ValueError(f"cache holds batch shape, k, v widths {layout}; needed {(batch_shape, k_dim, v_dim)}")
        if not np.can_cast(dtype, compute_dtype(pool.k_cache.dtype), casting="safe"):
            raise TypeError(f"cache stores {pool.k_cache.dtype}, which cannot hold the model's {dtype} keys and values")

    def attend(self, q, k, v, layer_idx=0):
        """Write ``k``, ``v`` ``[N, H_kv, T, D]`` at layer ``layer_idx``'s slots and attend ``q [N, H, T, D]`` causally
        over each sequence's tokens (:func:`paged_attention`): ``[N, H, T, D_v]``. Layer 0 takes the slots."""
        if layer_idx == 0:
            self._slot_mapping = self.cache.append_slots(self.seq_ids, k.shape[2], self.token_ids)
        self.cache.write_slots(layer_idx, self._slot_mapping, k.swapaxes(1, 2), v.swapaxes(1, 2))
        return paged_attention(q, self.cache, self.seq_ids, causal=True, check_finite=False, layer=layer_idx)

    def snapshot(self, t_new):
        """Reserve the blocks of ``t_new`` more tokens of each sequence (:class:`OutOfBlocksError`, nothing changed,
        if they are not free) after :meth:`PagedKVCache.checkpoint`: the blocks the call may take, not the pool."""
        checkpoint = self.cache.checkpoint(self.seq_ids, t_new)
        try:
            for seq_id in self.seq_ids:
                self.cache.allocate_slots(seq_id, t_new)
        except BaseException:
            self.cache.restore(checkpoint)
            raise
        self._open = [self.get_seq_length(), t_new, checkpoint]
        return self._open

    def restore(self, snapshot):
        """The pool as at :meth:`snapshot` (:meth:`PagedKVCache.restore`)."""
        self._open = None
        self.cache.restore(snapshot[2])

    def commit(self):
        """With prefix caching, cache the blocks the call filled (V1's ``cache_full_blocks``)."""
        self._open = None
        self.cache.cache_full_blocks(self.seq_ids)

    def crop(self, lengths):
        """Keep the first ``lengths[i]`` tokens of each sequence (one int: of every one), all checked first
        (:meth:`PagedKVCache.crop`). Inside a call, to no fewer tokens than it began with: the pool is put back as at
        its snapshot and the tokens kept written again, O(the call's tokens), so that its restore stays exact."""
        n = len(self.seq_ids)
        lengths = as_sizes_per_sequence("lengths", np.broadcast_to(lengths, n) if np.ndim(lengths) == 0 else lengths, n)
        for length, held in zip(lengths, self.get_seq_length()):
            check_crop(length, held)
        if self._open is None:
            for seq_id, length in zip(self.seq_ids, lengths.tolist()):
                self.cache.crop(seq_id, length)
            return
        pool, (start, t_new, checkpoint), size = self.cache, self._open, self.cache.block_size
        if (lengths < start).any():
            raise ValueError(f"lengths must keep the {start.tolist()} tokens held before the call, got "
                             f"{lengths.tolist()}")
        slots = [np.array(pool.block_table(s), np.int64)[p // size] * size + p % size  # the tokens since the call
                 for s, p in zip(self.seq_ids, map(np.arange, start, lengths))]
        kept = [[[x.reshape(-1, *x.shape[2:])[i].astype(compute_dtype(x.dtype)) for x in kv]
                 for kv in zip(pool.k_caches, pool.v_caches)] for i in slots]  # per sequence and layer: k, v
        pool.restore(checkpoint)
        self._open[2] = pool.checkpoint(self.seq_ids, t_new)
        for seq_id, i, layers in zip(self.seq_ids, slots, kept):
            slot_mapping = pool.append_slots([seq_id], len(i))
            for layer, (k, v) in enumerate(layers):
                pool.write_slots(layer, slot_mapping, k[None], v[None])
