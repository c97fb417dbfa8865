"""Serving requests: continuous batching over a paged KV cache, with chunked prefill, preemption and prefix caching.

A :class:`Request` carries token ids, its first ``prompt_len`` the prompt. With the single head (``embedding [V,
D_model]``, ``w_q, w_k: [D_model, D_k]``, ``w_v: [D_model, D_v]``) the rest are teacher-forced and the outputs,
``[len(token_ids) - prompt_len + 1, D_v]``, equal ``causal_attention(embedding[token_ids], w_q, w_k,
w_v)[prompt_len - 1:]`` however the request was chunked, batched, preempted or cached. With ``model=(config,
weights)`` a Llama decoder runs over one paged cache for every layer; a request is its prompt and ``max_tokens``
(vLLM's ``SamplingParams.max_tokens``), each output the argmax fed back until an end token (``eos_token_id``, kept in
the output; its blocks freed at once, as V1's ``check_stop``): its own ``generate()``.

The scheduler decides and a runner executes, as vLLM V1's engine step (``vllm/v1/engine/core.py``:
``Scheduler.schedule``, ``GPUModelRunner.execute_model``, ``Scheduler.update_from_output``). :meth:`Scheduler.schedule`
is V1's (``vllm/v1/core/sched/scheduler.py``), with no phases: a step spends ``max_num_batched_tokens`` bringing each
request's ``num_computed`` tokens up to its ``num_tokens``:

1. Running requests, in order of admission: ``min(num_tokens - num_computed, budget)`` tokens each, once
   ``allocate_slots`` has room; else the last running request is preempted (blocks freed, ``num_computed = 0``, to
   the head of the waiting queue) until they fit or the request itself was preempted.
2. Waiting requests, FCFS, only in a step that preempted none and while fewer than ``max_num_seqs`` run: each starts
   from its prefix-cache hit (at most ``num_tokens - 1`` tokens) if its chunk's slots fit; the first that does not
   stops admission.

What differs from V1: no sampling, FCFS only, no ``long_prefill_token_threshold``, speculative decoding or KV
connectors; a waiting request's blocks are counted before it takes its cached prefix. Continuous batching: Orca (Yu
et al. 2022).

Errors, all before anything runs: TypeError or ValueError naming the argument (and the request: a repeated id,
``prompt_len`` outside [1, len(token_ids)], token ids outside [0, V), a request that could never fit the pool). A serve
that fails later (a NaN in a layer, a caller's cache too full, Ctrl-C) leaves that cache as it was.
"""

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import _MAX_STEP, as_array, as_float_array, as_size
from .attention import check_projection_inputs
from .model import ModelConfig, check_weights, end_tokens, forward
from .paged import OutOfBlocksError, PagedCacheView, PagedKVCache, as_token_ids, check_cache_fits, paged_attention


@dataclass(frozen=True)
class Request:
    """``token_ids``, the first ``prompt_len`` (default all) the prompt; ``request_id`` any hashable, distinct;
    ``arrival_step`` the step it arrives at; ``max_tokens``: for the model, the most tokens generated after the prompt.
    Without ``max_tokens``, one output per position from the prompt's last: 1 + len(token_ids) - prompt_len."""

    request_id: Any
    token_ids: Any
    prompt_len: int = None
    arrival_step: int = 0
    max_tokens: int = None

    def __repr__(self):
        try:
            tokens = f"{len(self.token_ids)} tokens"
        except TypeError:  # no len(): an int, None, a 0-d array
            tokens = f"token_ids={self.token_ids!r}"
        return (f"Request({self.request_id!r}, {tokens}, prompt_len={self.prompt_len!r}, arrival_step="
                f"{self.arrival_step!r}{'' if self.max_tokens is None else f', max_tokens={self.max_tokens!r}'})")


