"""Serving requests: continuous batching over a paged KV cache, with chunked prefill, preemption and prefix caching.

A :class:`Request` carries token ids, teacher-forced (there is no sampling): the
first ``prompt_len`` are its prompt, prefilled in one or more chunks, and the
rest are decoded one per step. The model is the library's single head: the
input of a token is ``x = embedding[token_id]`` (``embedding: [V, D_model]``),
with ``w_q, w_k: [D_model, D_k]`` and ``w_v: [D_model, D_v]``. A request's outputs
are the attention outputs at its last prompt position and at every decoded
position, ``[len(token_ids) - prompt_len + 1, D_v]``, what a model samples from.
They equal ``causal_attention(embedding[token_ids], w_q, w_k, w_v)[prompt_len - 1:]``
however the request was chunked, batched, preempted or served from the cache.
With ``model=(config, weights)`` (:mod:`~kv_attention.model`) the model is a Llama
decoder over one paged cache for every layer, and the tokens past a prompt are the model's
own: each output is the argmax of the logits at the last known token, and it becomes
the next token; a request's outputs equal its own ``generate()``. A step runs the
one-token chunks of all requests as one batch (one position per row), and each
longer chunk alone. As in vLLM V1, one block table per request, one allocator and its
prefix-cache hashes serve every layer, each layer with its own K/V pools.

A request knows its prompt and, after each output, one token more (the one a
model would have sampled from it). The scheduler is vLLM V1's
(``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``), with no decode or
prefill phase: each request has ``num_computed`` tokens in the cache and
``num_tokens`` known, and each step spends a budget of ``max_num_batched_tokens``
tokens bringing the first up to the second:

1. Running requests, in order of admission: each gets ``min(num_tokens -
   num_computed, budget)`` tokens (chunked prefill; a decode is 1 token), once
   the paged cache has slots for them (``allocate_slots``). When it has not, the
   last running request is preempted (``self.running.pop()``: its blocks freed,
   ``num_computed = 0``, back at the head of the waiting queue, to be recomputed)
   until the slots fit or the request itself was the one preempted.
2. Waiting requests, first come first served, only in a step that preempted none
   (V1's ``if not preempted_reqs``) and while fewer than ``max_num_seqs`` run: a
   request starts from its prefix-cache hit, capped at ``num_tokens - 1`` tokens
   (V1's ``get_computed_blocks``), and gets ``min(num_tokens - num_computed,
   budget)`` tokens if their slots fit; the first that does not fit stops admission.

The step then computes k and v of every scheduled token, and one query for each
request whose known tokens are now all in the cache: its next output. What
differs from V1: no sampling (tokens are teacher-forced, or the model's argmax),
FCFS only (no priority policy), no ``long_prefill_token_threshold``, speculative
decoding, encoder inputs or KV connectors, and the blocks a waiting request needs
are counted before it takes its cached prefix, so a refused admission leaves the
prefix cache's LRU order as it was. Continuous batching: Orca (Yu et al. 2022).

Errors, all before anything runs: TypeError for ``requests`` that are not a list
or tuple of :class:`Request`, a request id that is not hashable, token ids that
are not integers, a size that is not an integer, a flag that is not a bool, or an
embedding or weight that is not a float32/float64 array. ValueError naming the
request for a repeated request id, ``prompt_len`` outside [1, len(token_ids)],
token ids outside [0, V), or a request whose full length needs more blocks than
``num_blocks`` (it could never fit the pool). ValueError also for a budget or
``max_num_seqs`` below 1, ``block_size`` below 1, shapes that do not fit (named in
the message), or NaN/inf; with ``model``, weights that do not fit its config (named).
"""

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import _MAX_STEP, as_array, as_flag, as_float_array, as_size
from .attention import check_projection_inputs
from .model import ModelConfig, check_weights, forward
from .paged import OutOfBlocksError, PagedCacheView, PagedKVCache, as_token_ids, paged_attention


@dataclass(frozen=True)
class Request:
    """One request: ``token_ids``, its whole sequence, the first ``prompt_len`` of them its prompt.

    ``request_id``: any hashable, distinct among the requests served together.
    ``arrival_step``: the scheduler step at which it arrives (default 0).
    """

    request_id: Any
    token_ids: Any
    prompt_len: int
    arrival_step: int = 0

    def __repr__(self):
        """The request without its tokens: ``Request('a', 512 tokens, prompt_len=500, arrival_step=0)``."""
        try:
            tokens = f"{len(self.token_ids)} tokens"
        except TypeError:  # no len(): an int, None, a 0-d array
            tokens = f"token_ids={self.token_ids!r}"
        return (f"Request({self.request_id!r}, {tokens}, prompt_len={self.prompt_len!r}, "
                f"arrival_step={self.arrival_step!r})")


