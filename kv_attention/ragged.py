"""Ragged batches: sequences of different lengths that join and leave the batch at different steps.

Sequence i has T_i tokens and joins at decode step ``start_steps[i]``: at step s, while ``start_steps[i] <= s <
start_steps[i] + T_i``, it decodes its position ``s - start_steps[i]``. Strategies (``strategy=``):
    padded     all B rows every step over a contiguous ``[B, T_max, D]`` cache, the rest masked (static shapes).
    compacted  only the rows in the batch; when sequences leave, each survivor past the new end moves to a hole.
    paged      compacted, with K/V in a :class:`~kv_attention.paged.PagedKVCache`: leaving frees blocks, no token
               moves (:func:`~kv_attention.paged.paged_attention`). A caller's ``cache`` holds sequences 0..B-1 while
               they are in the batch; the peak's blocks are counted first (else OutOfBlocksError, nothing changed).

Inputs: ``x``, a list of B arrays ``[T_i, D_model]`` or a padded ``[B, T_max, D_model]`` (only ``x[b, :T_b]`` is
read), ``w_q, w_k: [D_model, D_k]``, ``w_v: [D_model, D_v]``. Bad input raises TypeError or ValueError naming the
argument before the first step. Continuous batching as in Orca (Yu et al. 2022).
"""

import math
from dataclasses import dataclass

import numpy as np

from ._validation import as_flag, as_float_array, as_size, as_sizes_per_sequence, check_choice
from .attention import attention_forward, check_projection_inputs
from .paged import OutOfBlocksError, PagedKVCache, check_cache_fits, paged_attention

RAGGED_STRATEGIES = ("padded", "compacted", "paged")


@dataclass(frozen=True)
class RaggedDecodeStats:
    """What a ragged decode computed and reserved: steps run, query rows computed (``row_steps``), token slots
    reserved at the peak (B × T_max, or peak blocks × block_size), positions moved by compaction, peak blocks."""

    strategy: str
    steps: int
    row_steps: int
    peak_reserved_slots: int
    moved_slots: int
    peak_blocks: int | None


@dataclass(frozen=True)
class _RaggedBatch:
    """Validated inputs: ``x: [B, T_max + 1, D_model]`` zero past each length, ``lengths``, ``start_steps`` ``[B]``
    int64, ``weights = (w_q, w_k, w_v)``, the dtype."""

    x: np.ndarray
    lengths: np.ndarray
    start_steps: np.ndarray
    weights: tuple
    dtype: np.dtype

    @property
    def t_max(self):
        return self.x.shape[1] - 1

    def project(self, rows, positions):
        """q, k, v of sequence ``rows[n]`` at ``positions[n]``: ``[N, 1, D_k]``, ``[N, 1, D_k]``, ``[N, 1, D_v]``."""
        x_t = self.x[rows, positions][:, None, :]  # [N, 1, D_model]
        return tuple(x_t @ w for w in self.weights)


class _ContiguousCache:
    """``k_cache: [B, T_max, D_k]``, ``v_cache: [B, T_max, D_v]`` and each row's stored length: B × T_max slots."""

    def __init__(self, problem):
        n_seqs, t_max = len(problem.lengths), problem.t_max
        self.k_cache = np.zeros((n_seqs, t_max, problem.weights[1].shape[1]), problem.dtype)  # [B, T_max, D_k]
        self.v_cache = np.zeros((n_seqs, t_max, problem.weights[2].shape[1]), problem.dtype)  # [B, T_max, D_v]
        self.lengths = np.zeros(n_seqs, dtype=np.int64)  # positions stored per row
        self.reserved_slots, self.moved_slots, self.peak_blocks = n_seqs * t_max, 0, None


