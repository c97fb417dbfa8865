"""The lab's own published figures ("Phase 2 Lab: Causal Attention, KV Cache 与 Batched Decode", its tables
"KV Cache 策略" and "两个 Sequence：顺序执行与 Batched 执行"), drawn beside this machine's (``report plots --lab``) and
quoted in the tables: the same problem on another machine and software, so compare ratios, not times.
"""

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
# T -> the batch speedup it published for B = 2 (sequential / batched of its unrounded medians).
BATCH_SPEEDUP = {16: 1.687, 32: 1.653, 64: 1.611, 128: 1.499, 256: 1.346}