@dataclass(frozen=True)
class ServeStats:
    """What a serve did; counts, not timings.

    Attributes:
        steps: scheduler steps run; each computed at least one token (idle steps
            before an arrival are skipped).
        preemptions: preemptions, each of a running request (one may be preempted more than once).
        recomputed_tokens: tokens computed again after a preemption: positions
            below the most a request ever had in the cache.
        prefix_hit_tokens: tokens taken from the prefix cache at admission, and so not computed.
        peak_blocks: the most blocks in use at once, a shared block once.
        prefill_tokens_per_step: prompt (and recomputed) tokens computed at each step, a tuple of ``steps`` ints.
        decode_tokens_per_step: tokens past the prompt computed for the first time, at each step (V1 has no
            phases: this is the library's split of its tokens).
    """

    steps: int
    preemptions: int
    recomputed_tokens: int
    prefix_hit_tokens: int
    peak_blocks: int
    prefill_tokens_per_step: tuple
    decode_tokens_per_step: tuple

    @property
    def prefill_tokens(self):
        """Prefill tokens computed in all (int)."""
        return sum(self.prefill_tokens_per_step)

    @property
    def decode_tokens(self):
        """Decoded tokens computed in all (int)."""
        return sum(self.decode_tokens_per_step)

    def __repr__(self):
        """The counts, with the per-step tuples as their totals."""
        return (f"ServeStats(steps={self.steps}, preemptions={self.preemptions}, "
                f"recomputed_tokens={self.recomputed_tokens}, prefix_hit_tokens={self.prefix_hit_tokens}, "
                f"peak_blocks={self.peak_blocks}, prefill_tokens={self.prefill_tokens}, decode_tokens={self.decode_tokens})")


@dataclass(frozen=True)
class ServeResult:
    """What :func:`serve` returns.

    Attributes:
        outputs: request_id -> ``[len(token_ids) - prompt_len + 1, D_v]``, in the order of the requests.
        stats: a :class:`ServeStats`.
    """

    outputs: dict
    stats: ServeStats

    def __repr__(self):
        """The stats, and the outputs as request_id -> shape."""
        shapes = ", ".join(f"{rid!r}: {list(out.shape)}" for rid, out in self.outputs.items())
        return f"ServeResult(outputs={{{shapes}}}, stats={self.stats!r})"


class _Sequence:
    """A request in the scheduler: how much of it is in the cache, and its outputs so far."""

    def __init__(self, request_id, token_ids, prompt_len, arrival_step, output_shape, dtype):
        self.request_id, self.token_ids, self.prompt_len = request_id, token_ids, prompt_len
        self.arrival_step = arrival_step
        self.outputs = np.zeros((len(token_ids) - prompt_len + 1, *output_shape), dtype)  # [outputs, D_v] or [outputs]
        self.num_emitted = 0  # outputs computed
        self.num_computed = 0  # tokens whose k and v are in the cache
        self.high_water = 0  # the most tokens it ever had in the cache: below it, a token is recomputed

    @property
    def num_tokens(self):
        """Tokens known: the prompt, and one more after each output (while outputs remain)."""
        return self.prompt_len + self.num_emitted