class _PaddedBatch(_ContiguousCache):
    """All B rows computed every step over the contiguous cache, masked where out of the batch."""

    def __init__(self, problem, block_size, num_blocks, cache):
        super().__init__(problem)
        self.in_batch = np.zeros(len(problem.lengths), dtype=bool)

    def join(self, seq):
        self.in_batch[seq] = True

    def leave(self, seqs):
        self.in_batch[seqs] = False

    def step(self, problem):
        rows = np.arange(len(self.lengths))
        # Rows out of the batch read the zero row at T_max and are masked below.
        q, k, v = problem.project(rows, np.where(self.in_batch, self.lengths, problem.t_max))
        live, positions = rows[self.in_batch], self.lengths[self.in_batch]
        self.k_cache[live, positions] = k[self.in_batch, 0]
        self.v_cache[live, positions] = v[self.in_batch, 0]
        self.lengths[self.in_batch] += 1
        span = int(self.lengths[self.in_batch].max())
        valid = (np.arange(span) < self.lengths[:, None]) & self.in_batch[:, None]  # [B, S]
        out = attention_forward(q, self.k_cache[:, :span], self.v_cache[:, :span], valid[:, None])  # [B, 1, D_v]
        return live, positions, out[self.in_batch, 0], len(rows)


class _CompactedBatch(_ContiguousCache):
    """Only the sequences in the batch, in rows 0..N-1 of the contiguous cache."""

    def __init__(self, problem, block_size, num_blocks, cache):
        super().__init__(problem)
        self.seqs = []  # the sequence in each row in use

    def join(self, seq):
        self.lengths[len(self.seqs)] = 0
        self.seqs.append(seq)

    def leave(self, seqs):
        """Compaction: each survivor in a row past the new end moves into a leaver's row, stored positions only."""
        gone = set(seqs)
        n = len(self.seqs) - len(gone)
        holes = [row for row in range(n) if self.seqs[row] in gone]
        movers = [row for row in range(n, len(self.seqs)) if self.seqs[row] not in gone]
        for hole, row in zip(holes, movers):
            length = self.lengths[row]
            self.k_cache[hole, :length] = self.k_cache[row, :length]
            self.v_cache[hole, :length] = self.v_cache[row, :length]
            self.lengths[hole] = length
            self.seqs[hole] = self.seqs[row]
            self.moved_slots += int(length)
        del self.seqs[n:]

    def step(self, problem):
        n = len(self.seqs)
        rows, positions = np.arange(n), self.lengths[:n].copy()
        seqs = np.array(self.seqs, dtype=np.int64)
        q, k, v = problem.project(seqs, positions)
        self.k_cache[rows, positions] = k[:, 0]
        self.v_cache[rows, positions] = v[:, 0]
        self.lengths[:n] += 1
        span = int(positions.max()) + 1
        valid = np.arange(span) < self.lengths[:n, None]  # [N, S]
        out = attention_forward(q, self.k_cache[:n, :span], self.v_cache[:n, :span], valid[:, None])  # [N, 1, D_v]
        return seqs, positions, out[:, 0], n


class _PagedBatch:
    """Only the sequences in the batch, with K/V in a :class:`PagedKVCache`: leaving frees blocks, nothing moves."""

    def __init__(self, problem, block_size, num_blocks, cache):
        if cache is None:
            if num_blocks is None:  # enough for every sequence at its full length at once
                num_blocks = sum(math.ceil(int(n) / block_size) for n in problem.lengths)
            w_k, w_v = problem.weights[1:]
            cache = PagedKVCache(num_blocks, block_size, w_k.shape[1], w_v.shape[1], problem.dtype)
        needed = _peak_blocks(problem, cache.block_size)
        if needed > cache.num_free_blocks:  # before the first step: a refused decode changes nothing
            raise OutOfBlocksError(f"out of blocks: the decode needs {needed} blocks at its peak, "
                                   f"{cache.num_free_blocks} of num_blocks={cache.num_blocks} are free")
        self.cache, self.seqs, self.moved_slots = cache, [], 0

    def join(self, seq):
        self.cache.add_sequence(seq)
        self.seqs.append(seq)

    def leave(self, seqs):
        for seq in seqs:
            self.cache.free(seq)
            self.seqs.remove(seq)

    def step(self, problem):
        seqs = np.array(self.seqs, dtype=np.int64)
        positions = self.cache.get_seq_lengths(self.seqs)  # [N]
        q, k, v = problem.project(seqs, positions)
        self.cache.update(self.seqs, k, v)
        out = paged_attention(q, self.cache, self.seqs, check_finite=False)  # [N, 1, D_v]
        return seqs, positions, out[:, 0], len(seqs)

    peak_blocks = property(lambda self: self.cache.peak_blocks)
    reserved_slots = property(lambda self: self.cache.peak_blocks * self.cache.block_size)


