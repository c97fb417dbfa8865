"""A paged K/V cache: fixed-size blocks from a shared pool, one block table per sequence, and paged attention.

PagedAttention (Kwon et al. 2023, vLLM), in vLLM's terms (``block_size``, ``num_blocks``, ``block_table``,
``slot_mapping = physical_block * block_size + offset``, refcounts), split as vLLM V1 splits it:
:class:`KVCacheManager` keeps the block tables, lengths and prefix-cache hashes and gives the slot_mapping
(``vllm/v1/core/kv_cache_manager.py``, ``single_type_kv_cache_manager.py``, ``vllm/v1/worker/block_table.py``); its
:class:`~kv_attention.block_allocator.BlockPool` the blocks, free queue and refcounts; :class:`PagedKVCache` the
per-layer K/V (the runner's ``kv_caches``, written by ``reshape_and_cache``). A fork shares the parent's blocks and the
first write into a shared last block copies it (V0's ``blocks_to_copy``: V1 has no fork).

:func:`paged_attention` reads each sequence's blocks once a step through its block table (``k_cache[table]`` copies
them, as vLLM's kernel, ``csrc/attention/attention_kernels.cuh``, loads a block into shared memory; no table is padded
to the longest), one softmax per sequence, sequences of one length in one call.

Errors: TypeError or ValueError naming the argument, :class:`OutOfBlocksError` when an update needs more blocks than
are free; every check runs before anything is written, so a call that raises changes nothing.
:meth:`PagedKVCache.checkpoint`/:meth:`~PagedKVCache.restore` undo the calls that succeeded since.
"""

import math
import weakref

import numpy as np

from ._validation import (as_array, as_flag, as_float_array, as_float_dtype, as_integer_array, as_size,
                          as_sizes_per_sequence, as_stored, compute_dtype)
from .attention import attention_forward
from .block_allocator import BlockPool, OutOfBlocksError, hash_block_tokens
from .cache import check_crop


def as_id_list(seq_ids):
    """``seq_ids`` as a list; TypeError unless it is an ordered sequence (list, tuple, array, range)."""
    if not isinstance(seq_ids, (list, tuple, np.ndarray, range)):
        raise TypeError(f"seq_ids must be a list, tuple or array of sequence ids (ordered: row i is seq_ids[i]), "
                        f"got {type(seq_ids).__name__} {seq_ids!r}")
    return list(seq_ids)


def as_token_ids(name, token_ids):
    """``token_ids`` as a 1-D int64 array; TypeError unless integers, ValueError unless 1-D."""
    array = as_integer_array(name, token_ids)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {array.shape}")
    return array


