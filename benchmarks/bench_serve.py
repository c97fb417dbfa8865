"""Serving experiment: 32 requests through continuous batching over the paged cache; prefix caching on or off, an ample or a tight pool.

The workload (32 requests sharing a 64-token system prompt), its oracle and
its check live here, in the suite, not in ``kv_attention``, for the reason given in
``common.py``. Everything is drawn from its own ``default_rng(42)``, in this
order: the embedding ``[512, 64]`` (standard normal), w_q, w_k, w_v ``[64, 64]``
(variance 1/64), the system prompt's 64 token ids, then for each request its
user prompt's length (16..64), its decoded length (16..64) and their token
ids. Request i arrives at scheduler step i // 2, so arrivals spread over the
first 16 steps. Each step has a budget of 256 tokens; blocks hold 16.
"""

import functools
import math

import numpy as np

from .common import Benchmark, Measured, library_function, oracle, read_only, verified_decode

SEED = 42
VOCAB, D_MODEL = 512, 64  # V, and D_model = D_k = D_v as in the rest of the suite
N_REQUESTS, SYSTEM_LEN = 32, 64
USER_LENGTHS = DECODE_LENGTHS = (16, 64)  # inclusive ranges
BLOCK_SIZE, BUDGET = 16, 256  # tokens per block; max_num_batched_tokens
CACHING = {"off": False, "on": True}  # asv parameter value -> enable_prefix_caching
TIGHT_POOL = 64  # blocks: a fifth of the ample pool, so that requests are preempted with and without caching


@functools.lru_cache(maxsize=None)
def workload():
    """``(specs, embedding, w_q, w_k, w_v)``: specs a tuple of ``(token_ids, prompt_len, arrival_step)``, read-only."""
    rng = np.random.default_rng(SEED)
    embedding = rng.standard_normal((VOCAB, D_MODEL))
    weights = [rng.standard_normal((D_MODEL, D_MODEL)) / math.sqrt(D_MODEL) for _ in range(3)]
    system = rng.integers(0, VOCAB, SYSTEM_LEN).tolist()
    specs = []
    for i in range(N_REQUESTS):
        user, decoded = (int(rng.integers(low, high + 1)) for low, high in (USER_LENGTHS, DECODE_LENGTHS))
        token_ids = system + rng.integers(0, VOCAB, user + decoded).tolist()
        specs.append((tuple(token_ids), SYSTEM_LEN + user, i // 2))
    return (tuple(specs), *read_only(embedding, *weights))


def pool_blocks(pool):
    """``"ample"``: every request at full length at once, sum of ceil(L / 16); ``"tight"``: TIGHT_POOL."""
    if pool == "tight":
        return TIGHT_POOL
    return sum(math.ceil(len(token_ids) / BLOCK_SIZE) for token_ids, _, _ in workload()[0])


POOLS = {"ample": pool_blocks("ample"), "tight": TIGHT_POOL}  # asv parameter value -> num_blocks


def serve_oracle(specs, embedding, w_q, w_k, w_v):
    """Each request alone through the suite's full causal attention, from its last prompt position on."""
    return [oracle(embedding[list(token_ids)], w_q, w_k, w_v)[prompt_len - 1 :] for token_ids, prompt_len, _ in specs]


def serve_function(caching, pool):
    """The commit's ``serve`` bound to the experiment's options; NotImplementedError if it has none."""
    import kv_attention

    serve = library_function("serve")
    if not hasattr(kv_attention, "Request"):
        raise NotImplementedError("kv_attention has no Request at this commit")
    options = {"block_size": BLOCK_SIZE, "num_blocks": POOLS[pool], "max_num_batched_tokens": BUDGET}
    return functools.partial(serve, enable_prefix_caching=CACHING[caching], **options)


@functools.lru_cache(maxsize=None)
def serve_inputs():
    """``(requests, embedding, w_q, w_k, w_v)``: the workload as the commit's ``Request`` objects."""
    import kv_attention

    specs, *arrays = workload()
    requests = [kv_attention.Request(i, list(ids), prompt_len, arrival) for i, (ids, prompt_len, arrival) in
                enumerate(specs)]
    return (requests, *arrays)


@functools.lru_cache(maxsize=None)  # for the life of the process; an outcome that raised is not kept
def verified_serve(caching, pool):
    """``(serve, inputs, result)``: serve bound to the options, once every request matched :func:`serve_oracle`.

    ``result`` is the checked run's ``ServeResult``, whose counts the track_
    benchmarks report. Outcomes as :func:`common.verified_decode`.
    """
    serve, inputs, runs = serve_function(caching, pool), serve_inputs(), []

    def outputs(requests, *arrays):
        runs.append(serve(requests, *arrays))
        return [runs[-1].outputs.get(r.request_id) for r in requests]

    verified_decode(f"serve, prefix caching {caching}, {pool} pool", outputs, inputs,
                    lambda *_: serve_oracle(*workload()))
    return serve, inputs, runs[-1] if runs else serve(*inputs)


COUNTS = ("steps", "preemptions", "recomputed_tokens", "prefix_hit_tokens", "peak_blocks")


def serve_counts(caching, pool):
    """The counts (:data:`COUNTS` -> int) of the checked serve of a point; raises as :func:`verified_serve`."""
    _, _, result = verified_serve(caching, pool)
    return {name: int(getattr(result.stats, name)) for name in COUNTS}


class Serve(Benchmark):
    """The whole ``serve`` of the workload (:func:`workload`): 32 requests, block_size 16, 256 tokens per step.

    No warm-up: a serve takes about 0.15 s, and the experiment must add at most 10 s per commit.
    """

    params = [list(CACHING), list(POOLS)]
    param_names = ["prefix_caching", "pool"]
    warmup_time = 0

    def setup(self, prefix_caching, pool):
        self.serve, self.inputs, _ = verified_serve(prefix_caching, pool)

    def time_serve(self, prefix_caching, pool):
        self.serve(*self.inputs)

    time_serve.version = "1"


class ServeCounts(Measured):
    """What the serve of each point did, counted: exact on any machine, and one checked serve per point in all.

    ``setup_cache`` serves each point once, through the correctness check, in
    one process; the 20 track_ points then read the counts instead of serving
    again (a serve takes about 0.15 s, and the experiment must add at most 10 s per commit).
    """

    params = [list(CACHING), list(POOLS)]
    param_names = ["prefix_caching", "pool"]

    measure = staticmethod(serve_counts)

    def track_steps(self, measured, prefix_caching, pool):
        """Scheduler steps to serve every request."""
        return self.measured["steps"]

    track_steps.unit = "steps"
    track_steps.version = "1"

    def track_preemptions(self, measured, prefix_caching, pool):
        """Requests preempted (by recompute) for want of a block."""
        return self.measured["preemptions"]

    track_preemptions.unit = "preemptions"
    track_preemptions.version = "1"

    def track_recomputed_tokens(self, measured, prefix_caching, pool):
        """Tokens computed again after a preemption."""
        return self.measured["recomputed_tokens"]

    track_recomputed_tokens.unit = "tokens"
    track_recomputed_tokens.version = "1"

    def track_prefix_hit_tokens(self, measured, prefix_caching, pool):
        """Tokens taken from the prefix cache instead of computed."""
        return self.measured["prefix_hit_tokens"]

    track_prefix_hit_tokens.unit = "tokens"
    track_prefix_hit_tokens.version = "1"

    def track_peak_blocks(self, measured, prefix_caching, pool):
        """The most blocks of 16 tokens in use at once."""
        return self.measured["peak_blocks"]

    track_peak_blocks.unit = "blocks"
    track_peak_blocks.version = "1"
