"""The lab's own published figures, drawn beside this machine's (``report plots --lab``) and quoted in the tables.

Copied as published from the README of the lab this project grew from ("Phase 2 Lab: Causal Attention, KV Cache
与 Batched Decode", its tables "KV Cache 策略" and "两个 Sequence：顺序执行与 Batched 执行"): the same problem
(float64, one head, d = 64, seed 42; median of 30 after 3 warm-ups) on another machine and software, so compare
shapes and ratios, not absolute times. It published nothing for the batch-size sweep, heads or ragged batches.
"""

SOURCE = ('the lab\'s README, "Phase 2 Lab: Causal Attention, KV Cache 与 Batched Decode": '
          "AMD Ryzen 7 9700X, CPython 3.14.7, NumPy 2.5.2, OpenBLAS 0.3.34 one thread, median of 30")
MACHINE = "Ryzen 7 9700X, NumPy 2.5.2"
LABEL = "lab (Ryzen 7 9700X, published)"

# T -> median ms of the whole decode of one sequence, per strategy (its "KV Cache 策略" table).
CACHE_MS = {
    16: {"no_cache": 0.271, "concat": 0.194, "preallocated": 0.180},
    32: {"no_cache": 0.567, "concat": 0.307, "preallocated": 0.282},
    64: {"no_cache": 1.740, "concat": 0.648, "preallocated": 0.577},
    128: {"no_cache": 7.765, "concat": 1.366, "preallocated": 1.174},
    256: {"no_cache": 40.592, "concat": 3.083, "preallocated": 2.509},
}
# T -> median ms of the whole decode of B = 2 sequences (its "顺序执行与 Batched 执行" table).
BATCH_MS = {
    16: {"sequential": 0.303, "batched": 0.180},
    32: {"sequential": 0.618, "batched": 0.374},
    64: {"sequential": 1.274, "batched": 0.791},
    128: {"sequential": 2.688, "batched": 1.793},
    256: {"sequential": 6.109, "batched": 4.540},
}

# T -> the speedup it published (sequential / batched of unrounded medians), and no_cache / preallocated.
BATCH_SPEEDUP = {16: 1.687, 32: 1.653, 64: 1.611, 128: 1.499, 256: 1.346}
NO_CACHE_SPEEDUP = {16: 1.51, 32: 2.01, 64: 3.02, 128: 6.61, 256: 16.18}


def ratio(table, numerator, denominator):
    """``(T list, ratios)``: ``numerator / denominator`` per T of ``table`` (CACHE_MS or BATCH_MS)."""
    return list(table), [table[t][numerator] / table[t][denominator] for t in table]