@dataclass(frozen=True)
class ServeStats:
    """What a serve did, counts: ``steps`` run (idle ones skipped), ``preemptions``, ``recomputed_tokens`` (below the
    most a request ever had cached), ``prefix_hit_tokens`` (taken from the cache at admission), ``peak_blocks``, and
    per step the prompt (and recomputed) tokens and those past the prompt computed for the first time."""

    steps: int
    preemptions: int
    recomputed_tokens: int
    prefix_hit_tokens: int
    peak_blocks: int
    prefill_tokens_per_step: tuple
    decode_tokens_per_step: tuple

    prefill_tokens = property(lambda self: sum(self.prefill_tokens_per_step))
    decode_tokens = property(lambda self: sum(self.decode_tokens_per_step))

    def __repr__(self):  # the per-step tuples as their totals
        return (f"ServeStats(steps={self.steps}, preemptions={self.preemptions}, "
                f"recomputed_tokens={self.recomputed_tokens}, prefix_hit_tokens={self.prefix_hit_tokens}, "
                f"peak_blocks={self.peak_blocks}, prefill_tokens={self.prefill_tokens}, decode_tokens={self.decode_tokens})")


@dataclass(frozen=True)
class ServeResult:
    """``outputs``: request_id -> ``[len(token_ids) - prompt_len + 1, D_v]`` attention outputs (the single head) or
    the int64 tokens generated (the model: up to its end token, or max_tokens of them), in request order; ``stats``:
    a :class:`ServeStats`."""

    outputs: dict
    stats: ServeStats

    def __repr__(self):
        shapes = ", ".join(f"{rid!r}: {list(out.shape)}" for rid, out in self.outputs.items())
        return f"ServeResult(outputs={{{shapes}}}, stats={self.stats!r})"


class _Sequence:
    """A request in the scheduler: its own copy of the tokens, how many are cached, its outputs so far."""

    def __init__(self, request_id, token_ids, prompt_len, arrival_step, num_outputs, output_shape, dtype):
        self.request_id, self.prompt_len, self.arrival_step = request_id, prompt_len, arrival_step
        self.token_ids = np.zeros(prompt_len + num_outputs - 1, np.int64)  # never the caller's array
        self.token_ids[: len(token_ids)] = token_ids
        self.outputs = np.zeros((num_outputs, *output_shape), dtype)  # [outputs, D_v] or [outputs]
        self.num_emitted = 0  # outputs computed
        self.num_computed = 0  # tokens whose k and v are in the cache
        self.high_water = 0  # the most tokens it ever had in the cache: below it, a token is recomputed

    @property
    def num_tokens(self):
        """Tokens known: the prompt, and one more after each output (while outputs remain)."""
        return self.prompt_len + self.num_emitted


@dataclass
class SchedulerOutput:
    """One step's decision (V1's ``SchedulerOutput``): each scheduled request -> its ``num_scheduled_tokens``."""

    num_scheduled_tokens: dict