class BlockTables:
    """Each sequence's block table, length, and with prefix caching its token ids and block hashes (V1's
    ``SingleTypeKVCacheManager``: ``req_to_blocks``, ``num_cached_block``), and each change's undo (:attr:`journal`)."""

    def __init__(self, block_size, journal):
        self.block_size, self.journal = as_size("block_size", block_size, minimum=1), journal
        self._block_tables = {}  # seq_id -> [physical block, ...]
        self._lengths = {}  # seq_id -> tokens stored
        self._token_ids = {}  # prefix caching: seq_id -> its token ids, or None once a write had none
        self._block_hashes = {}  # prefix caching: seq_id -> hashes of its full blocks
        self._num_cached = {}  # prefix caching: seq_id -> its first blocks that are cached (V1's num_cached_block)

    seq_ids = property(lambda self: tuple(self._block_tables), doc="The sequences held, in the order added (tuple).")

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

    @property
    def slots_used(self):
        """Token slots holding a token, a shared block's once: the sum of the lengths without sharing (int)."""
        filled = {}  # block -> tokens in it; sharers of a block agree, since a write into a shared block copies it
        for seq_id, table in self._block_tables.items():
            length = self._lengths[seq_id]
            for j in range(self._blocks_for(length)):
                filled[table[j]] = min(self.block_size, length - j * self.block_size)
        return sum(filled.values())

    def _check_known(self, seq_ids, known=True):
        """Raise unless every one of ``seq_ids`` is hashable and in the cache (``known``), or not in it."""
        for seq_id in seq_ids:
            try:
                held = seq_id in self._block_tables
            except TypeError:
                raise TypeError(f"a sequence id must be hashable, got {seq_id!r}") from None
            if held != known:
                raise ValueError(f"sequence {seq_id!r} is not in the cache; known: {list(self._block_tables)}" if known
                                 else f"sequence {seq_id!r} is already in the cache")

    def _blocks_for(self, length):
        return math.ceil(length / self.block_size)

    def _remember(self, seq_id):
        """Record how to take back what appending to ``seq_id`` changes: its table, token ids and hashes only grow,
        and a copy-on-write replaces its last block."""
        if self.journal.recording:
            table, length, tokens = self._block_tables[seq_id], self._lengths[seq_id], self._token_ids.get(seq_id)
            last = length // self.block_size if length % self.block_size else None
            self.journal.record(self._truncate, seq_id, len(table), last, None if last is None else table[last], length,
                                None if tokens is None else len(tokens), len(self._block_hashes.get(seq_id, ())),
                                self._num_cached.get(seq_id))

    def _truncate(self, seq_id, n_blocks, last, last_block, length, n_tokens, n_hashes, num_cached):
        table = self._block_tables[seq_id]
        del table[n_blocks:]
        if last is not None:
            table[last] = last_block
        self._lengths[seq_id] = length
        if seq_id in self._block_hashes:  # prefix caching
            if n_tokens is not None:
                del self._token_ids[seq_id][n_tokens:]
            del self._block_hashes[seq_id][n_hashes:]
            self._num_cached[seq_id] = num_cached

    def _uncrop(self, seq_id, length, num_cached, blocks, tokens, hashes):
        self._block_tables[seq_id].extend(blocks)
        self._lengths[seq_id] = length
        if seq_id in self._block_hashes:  # prefix caching
            if tokens is not None:
                self._token_ids[seq_id].extend(tokens)
            self._block_hashes[seq_id].extend(hashes)
            self._num_cached[seq_id] = num_cached

    _states = property(lambda self: (self._block_tables, self._lengths, self._token_ids, self._block_hashes,
                                     self._num_cached))

    def _forget(self, seq_id):
        """Drop ``seq_id``'s state (its blocks already given back): the state, for :meth:`_unforget`."""
        return [state.pop(seq_id) for state in self._states if seq_id in state]

    def _unforget(self, seq_id, index, values):
        """Put ``seq_id``'s state back at ``index`` of each dict, so that :attr:`seq_ids` keeps its order."""
        for state, value in zip(self._states, values):
            items = list(state.items())
            items.insert(index, (seq_id, value))
            state.clear()
            state.update(items)


