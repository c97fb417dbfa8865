"""The prefill experiment's answer: chunked over one-shot prefill per chunk size, paired."""

from benchmarks.bench_prefill import CHUNK_SIZES, PREFILL_LENGTH, verified_chunked
from benchmarks.common import timed_inputs
from benchmarks.ratios import Ratios, Side


class PrefillRatios(Ratios):
    """Chunked / one-shot prefill of ``x: [512, 64]`` per chunk size: ChunkedPrefill's calls timed in turns, paired."""

    params = [CHUNK_SIZES[:-1]]
    param_names = ["chunk_size"]

    def sides(self, chunk_size):
        return (Side(verified_chunked(PREFILL_LENGTH, chunk_size), timed_inputs(PREFILL_LENGTH)),
                Side(verified_chunked(PREFILL_LENGTH, CHUNK_SIZES[-1]), timed_inputs(PREFILL_LENGTH)))