class Scheduler:
    """The queues (arrivals, waiting, running) of one serve over a KV cache ``manager``, and the counts."""

    def __init__(self, seqs, manager, max_num_batched_tokens, max_num_seqs, eos_token_ids=()):
        self.manager, self.max_num_batched_tokens, self.max_num_seqs = manager, max_num_batched_tokens, max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)  # the model's end tokens
        self.arrivals = deque(sorted(seqs, key=lambda s: s.arrival_step))  # stable: FCFS among equal steps
        self.waiting, self.running, self.clock = deque(), [], 0  # running: in order of admission
        self.preemptions = self.recomputed_tokens = self.prefix_hit_tokens = 0
        self.prefill_per_step, self.decode_per_step = [], []

    def has_requests(self):
        return bool(self.arrivals or self.waiting or self.running)

    def schedule(self):
        """This step's :class:`SchedulerOutput`: running requests first, then waiting ones (V1's loop)."""
        if not (self.waiting or self.running):
            self.clock = max(self.clock, self.arrivals[0].arrival_step)  # jump over an idle stretch
        while self.arrivals and self.arrivals[0].arrival_step <= self.clock:
            self.waiting.append(self.arrivals.popleft())
        self.clock += 1
        budget, scheduled, preempted, index = self.max_num_batched_tokens, {}, False, 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            while seq in self.running and not self.allocate_slots(seq, num_new):
                self.preempt(self.running.pop())  # the last admitted, not yet scheduled in this step
                preempted = True
            if seq not in self.running:  # it preempted itself: no request is left to schedule
                break
            scheduled[seq], budget, index = num_new, budget - num_new, index + 1
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq, size = self.waiting[0], self.manager.block_size
            hits = self.manager.find_cached_blocks(seq.token_ids[: seq.num_tokens - 1])  # a hit leaves 1 token
            num_new = min(seq.num_tokens - len(hits) * size, budget)
            idle = sum(self.manager.ref_count(b) == 0 for b in hits)  # cached, held by none: taken from the free count
            if math.ceil((len(hits) * size + num_new) / size) - len(hits) + idle > self.manager.num_free_blocks:
                break
            self.waiting.popleft()
            seq.num_computed = self.manager.add_sequence(seq.request_id, seq.token_ids[: len(hits) * size])
            self.manager.allocate_slots(seq.request_id, num_new)
            self.prefix_hit_tokens += seq.num_computed
            self.running.append(seq)
            scheduled[seq], budget = num_new, budget - num_new
        if not scheduled:  # the earliest request does not fit the blocks a caller's cache has free
            raise OutOfBlocksError(f"out of blocks: request {self.waiting[0].request_id!r} does not fit the "
                                   f"{self.manager.num_free_blocks} free blocks of the cache")
        return SchedulerOutput(scheduled)

    def allocate_slots(self, seq, num_new):
        """Whether the cache could give ``seq`` slots for ``num_new`` more tokens (all or nothing)."""
        try:
            self.manager.allocate_slots(seq.request_id, num_new)
            return True
        except OutOfBlocksError:
            return False

    def preempt(self, seq):
        """Free ``seq``'s blocks and put it back at the head of the queue, to recompute what it knew."""
        self.manager.free(seq.request_id)
        seq.num_computed = 0
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def update_from_output(self, output, outputs):
        """Count the step's tokens as computed, record ``outputs`` (request -> its next output), free the finished:
        those at their last output or at an end token (V1's ``check_stop``)."""
        scheduled = output.num_scheduled_tokens.items()
        # tokens past the prompt computed for the first time: a recomputing chunk may end with one
        first = [s.num_computed + n - max(s.num_computed, s.prompt_len, s.high_water) for s, n in scheduled]
        self.decode_per_step.append(sum(max(0, f) for f in first))
        self.prefill_per_step.append(sum(output.num_scheduled_tokens.values()) - self.decode_per_step[-1])
        for seq, n in scheduled:
            self.recomputed_tokens += max(0, min(seq.num_computed + n, seq.high_water) - seq.num_computed)
            seq.num_computed += n
            seq.high_water = max(seq.high_water, seq.num_computed)
        for seq, out in outputs.items():
            if seq.outputs.ndim == 1 and seq.num_tokens < len(seq.token_ids):  # the model's token: its next input
                seq.token_ids[seq.num_tokens] = out
            seq.outputs[seq.num_emitted] = out
            seq.num_emitted += 1
            if seq.num_emitted < len(seq.outputs) and self.eos_token_ids and int(out) in self.eos_token_ids:
                seq.outputs = seq.outputs[: seq.num_emitted]  # stopped: the end token kept, as vLLM's token_ids
            if seq.num_emitted == len(seq.outputs):
                self.manager.free(seq.request_id)
                self.running.remove(seq)

    def stats(self):
        return ServeStats(len(self.decode_per_step), self.preemptions, self.recomputed_tokens, self.prefix_hit_tokens,
                          self.manager.peak_blocks, tuple(self.prefill_per_step), tuple(self.decode_per_step))


class _HeadRunner:
    """Executes a step of the single head: k and v of the scheduled tokens into the cache, then the queries."""

    def __init__(self, cache, embedding, weights):
        self.cache, self.embedding, self.weights = cache, embedding, weights

    def execute_model(self, output):
        """Each request now up to date -> its next output ``[D_v]``: its last known token's query over its keys."""
        done = []
        for seq, n in output.num_scheduled_tokens.items():
            tokens = seq.token_ids[None, seq.num_computed : seq.num_computed + n]  # [1, n]
            x = self.embedding[tokens]  # [1, n, D_model]
            token_ids = tokens if self.cache.enable_prefix_caching else None
            self.cache.update([seq.request_id], x @ self.weights[1], x @ self.weights[2], token_ids=token_ids)
            if seq.num_computed + n == seq.num_tokens:
                done.append(seq)
        if not done:
            return {}
        q = (self.embedding[[s.token_ids[s.num_tokens - 1] for s in done]] @ self.weights[0])[:, None, :]  # [N, 1, D_k]
        out = paged_attention(q, self.cache, [s.request_id for s in done], check_finite=False)[:, 0]  # [N, D_v]
        return dict(zip(done, out))