class _Scheduler:
    """The queues (arrivals, waiting, running), the paged cache, and the counts of one serve."""

    def __init__(self, seqs, embedding, weights, model, cache, max_num_batched_tokens, max_num_seqs):
        self.embedding, self.weights, self.model = embedding, weights, model
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.cache = cache  # every layer's K/V through one block table per request
        self.arrivals = deque(sorted(seqs, key=lambda s: s.arrival_step))  # stable: FCFS among equal steps
        self.waiting, self.running = deque(), []  # running: in order of admission
        self.preemptions = self.recomputed_tokens = self.prefix_hit_tokens = 0
        self.prefill_per_step, self.decode_per_step = [], []

    def run(self):
        clock = 0
        while self.arrivals or self.waiting or self.running:
            if not (self.waiting or self.running):
                clock = max(clock, self.arrivals[0].arrival_step)  # jump over an idle stretch
            while self.arrivals and self.arrivals[0].arrival_step <= clock:
                self.waiting.append(self.arrivals.popleft())
            scheduled = self.schedule()
            assert scheduled, "the earliest admitted request always fits the pool alone"
            self.execute(scheduled)
            clock += 1

    def schedule(self):
        """This step's ``(request, num_new_tokens)`` pairs: running requests first, then waiting ones (V1's loop)."""
        token_budget, scheduled, preempted = self.max_num_batched_tokens, [], False
        index = 0
        while index < len(self.running) and token_budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_tokens - seq.num_computed, token_budget)
            while seq in self.running and not self.allocate_slots(seq, num_new):
                self.preempt(self.running.pop())  # the last admitted, not yet scheduled in this step
                preempted = True
            if seq not in self.running:  # it preempted itself: no request is left to schedule
                break
            scheduled.append((seq, num_new))
            token_budget -= num_new
            index += 1
        while not preempted and self.waiting and token_budget > 0 and self.has_seat():
            seq = self.waiting[0]
            hits = self.cache.find_cached_blocks(seq.token_ids[: seq.num_tokens - 1])  # a hit leaves 1 token
            num_hit = len(hits) * self.cache.block_size
            num_new = min(seq.num_tokens - num_hit, token_budget)
            idle = sum(self.cache.ref_count(b) == 0 for b in hits)  # cached, held by none: taken from the free count
            if math.ceil((num_hit + num_new) / self.cache.block_size) - len(hits) + idle > self.cache.num_free_blocks:
                break
            self.waiting.popleft()
            seq.num_computed = self.cache.add_sequence(seq.request_id, seq.token_ids[:num_hit] if hits else None)
            self.cache.allocate_slots(seq.request_id, num_new)
            self.prefix_hit_tokens += seq.num_computed
            self.running.append(seq)
            scheduled.append((seq, num_new))
            token_budget -= num_new
        return scheduled

    def allocate_slots(self, seq, num_new):
        """Whether the cache could give ``seq`` slots for ``num_new`` more tokens (all or nothing)."""
        try:
            self.cache.allocate_slots(seq.request_id, num_new)  # all or nothing
            return True
        except OutOfBlocksError:
            return False

    def preempt(self, seq):
        """Free ``seq``'s blocks and put it back at the head of the queue, to recompute what it knew."""
        self.cache.free(seq.request_id)
        seq.num_computed = 0
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def has_seat(self):
        return self.max_num_seqs is None or len(self.running) < self.max_num_seqs

    def execute(self, scheduled):
        """Compute the scheduled tokens' k and v, then the outputs of the requests now up to date."""
        # tokens past the prompt computed for the first time: a recomputing chunk may end with one
        first = [s.num_computed + n - max(s.num_computed, s.prompt_len, s.high_water) for s, n in scheduled]
        self.decode_per_step.append(sum(max(0, f) for f in first))
        self.prefill_per_step.append(sum(n for _, n in scheduled) - self.decode_per_step[-1])
        if self.model is not None:
            self.run_model(scheduled)
            return
        for seq, n in scheduled:
            self.write_kv(seq, n)
        self.attend([s for s, _ in scheduled if s.num_computed == s.num_tokens])

    def advance(self, seq, n):
        """Count ``n`` more tokens of ``seq`` as in the cache."""
        start = seq.num_computed
        self.recomputed_tokens += max(0, min(start + n, seq.high_water) - start)
        seq.num_computed = start + n
        seq.high_water = max(seq.high_water, seq.num_computed)

    def write_kv(self, seq, n):
        """Project and store k, v of the next ``n`` tokens of ``seq``."""
        _, w_k, w_v = self.weights
        start = seq.num_computed
        tokens = seq.token_ids[None, start : start + n]  # [1, n]
        x = self.embedding[tokens]  # [1, n, D_model]
        token_ids = tokens if self.cache.enable_prefix_caching else None
        self.cache.update([seq.request_id], x @ w_k, x @ w_v, token_ids=token_ids)  # [1, n, D_k], [1, n, D_v]
        self.advance(seq, n)

    def attend(self, seqs):
        """The next output of each of ``seqs``: its last known token's query over its keys in the cache."""
        if not seqs:
            return
        tokens = [s.token_ids[s.num_computed - 1] for s in seqs]
        q = (self.embedding[tokens] @ self.weights[0])[:, None, :]  # [N, 1, D_k]
        out = paged_attention(q, self.cache, [s.request_id for s in seqs], check_finite=False)[:, 0]  # [N, D_v]
        for seq, row in zip(seqs, out):
            self.emit(seq, row)

    def run_model(self, scheduled):
        """The model's forward over the scheduled tokens: the one-token chunks as one batch, each longer chunk alone;
        a request now up to date emits the argmax of its last logits, and that token is its next input."""
        ones = [(s, n) for s, n in scheduled if n == 1]
        for group in [ones] * bool(ones) + [[(s, n)] for s, n in scheduled if n != 1]:
            n = group[0][1]
            ids = np.array([s.token_ids[s.num_computed : s.num_computed + n] for s, _ in group])  # [N, n]
            token_ids = ids if self.cache.enable_prefix_caching else None
            view = PagedCacheView(self.cache, [s.request_id for s, _ in group], token_ids)
            logits = forward(*self.model, ids, cache=view)  # [N, n, V]
            for i, (seq, _) in enumerate(group):
                self.advance(seq, n)
                if seq.num_computed == seq.num_tokens:
                    token = logits[i, -1].argmax()
                    if seq.num_tokens < len(seq.token_ids):
                        seq.token_ids[seq.num_tokens] = token  # the token it generated is its next input
                    self.emit(seq, token)

    def emit(self, seq, output):
        """Record ``seq``'s next output; a request with all of them leaves, its blocks freed."""
        seq.outputs[seq.num_emitted] = output
        seq.num_emitted += 1
        if seq.num_emitted == len(seq.outputs):
            self.cache.free(seq.request_id)
            self.running.remove(seq)

    def result(self, seqs):
        stats = ServeStats(
            steps=len(self.decode_per_step),
            preemptions=self.preemptions,
            recomputed_tokens=self.recomputed_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            peak_blocks=self.cache.peak_blocks,
            prefill_tokens_per_step=tuple(self.prefill_per_step),
            decode_tokens_per_step=tuple(self.decode_per_step),
        )
        return ServeResult({s.request_id: s.outputs for s in seqs}, stats)


