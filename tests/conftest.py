"""What every test run reports: the BLAS kernel it ran on (BLAS kernels differ between machines); where the library
keeps the plans it measures in the run: a temporary directory, not the user's cache."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def plans_in_a_temporary_cache(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    yield
    patch.undo()


def blas_kernel():
    """'openblas SkylakeX, 1 thread (OPENBLAS_CORETYPE unset)': threadpoolctl's view of numpy's BLAS in this run."""
    import os

    import numpy  # noqa: F401 (loads the BLAS that threadpoolctl inspects)
    from threadpoolctl import threadpool_info

    pools = [f"{p['internal_api']} {p.get('architecture') or '?'}, {p['num_threads']} thread(s)"
             for p in threadpool_info() if p["user_api"] == "blas"]
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"{'; '.join(pools) or 'no BLAS found'} (OPENBLAS_CORETYPE {forced or 'unset'})"


def pytest_report_header(config):
    return f"BLAS kernel: {blas_kernel()}"


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"BLAS kernel of this run: {blas_kernel()}")