class _ModelRunner:
    """Executes a step of the model: one forward of the one-token chunks as a batch, one of each longer chunk."""

    def __init__(self, cache, model):
        self.cache, self.model = cache, model

    def execute_model(self, output):
        """Each request now up to date -> the argmax of its last logits (int64), its next token."""
        scheduled, sampled = output.num_scheduled_tokens.items(), {}
        ones = [(s, n) for s, n in scheduled if n == 1]
        for group in [ones] * bool(ones) + [[(s, n)] for s, n in scheduled if n != 1]:
            n = group[0][1]
            ids = np.array([s.token_ids[s.num_computed : s.num_computed + n] for s, _ in group])  # [N, n]
            token_ids = ids if self.cache.enable_prefix_caching else None
            view = PagedCacheView(self.cache, [s.request_id for s, _ in group], token_ids)
            logits = forward(*self.model, ids, cache=view)  # [N, n, V]
            sampled.update({s: logits[i, -1].argmax() for i, (s, _) in enumerate(group)
                            if s.num_computed + n == s.num_tokens})
        return sampled


# Input checks, all before anything runs


def check_serve_inputs(requests, embedding, weights, model, cache, block_size, num_blocks, max_num_batched_tokens,
                       max_num_seqs, enable_prefix_caching, eos_token_id=None):
    """Validate the inputs of ``serve``: ``(seqs, runner, scheduler)``, nothing run yet."""
    max_num_batched_tokens = as_size("max_num_batched_tokens", max_num_batched_tokens, minimum=1)
    max_num_seqs = math.inf if max_num_seqs is None else as_size("max_num_seqs", max_num_seqs, minimum=1)
    if model is not None:
        if any(a is not None for a in (embedding, *weights)):
            raise ValueError("pass either embedding, w_q, w_k, w_v (the single-head model) or model=(config, weights)")
        if not (isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], ModelConfig)):
            raise TypeError(f"model must be (ModelConfig, weights), got {type(model).__name__}")
        dtype, config = check_weights(*model), model[0]
        eos = end_tokens(config, eos_token_id)
        vocab_size, d_k, d_v, output = config.vocab_size, config.head_dim, config.head_dim, ((), np.int64)
        heads, layers = config.num_key_value_heads, config.num_hidden_layers
    else:
        if eos_token_id is not None:
            raise ValueError(f"eos_token_id is for the model=(config, weights), got {eos_token_id!r} with the "
                             f"single head")
        eos = ()
        embedding, weights, dtype = _check_single_head(embedding, *weights)
        vocab_size, d_k, d_v, heads, layers = len(embedding), weights[1].shape[1], weights[2].shape[1], None, 1
        output = (d_v,), dtype  # an attention output [D_v] per step
    if cache is None:
        if num_blocks is None:
            raise TypeError("num_blocks must be given, the size of the pool serve makes, unless cache= is a pool")
        cache = PagedKVCache(as_size("num_blocks", num_blocks), 16 if block_size is None else block_size, d_k, d_v,
                             dtype, enable_prefix_caching=enable_prefix_caching, num_kv_heads=heads, num_layers=layers)
    else:
        check_cache_fits(cache, d_k, d_v, dtype, heads, layers, block_size=block_size, num_blocks=num_blocks,
                         enable_prefix_caching=enable_prefix_caching or None)
    specs = _check_requests(requests, vocab_size, cache, model is not None)
    seqs = [_Sequence(*spec, *output) for spec in specs]
    runner = _HeadRunner(cache, embedding, weights) if model is None else _ModelRunner(cache, model)
    return seqs, runner, Scheduler(seqs, cache.manager, max_num_batched_tokens, max_num_seqs, eos)


def _check_single_head(embedding, w_q, w_k, w_v):
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
    return embedding.astype(dtype, copy=False), (w_q, w_k, w_v), dtype


