"""Serving experiment: 32 requests through continuous batching over the paged cache; prefix caching on or off, an ample or a tight pool."""

from .common import Benchmark, check_points, replay
from .serve_inputs import CACHING, POOLS, serve_counts, verified_serve


class Serve(Benchmark):
    """The whole ``serve`` of the workload of ``serve_inputs``: 32 requests, block_size 16, 256 tokens per step.

    One round of 3 to 5 samples: a serve takes about 0.15 s, and the experiment
    must add at most 10 s per commit.
    """

    params = [list(CACHING), list(POOLS)]
    param_names = ["prefix_caching", "pool"]
    rounds = 1
    repeat = (3, 5, 0.4)
    warmup_time = 0

    def setup(self, prefix_caching, pool):
        self.serve, self.inputs, _ = verified_serve(prefix_caching, pool)

    def time_serve(self, prefix_caching, pool):
        self.serve(*self.inputs)

    time_serve.version = "1"


class ServeCounts(Benchmark):
    """What the serve of each point did, counted: exact on any machine, and one checked serve per point in all.

    ``setup_cache`` serves each point once, through the correctness check, in
    one process; the 20 track_ points then read the counts instead of serving
    again (a serve takes about 0.15 s, and the experiment must add at most 10 s per commit).
    """

    params = [list(CACHING), list(POOLS)]
    param_names = ["prefix_caching", "pool"]

    def setup_cache(self):
        return check_points(self.params, serve_counts)

    def setup(self, counts, prefix_caching, pool):
        self.counts = replay(counts, (prefix_caching, pool))

    def track_steps(self, counts, prefix_caching, pool):
        """Scheduler steps to serve every request."""
        return self.counts["steps"]

    track_steps.unit = "steps"
    track_steps.version = "1"

    def track_preemptions(self, counts, prefix_caching, pool):
        """Requests preempted (by recompute) for want of a block."""
        return self.counts["preemptions"]

    track_preemptions.unit = "preemptions"
    track_preemptions.version = "1"

    def track_recomputed_tokens(self, counts, prefix_caching, pool):
        """Tokens computed again after a preemption."""
        return self.counts["recomputed_tokens"]

    track_recomputed_tokens.unit = "tokens"
    track_recomputed_tokens.version = "1"

    def track_prefix_hit_tokens(self, counts, prefix_caching, pool):
        """Tokens taken from the prefix cache instead of computed."""
        return self.counts["prefix_hit_tokens"]

    track_prefix_hit_tokens.unit = "tokens"
    track_prefix_hit_tokens.version = "1"

    def track_peak_blocks(self, counts, prefix_caching, pool):
        """The most blocks of 16 tokens in use at once."""
        return self.counts["peak_blocks"]

    track_peak_blocks.unit = "blocks"
    track_peak_blocks.version = "1"