class KVCacheManager(BlockTables):
    """The scheduler's side of a paged cache (V1's ``KVCacheManager``) over a :class:`BlockPool`: which blocks and
    slots each token takes, never K/V. ``copy_block(src, dst)`` runs for each copy-on-write, ``on_take(block)`` for
    each block taken while a checkpoint lives."""

    def __init__(self, num_blocks, block_size, enable_prefix_caching=False, copy_block=None, on_take=None):
        enable_prefix_caching = as_flag("enable_prefix_caching", enable_prefix_caching)
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching, on_take=on_take)
        super().__init__(block_size, self.block_pool.journal)
        self.copy_block, self._peak_blocks = copy_block, 0

    num_blocks = property(lambda self: self.block_pool.num_blocks, doc="Physical blocks in the pool (int).")
    num_free_blocks = property(lambda self: self.block_pool.num_free_blocks,
                               doc="Blocks that can be taken (int): cached ones that no sequence holds included.")
    blocks_in_use = property(lambda self: self.num_blocks - self.num_free_blocks,
                             doc="Blocks held by some sequence, a shared block once (int).")
    peak_blocks = property(lambda self: self._peak_blocks, doc="The most blocks in use at once (int).")
    enable_prefix_caching = property(lambda self: self.block_pool.enable_caching,
                                     doc="Whether full blocks are cached by the hash of their tokens (bool).")

    def add_sequence(self, seq_id, token_ids=None):
        """Start sequence ``seq_id`` (any hashable); returns the tokens it starts with.

        With prefix caching and ``token_ids``, it holds the longest run of cached full
        blocks of ``token_ids`` (a hit, V1's ``get_computed_blocks``) and returns their tokens; else 0.
        """
        self._check_known([seq_id], known=False)
        token_ids = None if token_ids is None else as_token_ids("token_ids", token_ids)
        blocks, hashes = self._cached_prefix(token_ids)
        self.block_pool.share(blocks)
        self.journal.record(self._forget, seq_id)
        self._block_tables[seq_id], self._lengths[seq_id] = blocks, len(blocks) * self.block_size
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
        self._check_known([child_id], known=False)
        blocks = self._block_tables[parent_id][: self._blocks_for(self._lengths[parent_id])]
        self.block_pool.share(blocks)
        self.journal.record(self._forget, child_id)
        self._block_tables[child_id], self._lengths[child_id] = list(blocks), self._lengths[parent_id]
        if self.enable_prefix_caching:
            tokens = self._token_ids[parent_id]
            self._token_ids[child_id] = None if tokens is None else list(tokens)
            self._block_hashes[child_id] = list(self._block_hashes[parent_id])
            self._num_cached[child_id] = self._num_cached[parent_id]

    def free(self, seq_id):
        """Remove ``seq_id``; the blocks no sequence holds go back on the free queue, its last block first (a cached
        one stays findable until taken)."""
        self._check_known([seq_id])
        self.block_pool.free(self._block_tables[seq_id][::-1])  # tail first, as V1's free
        index = list(self._block_tables).index(seq_id) if self.journal.recording else None
        state = self._forget(seq_id)
        self.journal.record(self._unforget, seq_id, index, state)

    def ref_count(self, block):
        """Block tables holding physical block ``block`` (int; 0 for a free or only cached block)."""
        return self.block_pool.ref_count(block)

    def allocate_slots(self, seq_id, num_tokens):
        """Reserve blocks for ``num_tokens`` more tokens of ``seq_id`` (V1's ``allocate_slots``), all or nothing
        (:class:`OutOfBlocksError`); returns how many."""
        self._check_known([seq_id])
        needed = self._take_blocks([seq_id], as_size("num_tokens", num_tokens))
        self._note_peak()
        return needed

    def append_slots(self, seq_ids, num_new_tokens, token_ids=None):
        """Give each of ``seq_ids`` ``num_new_tokens`` more tokens, stored at once in every layer: their
        ``slot_mapping [N, T_new]`` int64 (V1's ``allocate_slots`` and ``compute_slot_mapping``). With prefix caching,
        ``token_ids [N, T_new]`` hash each block they fill (none: caching ends for those sequences)."""
        seq_ids = as_id_list(seq_ids)
        self._check_known(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids repeats a sequence: {seq_ids}")
        t_new = as_size("num_new_tokens", num_new_tokens)
        if token_ids is not None:
            token_ids = as_integer_array("token_ids", token_ids)
            if token_ids.shape != (len(seq_ids), t_new):
                raise ValueError(f"token_ids must be [N, T_new] = [{len(seq_ids)}, {t_new}], one per new position, "
                                 f"got shape {token_ids.shape}")
        self._take_blocks(seq_ids, t_new)
        size, slots = self.block_size, []
        for i, seq_id in enumerate(seq_ids):
            table, start = self._block_tables[seq_id], self._lengths[seq_id]
            slots.append([table[p // size] * size + p % size for p in range(start, start + t_new)])
            self._lengths[seq_id] += t_new
            if self.enable_prefix_caching and t_new:  # an empty write changes nothing, caching included
                self._record_tokens(seq_id, None if token_ids is None else token_ids[i])
        self._note_peak()
        return np.array(slots, dtype=np.int64).reshape(len(seq_ids), t_new)

    def crop(self, seq_id, length):
        """Keep the first ``length`` tokens of ``seq_id``; its blocks past them are freed, tail first. A cached block
        is never written again: a write after a crop inside it copies it first."""
        self._check_known([seq_id])
        length = check_crop(length, self._lengths[seq_id])
        table, full, kept = self._block_tables[seq_id], length // self.block_size, self._blocks_for(length)
        if kept > full and self.journal.recording and self.block_pool.on_take is not None:
            self.block_pool.on_take(table[full])  # its slots past length may be written over, as a taken block's
        self.block_pool.free(table[kept:][::-1])
        tokens, hashes = self._token_ids.get(seq_id), self._block_hashes.get(seq_id, [])
        self.journal.record(self._uncrop, seq_id, self._lengths[seq_id], self._num_cached.get(seq_id), table[kept:],
                            None if tokens is None else tokens[length:], hashes[full:])
        del table[kept:]
        self._lengths[seq_id] = length
        if self.enable_prefix_caching:
            del hashes[full:]
            self._num_cached[seq_id] = min(self._num_cached[seq_id], full)
            if tokens is not None:
                del tokens[length:]

    def cache_full_blocks(self, seq_ids):
        """With prefix caching, cache the full blocks of ``seq_ids`` not cached yet (V1's ``cache_full_blocks``)."""
        seq_ids = as_id_list(seq_ids)
        self._check_known(seq_ids)
        for seq_id in seq_ids if self.enable_prefix_caching else ():
            table, hashes = self._block_tables[seq_id], self._block_hashes[seq_id]
            self._remember(seq_id)
            for j in range(self._num_cached[seq_id], len(hashes)):
                if not self.block_pool.is_cached(table[j]):  # a sharer cached it already (a fork)
                    self.block_pool.cache(table[j], hashes[j])
            self._num_cached[seq_id] = len(hashes)

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
        holders = {block: self.block_pool.ref_count(block) for block in writers}
        return new + sum(m if self.block_pool.is_cached(b) else m - (m == holders[b]) for b, m in writers.items()
                         if holders[b] > 1 or self.block_pool.is_cached(b))

    def _take_blocks(self, seq_ids, t_new):
        """Take the blocks of :meth:`_blocks_needed`, all or none: copy each shared or cached last block that a write
        goes into (a cached block is immutable: another sequence may find it), then extend each table."""
        needed = self._blocks_needed(seq_ids, t_new)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"out of blocks: {len(seq_ids)} sequence(s) need {needed} new block(s) of "
                                   f"block_size={self.block_size}, {self.num_free_blocks} of "
                                   f"num_blocks={self.num_blocks} free")
        for seq_id in seq_ids:
            self._remember(seq_id)
            table, length = self._block_tables[seq_id], self._lengths[seq_id]
            last = table[length // self.block_size] if length % self.block_size else None
            if t_new and last is not None and (self.ref_count(last) > 1 or self.block_pool.is_cached(last)):
                (fresh,) = self.block_pool.allocate(1)
                self.copy_block(last, fresh)
                self.block_pool.free([last])  # the other holders keep it (a cached one stays findable)
                table[length // self.block_size] = fresh
            new = self._blocks_for(length + t_new) - len(table)
            if new > 0:
                table.extend(self.block_pool.allocate(new))
                assert all(self.ref_count(b) == 1 for b in table[-new:]), "a new block table entry is not held"
        return needed

    def _note_peak(self):
        if self.blocks_in_use > self._peak_blocks:
            self.journal.record(setattr, self, "_peak_blocks", self._peak_blocks)
            self._peak_blocks = self.blocks_in_use

    def _cached_prefix(self, token_ids):
        """The longest run of cached full blocks that starts ``token_ids``: ``(blocks, their hashes)``."""
        blocks, hashes = [], []
        if token_ids is None or not self.enable_prefix_caching:
            return blocks, hashes
        size = self.block_size
        for j in range(len(token_ids) // size):
            block_hash = hash_block_tokens(hashes[-1] if hashes else None, token_ids[j * size : (j + 1) * size])
            block = self.block_pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
        return blocks, hashes

    def _record_tokens(self, seq_id, token_ids):
        """Record ``seq_id``'s new token ids and hash each block they complete (cached by :meth:`cache_full_blocks`)."""
        tokens, hashes, size = self._token_ids[seq_id], self._block_hashes[seq_id], self.block_size
        if tokens is None or token_ids is None:  # a write without ids ends the sequence's caching
            self.journal.record(self._token_ids.__setitem__, seq_id, tokens)
            self._token_ids[seq_id] = None
            return
        tokens.extend(token_ids.tolist())
        while len(tokens) >= (len(hashes) + 1) * size:
            j = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens[j * size : (j + 1) * size]))


class PagedKVCache:
    """K/V of many sequences: per layer, pools ``k_caches[layer]: [num_blocks, block_size, (H_kv,) D_k]`` and
    ``v_caches[layer]: [..., D_v]`` (``k_cache``: layer 0's), read through one block table per sequence
    (:attr:`manager`, a :class:`KVCacheManager`, whose members are the cache's). With ``num_kv_heads``, vLLM's "NHD"
    layer pool (``FlashAttentionBackend.get_kv_cache_shape``). Tokens never move once written.
    """

    def __init__(self, num_blocks, block_size, k_dim, v_dim, dtype=np.float64, *, enable_prefix_caching=False,
                 num_kv_heads=None, num_layers=1):
        num_blocks = as_size("num_blocks", num_blocks)
        k_dim, v_dim = as_size("k_dim", k_dim, minimum=1), as_size("v_dim", v_dim)  # the library's rule for widths
        self.manager = KVCacheManager(num_blocks, block_size, enable_prefix_caching, self._copy_block,
                                      self._save_block)
        self._saved = weakref.WeakKeyDictionary()  # checkpoint -> the blocks whose K/V it recorded
        dtype = as_float_dtype(dtype, storage=True)  # bfloat16/float16 as cache.py's caches
        heads = () if num_kv_heads is None else (as_size("num_kv_heads", num_kv_heads, minimum=1),)
        num_layers = as_size("num_layers", num_layers, minimum=1)
        shape = (num_blocks, self.manager.block_size, *heads)
        self.k_caches = [np.zeros((*shape, k_dim), dtype) for _ in range(num_layers)]
        self.v_caches = [np.zeros((*shape, v_dim), dtype) for _ in range(num_layers)]

    def __getattr__(self, name):
        """The manager's member ``name``; a method or a fixed size is kept on the cache, found directly next time."""
        if name == "manager":  # not set yet (unpickling, a failed __init__)
            raise AttributeError(name)
        value = getattr(self.manager, name)
        if callable(value) or name in ("block_size", "num_blocks", "enable_prefix_caching"):
            self.__dict__[name] = value
        return value

    def __repr__(self):
        return (f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"k_dim={self.k_cache.shape[-1]}, v_dim={self.v_cache.shape[-1]}, dtype={self.k_cache.dtype}, "
                f"{'' if self.num_kv_heads is None else f'num_kv_heads={self.num_kv_heads}, '}"
                f"{'' if self.num_layers == 1 else f'num_layers={self.num_layers}, '}"
                f"blocks_in_use={self.blocks_in_use}, sequences={len(self.seq_ids)})")

    k_cache = property(lambda self: self.k_caches[0], doc="Layer 0's key pool ``[num_blocks, block_size, (H_kv,) D_k]``.")
    v_cache = property(lambda self: self.v_caches[0], doc="Layer 0's value pool ``[num_blocks, block_size, (H_kv,) D_v]``.")
    num_layers = property(lambda self: len(self.k_caches), doc="Layers whose K/V the pool holds (int).")
    num_kv_heads = property(lambda self: self.k_cache.shape[2] if self.k_cache.ndim == 4 else None,
                            doc="K/V heads of each token (int), or None for a pool of one head without the axis.")

    @property
    def nbytes(self):
        """Logical size of the stored keys and values, in bytes (int); not the pool's size."""
        layer_bytes = self.k_cache.nbytes + self.v_cache.nbytes
        return self.num_layers * layer_bytes // max(self.num_blocks * self.block_size, 1) * self.slots_used

    def update(self, seq_ids, k, v, token_ids=None):
        """Append ``k: [N, T_new, (H_kv,) D_k]``, ``v: [N, T_new, (H_kv,) D_v]``, row i to sequence ``seq_ids[i]``, in
        a pool of one layer (else ``append_slots``, :meth:`write_slots` per layer, ``cache_full_blocks``); returns the
        slot_mapping. ``token_ids: [N, T_new]`` name the new tokens (:meth:`KVCacheManager.append_slots`)."""
        if self.num_layers != 1:
            raise ValueError(f"update writes a pool of one layer, this one has num_layers={self.num_layers}: "
                             f"append_slots, then write_slots for each layer, then cache_full_blocks")
        seq_ids = as_id_list(seq_ids)
        k, v = self._check_positions(k, v, len(seq_ids))
        slot_mapping = self.append_slots(seq_ids, k.shape[1], token_ids)
        self._write(0, slot_mapping, k, v)
        self.cache_full_blocks(seq_ids)
        return slot_mapping

    def write_slots(self, layer, slot_mapping, k, v):
        """Write layer ``layer``'s ``k: [N, T_new, (H_kv,) D_k]``, ``v: [N, T_new, (H_kv,) D_v]`` at the
        ``slot_mapping [N, T_new]`` that ``append_slots`` gave (vLLM's ``reshape_and_cache``)."""
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

    def checkpoint(self):
        """A point to :meth:`restore` the cache to; costs what the calls after it touch
        (:class:`~kv_attention.block_allocator.Journal`), not the pool's size."""
        return self.journal.checkpoint()

    def restore(self, checkpoint):
        """Undo every change since ``checkpoint``: lengths, block tables, the K/V of the blocks taken or cropped into,
        the free queue's order, refcounts, prefix-cache hashes and the peak, exactly as they were."""
        self.journal.restore(checkpoint)
        self._saved.clear()  # the records undone: a block taken next is recorded again

    def gather(self, seq_ids, layer=0):
        """Layer ``layer``'s copies ``(k [N, S, (H_kv,) D_k], v [N, S, (H_kv,) D_v], lengths [N])`` of ``seq_ids``:
        row i holds ``seq_ids[i]``'s tokens below ``lengths[i]``, then slots of its own last block (mask them)."""
        seq_ids = as_id_list(seq_ids)
        lengths = self.get_seq_lengths(seq_ids)  # checks every id
        layer = self._check_layer(layer)
        tables = [self.manager._block_tables[s][: -(-n // self.block_size)] for s, n in zip(seq_ids, lengths.tolist())]
        width = max((len(t) for t in tables), default=0)
        # Pad each table with its own last block, so that no row reads another sequence's block.
        held = [t + t[-1:] * (width - len(t)) for t in tables if t]
        index = np.array(held, dtype=np.int64).reshape(len(held), width)  # [N_held, blocks]
        out = []
        for pool in (self.k_caches[layer], self.v_caches[layer]):
            gathered = pool[index].reshape(len(index), width * self.block_size, *pool.shape[2:])  # [N_held, S, D]
            out.append(np.zeros((len(seq_ids),) + gathered.shape[1:], dtype=pool.dtype))  # zero rows: no block held
            out[-1][[bool(t) for t in tables]] = gathered
        return out[0], out[1], lengths

    def _copy_block(self, src, dst):
        for pool in self.k_caches + self.v_caches:  # every layer's
            pool[dst] = pool[src]

    def _save_block(self, block):
        """Before a block is taken and written over: record its K/V, to be put back by a restore; once for the newest
        checkpoint (a restore puts back the first record, so a serve keeps at most a copy of the pool, not one a take)."""
        saved = self._saved.setdefault(max(self.journal._live, key=lambda c: c.mark), set())
        if block not in saved:
            saved.add(block)
            self.journal.record(self._put_block, block, [pool[block].copy() for pool in self.k_caches + self.v_caches])

    def _put_block(self, block, saved):
        for pool, contents in zip(self.k_caches + self.v_caches, saved):
            pool[block] = contents

    def _write(self, layer, slot_mapping, k, v):
        slots, new = self.num_blocks * self.block_size, slot_mapping.size  # explicit: reshape(-1, 0) is ambiguous
        self.k_caches[layer].reshape(slots, *k.shape[2:])[slot_mapping.ravel()] = k.reshape(new, *k.shape[2:])
        self.v_caches[layer].reshape(slots, *v.shape[2:])[slot_mapping.ravel()] = v.reshape(new, *v.shape[2:])

    def _check_layer(self, layer):
        layer = as_size("layer", layer)
        if layer >= self.num_layers:
            raise ValueError(f"layer={layer} is not a layer of the pool: num_layers={self.num_layers}")
        return layer

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


def check_cache_fits(cache, k_dim, v_dim, dtype, num_kv_heads=None, num_layers=1, **options):
    """Raise unless ``cache`` is a :class:`PagedKVCache` for k/v of these widths, heads, layers and ``dtype``, and no
    option of a new pool (``block_size=``, ``num_blocks=``...) is given beside it: a caller's cache brings its own."""
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    given = [f"{name}={value!r}" for name, value in options.items() if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} was given with a cache, whose pool has its own")
    held = (cache.k_cache.shape[-1], cache.v_cache.shape[-1], cache.num_kv_heads, cache.num_layers)
    if held != (k_dim, v_dim, num_kv_heads, num_layers):
        raise ValueError(f"cache does not fit: it holds (D_k, D_v, num_kv_heads, num_layers) {held}, the computation "
                         f"needs {(k_dim, v_dim, num_kv_heads, num_layers)}")
    if cache.k_cache.dtype != dtype:
        raise TypeError(f"cache holds {cache.k_cache.dtype} but the computation is {dtype}")


def paged_attention(q, cache, seq_ids, *, causal=False, check_finite=True, layer=0):
    """Attention of ``q: [N, T_q, D_k]`` (row i of sequence ``seq_ids[i]``) over each sequence's keys in the pool.

    Returns ``[N, T_q, D_v]``, equal up to rounding to :func:`~kv_attention.attention.attend` over each sequence's
    stored keys (zeros for none). With ``num_kv_heads``, ``q: [N, H_q, T_q, D_k]`` -> ``[N, H_q, T_q, D_v]``, a group's
    query heads as rows against one read of its K/V head (vLLM's GQA decode). ``causal=True``: the queries are each
    sequence's last T_q positions, already written, the causal diagonal aligned bottom-right (FlashAttention's
    ``causal``). ``check_finite`` scans ``q`` (the pool was scanned when written). ``layer``: whose pools to read.
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
    block_tables, groups = cache.manager._block_tables, {}  # length -> the rows of the sequences holding that many tokens
    for i, length in enumerate(lengths.tolist()):
        if length:
            groups.setdefault(length, []).append(i)
    for length, rows in groups.items():
        tables = np.array([block_tables[seq_ids[i]][: -(-length // size)] for i in rows])  # [n_g, blocks]
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
    """A :class:`PagedKVCache` (``num_kv_heads``, one layer per model layer) bound to a batch, row i sequence
    ``seq_ids[i]``, answering the model as a :class:`~kv_attention.Cache`. ``token_ids [N, T_new]``: for prefix
    caching. :meth:`snapshot` reserves the call's blocks (``allocate_slots``); layer 0's :meth:`attend` takes one
    ``slot_mapping`` for every layer; :meth:`commit` caches the blocks filled.
    """

    can_crop = True

    def __init__(self, cache, seq_ids, token_ids=None):
        if not isinstance(cache, PagedKVCache) or cache.num_kv_heads is None:
            raise TypeError(f"cache must be a PagedKVCache with num_kv_heads, got {cache!r:.100}")
        self.cache, self.seq_ids, self.token_ids = cache, as_id_list(seq_ids), token_ids
        self._slot_mapping = None  # the call's slots
        cache.get_seq_lengths(self.seq_ids)  # checks every id

    def get_seq_length(self):
        """Tokens stored for each sequence: ``[N]`` int64."""
        return self.cache.get_seq_lengths(self.seq_ids)

    nbytes = property(lambda self: self.cache.nbytes)
    nbytes_reserved = property(lambda self: sum(a.nbytes for a in self.cache.k_caches + self.cache.v_caches))

    def check_update(self, num_layers, batch_shape, k_dim, v_dim, dtype, t_new, input_ids=None):
        """As :meth:`Cache.check_update`; :meth:`snapshot` reserves the blocks."""
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
        """Checkpoint, then reserve ``t_new`` more tokens' blocks of each sequence (:class:`OutOfBlocksError`)."""
        checkpoint = self.cache.checkpoint()
        try:
            for seq_id in self.seq_ids:
                self.cache.allocate_slots(seq_id, t_new)
        except BaseException:
            self.cache.restore(checkpoint)
            raise
        return checkpoint

    def restore(self, snapshot):
        """The pool as at :meth:`snapshot` (:meth:`PagedKVCache.restore`)."""
        self.cache.restore(snapshot)

    def commit(self):
        """Give back the blocks :meth:`snapshot` reserved for tokens the call did not write (a generate that ended at
        its end token), then, with prefix caching, cache the blocks filled (V1's ``cache_full_blocks``)."""
        pool = self.cache
        for seq_id, length in zip(self.seq_ids, self.get_seq_length().tolist()):
            if len(pool.block_table(seq_id)) > -(-length // pool.block_size):
                pool.crop(seq_id, length)
        pool.cache_full_blocks(self.seq_ids)

    def crop(self, lengths):
        """Keep the first ``lengths[i]`` tokens of each sequence (one int: of every one), all checked first
        (:meth:`PagedKVCache.crop`): it touches the dropped tokens' blocks only, and inside a call its restore undoes
        it (the journal's)."""
        n = len(self.seq_ids)
        lengths = as_sizes_per_sequence("lengths", np.broadcast_to(lengths, n) if np.ndim(lengths) == 0 else lengths, n)
        for length, held in zip(lengths, self.get_seq_length()):
            check_crop(length, held)
        for seq_id, length in zip(self.seq_ids, lengths.tolist()):
            self.cache.crop(seq_id, length)
