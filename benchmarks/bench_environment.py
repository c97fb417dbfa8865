"""What the measurements stand on: the BLAS thread count and the interpreter's baseline memory."""

import numpy  # noqa: F401  (loads the BLAS library that threadpoolctl inspects)


def track_blas_threads():
    """Largest thread count of any BLAS/OpenMP pool in the benchmark process (1 when pinned)."""
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info()), default=0)


track_blas_threads.unit = "threads"


def peakmem_reference():
    """Peak memory of a benchmark process that loaded what every gate loads and decoded nothing.

    The floor under every ``peakmem_``: interpreter, numpy, numpy.testing,
    threadpoolctl and kv_attention. A ``peakmem_decode`` minus this is the
    decode's own memory plus the gate's oracle temporaries.
    """
    import numpy.testing  # noqa: F401

    import kv_attention  # noqa: F401

    from .common import check_single_threaded

    check_single_threaded()