def _peak_blocks(problem, block_size):
    """The most blocks the schedule holds at once: blocks only grow between leaves, so just before one."""
    starts, ends = problem.start_steps, problem.start_steps + problem.lengths
    peak = 0
    for t in np.unique(ends[problem.lengths > 0]).tolist():  # step t - 1, sequence i has t - start_i positions
        held = (starts < t) & (t <= ends)
        peak = max(peak, int((-(-(t - starts[held]) // block_size)).sum()))
    return peak


_BATCHES = {"padded": _PaddedBatch, "compacted": _CompactedBatch, "paged": _PagedBatch}


# Input checks, all before the first step


def _as_sequences(x, lengths):
    """The sequences of ``x``: a list of ``[T_i, D_model]`` arrays and whether x came padded."""
    if isinstance(x, (list, tuple)):
        if lengths is not None:
            raise ValueError("lengths is for a padded x [B, T_max, D_model]; a list of sequences carries its own")
        seqs = [as_float_array(f"x[{i}]", seq) for i, seq in enumerate(x)]
        for i, seq in enumerate(seqs):
            if seq.ndim != 2:
                raise ValueError(f"x[{i}] must be [T_i, D_model], got shape {seq.shape}")
        return seqs, False
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a list of [T_i, D_model] arrays or an ndarray [B, T_max, D_model], got {type(x)}")
    if x.ndim != 3:
        raise ValueError(f"a padded x must be [B, T_max, D_model], got shape {x.shape}")
    as_float_array("x", x[:, :0])  # the dtype, even when every length is 0
    if lengths is None:
        lengths = np.full(x.shape[0], x.shape[1])
    else:
        lengths = as_sizes_per_sequence("lengths", lengths, x.shape[0])
    if lengths.size and lengths.max() > x.shape[1]:
        raise ValueError(f"lengths must be at most T_max={x.shape[1]} of x {x.shape}, got {lengths.tolist()}")
    # Only x[b, :T_b] is read (checked, copied): the padding may hold anything.
    return [as_float_array(f"x[{b}, :{n}]", x[b, :n]) for b, n in enumerate(lengths)], True


def _make_problem(x, w_q, w_k, w_v, lengths, start_steps):
    """The validated :class:`_RaggedBatch`, and the output's T_max for a padded x (None for a list)."""
    seqs, padded = _as_sequences(x, lengths)
    d_model = seqs[0].shape[1] if seqs else (np.shape(w_q)[:1] or (0,))[0]
    for i, seq in enumerate(seqs):
        if seq.shape[1] != d_model:
            raise ValueError(f"every sequence must share D_model: x[0] has {d_model}, x[{i}] has shape {seq.shape}")
    empty_dtype = x.dtype if isinstance(x, np.ndarray) else np.float64  # B = 0 keeps a padded x's dtype
    flat = np.concatenate(seqs) if seqs else np.empty((0, d_model), empty_dtype)  # [sum T_i, D_model]
    _, w_q, w_k, w_v, dtype = check_projection_inputs(flat, w_q, w_k, w_v, x_ndims=(2,))
    weights = w_q, w_k, w_v
    if start_steps is None:
        start_steps = np.zeros(len(seqs), np.int64)
    else:
        start_steps = as_sizes_per_sequence("start_steps", start_steps, len(seqs))
    lengths = np.array([len(seq) for seq in seqs], dtype=np.int64)
    t_max = int(lengths.max(initial=0))
    x_pad = np.zeros((len(seqs), t_max + 1, weights[0].shape[0]), dtype)  # [B, T_max + 1, D_model]; row T_max zero
    for b, seq in enumerate(seqs):
        x_pad[b, : len(seq)] = seq
    out_len = x.shape[1] if padded else None
    return _RaggedBatch(x_pad, lengths, start_steps, weights, dtype), out_len


def _steps(batch, problem):
    """Drive ``batch`` through the schedule; yield ``(seq_ids, positions, out, rows_computed)`` per step. A leaver
    leaves before a joiner joins (to reuse its blocks); T_i = 0 never joins; empty steps are skipped."""
    joins, leaves = {}, {}
    for seq in np.flatnonzero(problem.lengths > 0).tolist():
        start = int(problem.start_steps[seq])
        joins.setdefault(start, []).append(seq)
        leaves.setdefault(start + int(problem.lengths[seq]), []).append(seq)
    # The batch changes only at a join or a leave: jump over the empty stretches (start_steps may be far apart).
    events = sorted(set(joins) | set(leaves))
    in_batch = 0
    for event, next_event in zip(events, events[1:]):
        if event in leaves:
            batch.leave(leaves[event])
        for seq in joins.get(event, ()):
            batch.join(seq)
        in_batch += len(joins.get(event, ())) - len(leaves.get(event, ()))
        for _ in range(next_event - event if in_batch else 0):
            yield batch.step(problem)
    if events:  # the last to leave leave too, so that a caller's paged cache is left holding none of them
        batch.leave(leaves[events[-1]])


def _start(x, w_q, w_k, w_v, lengths, start_steps, strategy, block_size, num_blocks, cache):
    check_choice("strategy", strategy, RAGGED_STRATEGIES)
    block_size = None if block_size is None else as_size("block_size", block_size, minimum=1)
    num_blocks = None if num_blocks is None else as_size("num_blocks", num_blocks)
    for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
        if value is not None and strategy != "paged":  # the sizes of a pool only "paged" has
            raise ValueError(f"{name}={value} is for strategy='paged', got strategy={strategy!r}")
    problem, out_len = _make_problem(x, w_q, w_k, w_v, lengths, start_steps)
    if cache is not None:
        if strategy != "paged":
            raise ValueError(f"cache= is for strategy='paged', got strategy={strategy!r}")
        w_k, w_v = problem.weights[1:]
        check_cache_fits(cache, w_k.shape[1], w_v.shape[1], problem.dtype, block_size=block_size, num_blocks=num_blocks)
        taken = sorted(set(range(len(problem.lengths))) & set(cache.seq_ids))
        if taken:
            raise ValueError(f"cache already holds sequence(s) {taken}; the decode's sequences are "
                             f"0..{len(problem.lengths) - 1}")
        block_size = cache.block_size
    block_size = 16 if block_size is None else block_size
    return _BATCHES[strategy](problem, block_size, num_blocks, cache), problem, out_len


def ragged_decode_steps(x, w_q, w_k, w_v, *, lengths=None, start_steps=None, strategy="compacted", block_size=None,
                        num_blocks=None, cache=None):
    """:func:`ragged_decode` one step at a time, inputs validated first: yields ``(seq_ids [N], positions [N],
    out [N, D_v])``."""
    batch, problem, _ = _start(x, w_q, w_k, w_v, lengths, start_steps, strategy, block_size, num_blocks, cache)
    return (step[:3] for step in _steps(batch, problem))


def ragged_decode(x, w_q, w_k, w_v, *, lengths=None, start_steps=None, strategy="compacted", block_size=None,
                  num_blocks=None, return_stats=False, cache=None):
    """Decode B sequences of different lengths in one batch; each equals decoding it alone.

    ``lengths``: B integers for a padded x (default all T_max). ``start_steps``: B integers
    (default 0), when each joins. ``block_size`` (default 16) and ``num_blocks`` (default:
    every sequence at full length at once) size the paged pool; ``cache`` is a caller's
    :class:`~kv_attention.paged.PagedKVCache` instead. Returns B arrays ``[T_i, D_v]`` for a
    list x, else ``[B, T_max, D_v]`` zero past each length; with ``return_stats``, also a
    :class:`RaggedDecodeStats`.
    """
    return_stats = as_flag("return_stats", return_stats)
    batch, problem, out_len = _start(x, w_q, w_k, w_v, lengths, start_steps, strategy, block_size, num_blocks, cache)
    d_v = problem.weights[2].shape[1]
    out = np.zeros((len(problem.lengths), problem.t_max, d_v), problem.dtype)  # [B, T_max, D_v]
    steps = row_steps = 0
    for seq_ids, positions, out_rows, rows in _steps(batch, problem):
        out[seq_ids, positions] = out_rows
        steps, row_steps = steps + 1, row_steps + rows
    if out_len is None:
        result = [out[b, :n] for b, n in enumerate(problem.lengths)]
    else:
        result = np.zeros((len(problem.lengths), out_len, d_v), problem.dtype)  # [B, T_max of x, D_v]
        result[:, : problem.t_max] = out
    if not return_stats:
        return result
    stats = RaggedDecodeStats(strategy, steps, row_steps, batch.reserved_slots, batch.moved_slots, batch.peak_blocks)
    return result, stats