def _check_requests(requests, vocab_size, cache, generates):
    """One ``(request_id, token_ids, prompt_len, arrival_step, num_outputs)`` per request, or raise naming it."""
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests must be a list of Request, got {type(requests).__name__}")
    specs, seen, held = [], {}, set(cache.seq_ids)
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
        if request.request_id in seen or request.request_id in held:
            where = f"requests[{seen[request.request_id]}]" if request.request_id in seen else "a sequence in the cache"
            raise ValueError(f"{name} repeats the request_id of {where}")
        seen[request.request_id] = i
        specs.append(_check_request(name, request, vocab_size, cache, generates))
    return specs


def _check_request(name, request, vocab_size, cache, generates):
    tokens = as_token_ids(f"{name}: token_ids", request.token_ids)
    outside = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if outside.size:
        j = int(outside[0])
        raise ValueError(f"{name}: token_ids[{j}] = {tokens[j]} is not a row of the embedding: ids must be in [0, V={vocab_size})")
    prompt_len = len(tokens) if request.prompt_len is None else as_size(f"{name}: prompt_len", request.prompt_len, minimum=1)
    if not 1 <= prompt_len <= len(tokens):
        raise ValueError(f"{name}: prompt_len must be in [1, len(token_ids)={len(tokens)}], got {prompt_len}")
    num_outputs = len(tokens) - prompt_len + 1
    if request.max_tokens is not None:
        if not generates or prompt_len != len(tokens):
            raise ValueError(f"{name}: max_tokens is for the model, with token_ids the prompt (prompt_len None), "
                             f"got prompt_len={request.prompt_len!r}{'' if generates else ' and the single head'}")
        num_outputs = as_size(f"{name}: max_tokens", request.max_tokens, minimum=1)
    arrival_step = as_size(f"{name}: arrival_step", request.arrival_step)
    if arrival_step > _MAX_STEP:
        raise ValueError(f"{name}: arrival_step={arrival_step} is too large: at most 2**62")
    length = prompt_len + num_outputs - 1
    if math.ceil(length / cache.block_size) > cache.num_blocks:
        raise ValueError(f"{name} can never fit the pool: its {length} tokens need {math.ceil(length / cache.block_size)} "
                         f"blocks of block_size={cache.block_size}, and num_blocks={cache.num_blocks}")
    return request.request_id, tokens, prompt_len, arrival_step, num_outputs


def serve(requests, embedding=None, w_q=None, w_k=None, w_v=None, *, model=None, cache=None, block_size=None,
          num_blocks=None, max_num_batched_tokens, max_num_seqs=None, enable_prefix_caching=False,
          eos_token_id=None):
    """Serve ``requests`` (a list of :class:`Request`) to completion by the scheduler above: a :class:`ServeResult`.

    The single head (``embedding [V, D_model]``, ``w_q, w_k [D_model, D_k]``, ``w_v [D_model, D_v]``) or ``model=(config,
    weights)``, whose outputs equal ``generate(config, weights, [prompt], n, eos_token_id=...)[0, len(prompt):]``: a
    request stops at ``max_tokens`` or once it produced an end token, kept (``eos_token_id`` as generate's: an id or a
    list; None: the config's; ``[]``: none, vLLM's ``ignore_eos``). ``cache``: a
    :class:`~kv_attention.paged.PagedKVCache` to serve in (the model's: ``num_kv_heads`` and one layer per model
    layer), whose blocks and cached prefixes the requests share; it holds none of them afterwards, and is left as it
    was if the serve raises. Else a new one of ``block_size`` (default 16) and ``num_blocks`` (then required; every request
    must fit alone), with ``enable_prefix_caching``. ``max_num_batched_tokens`` >= 1: a step's budget; ``max_num_seqs``: the most
    running at once (default no limit). Outputs are in ``np.result_type`` of the weights; the caller's arrays are only
    read.
    """
    seqs, runner, scheduler = check_serve_inputs(requests, embedding, (w_q, w_k, w_v), model, cache, block_size,
                                                 num_blocks, max_num_batched_tokens, max_num_seqs,
                                                 enable_prefix_caching, eos_token_id)
    checkpoint = None if cache is None else cache.checkpoint()  # a pool of its own is dropped on failure
    try:
        while scheduler.has_requests():
            output = scheduler.schedule()
            scheduler.update_from_output(output, runner.execute_model(output))
    except BaseException:
        if checkpoint is not None:
            cache.restore(checkpoint)
        raise
    return ServeResult({s.request_id: s.outputs for s in seqs}, scheduler.stats())
