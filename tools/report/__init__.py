"""The lab's tables, raw samples and plots, from asv's result files (``python3 tools/dev.py report ...``).

EXPERIMENTS (here, so that the command line lists them without importing the suite): a table's name -> the
benchmark it rests on (asv's timing, or the paired ratio where the table shows paired figures only).
"""

FIGURES = ("batch_per_step", "model")  # report plots: one PNG each (tools/report/plots.py)
EXPERIMENTS = {
    "cache": "bench_cache.CacheRatios.track_ratio",
    "batch": "bench_batch.BatchRatios.track_ratio",
    "batch_size": "bench_batch.BatchSize.time_batched_decode",
    "heads": "bench_heads.HeadsDecode.time_decode",
    "ragged": "bench_ragged.RaggedDecode.time_decode",
    "roofline": "bench_roofline.Roofline.track_ratio",  # no timing: its paired bandwidth fraction
    "quantized": "bench_quantized.QuantizedDecode.time_decode",
    "beyond": "bench_roofline.Roofline.track_ratio",  # one headline per experiment beyond the lab
    "model": "bench_model.ModelStep.track_ratio",  # a decode step at SmolLM-135M's shape
    "model_batch": "bench_model.ModelBatch.track_ratio",
    "speculative": "bench_speculative.SpeculativeRatios.track_ratio",  # prompt lookup on the real model
}
