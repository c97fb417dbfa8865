"""The drills' injected code and output parsing (tools/commands/noise.py); the drills themselves run asv in clones."""

import numpy as np

from tools.commands import noise


def injected(fraction, iterations, per_step):
    """Run noise.WORK on a stand-in decode: ``(namespace, calls)``, calls the loop lengths it ran."""
    calls = []

    def decode(x, w):
        return x @ w

    namespace = {"decode": decode}
    code = noise.WORK.format(name="decode", iterations=iterations, per_step=per_step, percent=100 * fraction)
    exec(compile(code.replace("range(", "_range("), "<injected>", "exec"), namespace)
    namespace["_range"] = lambda n: calls.append(n) or range(n)
    return namespace, calls


def test_the_injected_work_keeps_the_output_and_sizes_the_loop_by_shape():
    namespace, calls = injected(0.02, {(16,): 300, (64,): 1200}, {(): 1200 / 64})
    x, w = np.arange(64 * 4.0).reshape(64, 4), np.eye(4) * 2
    np.testing.assert_array_equal(namespace["decode"](x, w), x @ w)  # the real work, unchanged
    namespace["decode"](x[:16], w)
    namespace["decode"](x[:32], w)  # a length no count point has: 1200 / 64 per step
    assert calls == [1200, 300, 600]


def test_batched_shapes_look_up_their_own_lead_dimensions():
    namespace, calls = injected(0.01, {(2, 64): 500, (8, 128): 4000}, {(2,): 500 / 64, (8,): 4000 / 128})
    namespace["decode"](np.ones((2, 32, 4)), np.eye(4))
    namespace["decode"](np.ones((8, 128, 4)), np.eye(4))
    namespace["decode"](np.ones((3, 10, 4)), np.eye(4))  # no such batch counted: no extra work
    assert calls == [250, 4000, 0]


def test_flagged_names_the_points_without_their_channel():
    output = ("REGRESSION 1.0213x  bench_cache.CacheCounts.track_instructions(64, 'concat')  (work changed)\n"
              "REGRESSION 1.32x  bench_cache.CacheStrategy.time_decode(256, 'concat')  (time changed, work did not)\n"
              "gate: exit 1\n")
    assert noise.flagged(output) == ["bench_cache.CacheCounts.track_instructions(64, 'concat')",
                                     "bench_cache.CacheStrategy.time_decode(256, 'concat')"]


def test_points_belong_to_their_strategy_and_the_sweep_to_batched():
    assert noise.belongs("bench_cache.CacheCounts.track_instructions(64, 'concat')", "concat")
    assert not noise.belongs("bench_cache.CacheCounts.track_instructions(64, 'no_cache')", "concat")
    assert noise.belongs("bench_batch.BatchSizeCounts.track_instructions(8)", "batched")
    assert not noise.belongs("bench_batch.BatchSizeCounts.track_instructions(8)", "sequential")


def test_the_aa_drill_reads_the_gates_paired_lines():
    output = "\n".join([
        "[pairs] 1/3 bench_cache.CacheStrategy.time_decode(16, 'concat'): 1.0021x [0.9987, 1.0050], 40 pairs",
        "[pairs] 2/3 bench_split.SplitDecode.time_decode(None): 0.9950x [-inf, inf], 5 pairs",
        "REGRESSION 1.05x  bench_x.time_y  (time changed, work did not)",
    ])
    assert noise.paired_ratios(output) == {"bench_cache.CacheStrategy.time_decode(16, 'concat')": 1.0021,
                                           "bench_split.SplitDecode.time_decode(None)": 0.995}