# Input checks, all before anything runs


def check_serve_inputs(requests, embedding, w_q, w_k, w_v, block_size, num_blocks, max_num_batched_tokens, max_num_seqs,
                       enable_prefix_caching, model=None):
    """Validate the inputs of ``serve``: ``(specs, embedding, weights, dtype, options)``, one spec per request;
    with ``model``, embedding and weights are None and dtype the model's computation dtype."""
    options = (
        as_size("block_size", block_size, minimum=1),
        as_size("num_blocks", num_blocks),
        as_size("max_num_batched_tokens", max_num_batched_tokens, minimum=1),
        None if max_num_seqs is None else as_size("max_num_seqs", max_num_seqs, minimum=1),
        as_flag("enable_prefix_caching", enable_prefix_caching),
    )
    if model is not None:
        if any(a is not None for a in (embedding, w_q, w_k, w_v)):
            raise ValueError("pass either embedding, w_q, w_k, w_v (the single-head model) or model=(config, weights)")
        if not (isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], ModelConfig)):
            raise TypeError(f"model must be (ModelConfig, weights), got {type(model).__name__}")
        dtype = check_weights(*model)
        return _check_requests(requests, model[0].vocab_size, options[0], options[1]), None, None, dtype, options
    embedding = as_float_array("embedding", embedding)
    if embedding.ndim != 2:
        raise ValueError(f"embedding must be [V, D_model], got shape {embedding.shape}")
    w_q, w_k, w_v = (as_array(name, w) for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)))  # before any shape
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        if w.ndim == 2 and w.shape[0] != embedding.shape[1]:
            raise ValueError(f"{name} has {w.shape[0]} rows but embedding has D_model={embedding.shape[1]}: "
                             f"embedding {embedding.shape}, {name} {w.shape}")
    # x = embedding[token_ids]: the bound on |q|·|k| over every embedding row covers every token.
    embedding, w_q, w_k, w_v, dtype = check_projection_inputs(embedding, w_q, w_k, w_v, x_ndims=(2,))
    specs = _check_requests(requests, len(embedding), options[0], options[1])
    return specs, embedding.astype(dtype, copy=False), (w_q, w_k, w_v), dtype, options


