"""What the measurements stand on: the BLAS thread count and the interpreter's baseline memory."""

import numpy  # noqa: F401  (loads the BLAS library that threadpoolctl inspects)


def track_blas_threads():
    """Largest thread count of any BLAS/OpenMP pool in the benchmark process (1 when pinned)."""
    from threadpoolctl import threadpool_info

    return max((pool["num_threads"] for pool in threadpool_info()), default=0)


track_blas_threads.unit = "threads"
# pinned asv hash (9108790): the largest BLAS/OpenMP pool of a benchmark process
track_blas_threads.version = "944f4b140301e1847ae0c9ef2bd3974000055c61c3a6078f216d03abedb0626a"


def peakmem_reference():
    """Peak memory of a benchmark process that loaded what every correctness check loads and decoded nothing.

    The floor under every ``peakmem_``: interpreter, numpy, numpy.testing,
    threadpoolctl and kv_attention. A ``peakmem_decode`` minus this is the
    decode's own memory plus the check's oracle temporaries.
    """
    import numpy.testing  # noqa: F401

    import kv_attention  # noqa: F401

    from .common import check_single_threaded

    check_single_threaded()


# pinned asv hash (9108790): peak RSS of a process that loaded what the checks load
peakmem_reference.version = "3d86f98a60583af5bc88ec64d157930e37c65d2f53dda71d60c43df912e57b95"
