"""Serving experiment: 32 requests through continuous batching over the paged cache; prefix caching on or off, an ample or a tight pool."""

from .serve_inputs import CACHING, POOLS, verified_serve


class Serve:
    """The whole ``serve`` of the workload of ``serve_inputs``: 32 requests, block_size 16, 256 tokens per step.

    One round of 3 to 5 samples: a serve takes about 0.15 s, and the experiment
    must add at most 10 s per commit. The counts are exact on any machine.
    """

    params = [list(CACHING), list(POOLS)]
    param_names = ["prefix_caching", "pool"]
    rounds = 1
    repeat = (3, 5, 0.5)
    warmup_time = 0
    timeout = 120

    def setup(self, prefix_caching, pool):
        self.serve, self.inputs, self.result = verified_serve(prefix_caching, pool)

    def time_serve(self, prefix_caching, pool):
        self.serve(*self.inputs)

    time_serve.version = "1"

    def track_steps(self, prefix_caching, pool):
        """Scheduler steps to serve every request."""
        return self.result.stats.steps

    track_steps.unit = "steps"
    track_steps.version = "1"

    def track_preemptions(self, prefix_caching, pool):
        """Requests preempted (by recompute) for want of a block."""
        return self.result.stats.preemptions

    track_preemptions.unit = "preemptions"
    track_preemptions.version = "1"

    def track_recomputed_tokens(self, prefix_caching, pool):
        """Tokens computed again after a preemption."""
        return self.result.stats.recomputed_tokens

    track_recomputed_tokens.unit = "tokens"
    track_recomputed_tokens.version = "1"

    def track_prefix_hit_tokens(self, prefix_caching, pool):
        """Tokens taken from the prefix cache instead of computed."""
        return self.result.stats.prefix_hit_tokens

    track_prefix_hit_tokens.unit = "tokens"
    track_prefix_hit_tokens.version = "1"

    def track_peak_blocks(self, prefix_caching, pool):
        """The most blocks of 16 tokens in use at once."""
        return self.result.stats.peak_blocks

    track_peak_blocks.unit = "blocks"
    track_peak_blocks.version = "1"