def _check_requests(requests, vocab_size, block_size, num_blocks):
    """One ``(request_id, token_ids, prompt_len, arrival_step)`` per request, or raise naming the request."""
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests must be a list of Request, got {type(requests).__name__}")
    specs, seen = [], {}
    for i, request in enumerate(requests):
        if not isinstance(request, Request):
            raise TypeError(f"requests[{i}] must be a Request, got {type(request).__name__}")
        try:
            hash(request.request_id)
        except TypeError:
            raise TypeError(f"requests[{i}]: request_id must be hashable, got {request.request_id!r}") from None
        if request.request_id != request.request_id:  # NaN: two of them would both pass as distinct keys
            raise ValueError(f"requests[{i}]: request_id must equal itself to key the outputs, got "
                             f"{request.request_id!r}")
        name = f"request {request.request_id!r} (requests[{i}])"
        if request.request_id in seen:
            raise ValueError(f"{name} repeats the request_id of requests[{seen[request.request_id]}]")
        seen[request.request_id] = i
        specs.append(_check_request(name, request, vocab_size, block_size, num_blocks))
    return specs


def _check_request(name, request, vocab_size, block_size, num_blocks):
    tokens = as_token_ids(f"{name}: token_ids", request.token_ids)
    outside = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if outside.size:
        j = int(outside[0])
        raise ValueError(f"{name}: token_ids[{j}] = {tokens[j]} is not a row of the embedding: ids must be in [0, V={vocab_size})")
    prompt_len = as_size(f"{name}: prompt_len", request.prompt_len, minimum=1)
    if prompt_len > len(tokens):
        raise ValueError(f"{name}: prompt_len must be in [1, len(token_ids)={len(tokens)}], got {prompt_len}")
    arrival_step = as_size(f"{name}: arrival_step", request.arrival_step)
    if arrival_step > _MAX_STEP:
        raise ValueError(f"{name}: arrival_step={arrival_step} is too large: at most 2**62")
    blocks = math.ceil(len(tokens) / block_size)
    if blocks > num_blocks:
        raise ValueError(f"{name} can never fit the pool: its {len(tokens)} tokens need {blocks} blocks of "
                         f"block_size={block_size}, and num_blocks={num_blocks}")
    return request.request_id, tokens, prompt_len, arrival_step




def serve(requests, embedding=None, w_q=None, w_k=None, w_v=None, *, model=None, block_size=16, num_blocks,
          max_num_batched_tokens, max_num_seqs=None, enable_prefix_caching=False):
    """Serve ``requests`` to completion by the scheduler of the module docstring; returns a :class:`ServeResult`.

    Args:
        requests: a list of :class:`Request`, with distinct request ids.
        embedding: ``[V, D_model]``; w_q, w_k: ``[D_model, D_k]``; w_v: ``[D_model, D_v]``: the single head.
        model: instead, ``(config, weights)`` of :mod:`~kv_attention.model`, served with a paged
            cache of one pool per layer (``num_kv_heads`` heads, head_dim wide) and one block table per request. A request's tokens past
            its prompt are then the model's own greedy choices, each fed back (the ones given
            only set how many: ``len(token_ids) - prompt_len + 1`` are generated); its output is
            those tokens, int64, equal to ``generate(config, weights, [prompt], n)[0, prompt_len:]``.
        block_size: tokens per block of the paged cache (default 16).
        num_blocks: blocks in the pool, each a block of every layer's K/V; every request must fit it alone.
        max_num_batched_tokens: the token budget of a step, >= 1.
        max_num_seqs: the most running requests at once (default: no limit).
        enable_prefix_caching: share cached full blocks between requests (default False).

    Outputs are in ``np.result_type`` of embedding and weights.
    """
    specs, embedding, weights, dtype, options = check_serve_inputs(
        requests, embedding, w_q, w_k, w_v, block_size, num_blocks, max_num_batched_tokens, max_num_seqs,
        enable_prefix_caching, model,
    )
    block_size, num_blocks, max_num_batched_tokens, max_num_seqs, enable_prefix_caching = options
    if model is None:
        d_k, d_v, layers, heads = weights[1].shape[1], weights[2].shape[1], 1, None
        output = ((d_v,), dtype)  # an attention output [D_v] per step
    else:
        config = model[0]
        d_k = d_v = config.head_dim
        layers, heads, output = config.num_hidden_layers, config.num_key_value_heads, ((), np.int64)  # a token
    cache = PagedKVCache(num_blocks, block_size, d_k, d_v, dtype, enable_prefix_caching=enable_prefix_caching,
                         num_kv_heads=heads, num_layers=layers)
    seqs = [_Sequence(*spec, *output) for spec in specs]
    scheduler = _Scheduler(seqs, embedding, weights, model, cache, max_num_batched_tokens, max_num_seqs)
    scheduler.run()
    return scheduler.result(seqs)
