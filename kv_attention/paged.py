"""A paged K/V cache: fixed-size blocks from a shared pool, one block table per sequence.

Method: PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention", the vLLM paper). Terms as in vLLM:

    block_size    tokens per block
    num_blocks    physical blocks in the shared pool
    block_table   per sequence: logical block j -> physical block number
    slot_mapping  per new token: its slot, physical_block * block_size + offset
    free list     physical blocks not in any block table

Axis letters: N sequences in one call, S gathered key positions, D feature
width (D_k, D_v), T_new new positions per sequence.

Errors: TypeError for a sequence id that is not hashable, ``seq_ids`` that are
not an ordered sequence (list, tuple, array, range), k and v not both float32 or
both float64 or float64 into a float32 pool, a size that is not an integer or a
dtype other than float32/float64; ValueError for a sequence not in the cache
(or, for ``add_sequence``, already in it), ``seq_ids`` that repeat one, shapes
that do not fit (named in the message), NaN/inf, or a size below its minimum;
:class:`OutOfBlocksError` when an update needs more blocks than are free. On any
error the pool, the free list and every block table are unchanged.
"""

import math

import numpy as np

from ._validation import (
    as_float_dtype,
    as_id_list,
    as_size,
    check_known_ids,
    check_new_id,
    check_paged_positions,
    check_update_ids,
)


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than an update needs; the cache was left unchanged."""


class PagedKVCache:
    """K/V of many sequences in one pool of fixed-size blocks, taken from a free list as they grow.

    A sequence holds whole blocks only: ``ceil(length / block_size)`` of them,
    listed in its block table. Blocks are taken when a sequence's last block is
    full and returned to the free list by :meth:`free`; a freed block is the
    next one taken (a LIFO free list starting from block ``num_blocks - 1``, as
    vLLM's original ``UncachedBlockAllocator``). Tokens never move once written.

    ``num_blocks >= 0``, ``block_size``, ``k_dim`` (D_k) and ``v_dim`` (D_v) >= 1;
    the pools are ``k_cache: [num_blocks, block_size, D_k]`` and ``v_cache:
    [num_blocks, block_size, D_v]``, float32 or float64 (default float64).
    """

    def __init__(self, num_blocks, block_size, k_dim, v_dim, dtype=np.float64):
        num_blocks = as_size("num_blocks", num_blocks)
        k_dim, v_dim = (as_size(name, n, minimum=1) for name, n in (("k_dim", k_dim), ("v_dim", v_dim)))
        block_size = as_size("block_size", block_size, minimum=1)
        dtype = as_float_dtype(dtype)
        self.k_cache = np.zeros((num_blocks, block_size, k_dim), dtype)
        self.v_cache = np.zeros((num_blocks, block_size, v_dim), dtype)
        self._free_blocks = list(range(num_blocks))  # pop() takes from the end
        self._block_tables = {}  # seq_id -> [physical block, ...]
        self._lengths = {}  # seq_id -> tokens stored
        self._peak_blocks = 0

    @property
    def num_blocks(self):
        """Physical blocks in the pool (int)."""
        return self.k_cache.shape[0]

    @property
    def block_size(self):
        """Token slots per block (int)."""
        return self.k_cache.shape[1]

    @property
    def seq_ids(self):
        """The sequences held, in the order they were added (tuple)."""
        return tuple(self._block_tables)

    def add_sequence(self, seq_id):
        """Start an empty sequence ``seq_id`` (any hashable); it takes no block until written."""
        check_new_id(seq_id, self._block_tables)
        self._block_tables[seq_id] = []
        self._lengths[seq_id] = 0

    def free(self, seq_id):
        """Remove sequence ``seq_id`` and return its blocks to the free list (their contents stay)."""
        check_known_ids([seq_id], self._block_tables)
        self._free_blocks.extend(reversed(self._block_tables.pop(seq_id)))
        del self._lengths[seq_id]

    def get_seq_length(self, seq_id):
        """Tokens stored for ``seq_id`` (int)."""
        check_known_ids([seq_id], self._block_tables)
        return self._lengths[seq_id]

    def get_seq_lengths(self, seq_ids):
        """Tokens stored for each of ``seq_ids``: ``[N]`` int64."""
        seq_ids = as_id_list(seq_ids)
        check_known_ids(seq_ids, self._block_tables)
        return np.array([self._lengths[s] for s in seq_ids], dtype=np.int64)

    def block_table(self, seq_id):
        """The physical blocks of ``seq_id``, logical block 0 first (tuple of ints)."""
        check_known_ids([seq_id], self._block_tables)
        return tuple(self._block_tables[seq_id])

    def update(self, seq_ids, k, v):
        """Append ``k: [N, T_new, D_k]``, ``v: [N, T_new, D_v]`` to the N distinct sequences ``seq_ids``.

        Row i goes to ``seq_ids[i]``, taking blocks as needed; the blocks needed are
        counted before any is taken, so either every sequence gets its positions or
        nothing changes. Returns slot_mapping, ``[N, T_new]`` int64: the pool slot
        each new position was written to, ``physical_block * block_size + offset``.
        """
        seq_ids = check_update_ids(seq_ids, self._block_tables)
        k, v = check_paged_positions(k, v, len(seq_ids), self)
        t_new = k.shape[1]
        needed = [self._blocks_for(self._lengths[s] + t_new) - len(self._block_tables[s]) for s in seq_ids]
        if sum(needed) > len(self._free_blocks):
            raise OutOfBlocksError(
                f"out of blocks: {len(seq_ids)} sequence(s) need {sum(needed)} new block(s) of "
                f"block_size={self.block_size}, {len(self._free_blocks)} of num_blocks={self.num_blocks} free"
            )
        for seq_id, n in zip(seq_ids, needed):
            self._block_tables[seq_id].extend(self._free_blocks.pop() for _ in range(n))
        slot_mapping = self._slot_mapping(seq_ids, t_new)  # [N, T_new]
        self.k_cache.reshape(-1, self.k_cache.shape[-1])[slot_mapping.ravel()] = k.reshape(-1, k.shape[-1])
        self.v_cache.reshape(-1, self.v_cache.shape[-1])[slot_mapping.ravel()] = v.reshape(-1, v.shape[-1])
        for seq_id in seq_ids:
            self._lengths[seq_id] += t_new
        self._peak_blocks = max(self._peak_blocks, self.blocks_in_use)
        return slot_mapping

    def gather(self, seq_ids):
        """Keys and values of the N sequences ``seq_ids``, each read through its own block table only.

        Returns ``(k, v, lengths)``: copies ``k: [N, S, D_k]``, ``v: [N, S, D_v]`` and
        ``lengths: [N]`` int64, with S = the most blocks any of them holds ×
        block_size. Row i holds the tokens of ``seq_ids[i]`` at positions
        ``< lengths[i]``, bit for bit as written; past that, the unwritten slots
        of its own last block, then that block repeated (zeros for a sequence with
        no block): mask them.
        """
        seq_ids = as_id_list(seq_ids)
        lengths = self.get_seq_lengths(seq_ids)  # checks every id
        tables = [self._block_tables[s] for s in seq_ids]
        n, width = len(seq_ids), max((len(t) for t in tables), default=0)
        # Pad each table with its own last block, so that no row reads another sequence's block.
        held = [t + t[-1:] * (width - len(t)) for t in tables if t]
        index = np.array(held, dtype=np.int64).reshape(len(held), width)  # [N_held, blocks]
        k = self._gather_pool(self.k_cache, index, tables, n)  # [N, S, D_k]
        v = self._gather_pool(self.v_cache, index, tables, n)  # [N, S, D_v]
        return k, v, lengths

    def _gather_pool(self, pool, index, tables, n):
        """``pool[index]`` as ``[N, S, D]``; zero rows for the sequences that hold no block."""
        gathered = pool[index].reshape(len(index), index.shape[1] * self.block_size, pool.shape[-1])  # [N_held, S, D]
        if len(index) == n:
            return gathered
        out = np.zeros((n,) + gathered.shape[1:], dtype=pool.dtype)  # [N, S, D]
        out[[bool(t) for t in tables]] = gathered
        return out

    @property
    def blocks_in_use(self):
        """Blocks held by some sequence (int)."""
        return self.num_blocks - len(self._free_blocks)

    @property
    def num_free_blocks(self):
        """Blocks on the free list (int)."""
        return len(self._free_blocks)

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
        """Token slots holding a token: the sum of the sequences' lengths (int)."""
        return sum(self._lengths.values())

    @property
    def internal_fragmentation(self):
        """Allocated token slots that hold no token, slots_allocated - slots_used (int).

        At most block_size - 1 per sequence: only a sequence's last block can be partly empty.
        """
        return self.slots_allocated - self.slots_used

    @property
    def nbytes(self):
        """Logical size of the stored keys and values, in bytes (int); not the pool's size."""
        per_slot = (self.k_cache.nbytes + self.v_cache.nbytes) // max(self.num_blocks * self.block_size, 1)
        return per_slot * self.slots_used

    def _blocks_for(self, length):
        return math.ceil(length / self.block_size)

    def _slot_mapping(self, seq_ids, t_new):
        """Slots ``[N, T_new]`` of the next ``t_new`` positions of each sequence (blocks already taken)."""
        size, slots = self.block_size, []
        for seq_id in seq_ids:
            table, start = self._block_tables[seq_id], self._lengths[seq_id]
            slots.append([table[p // size] * size + p % size for p in range(start, start + t_new)])
        return np.array(slots, dtype=np.int64).reshape(len(seq_ids), t_new)
