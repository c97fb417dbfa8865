"""The lab's answers: its paired ratios and rates, asv's second suite (.asv/answers.conf.json, docs/benchmarking.md).

A paired ratio moves with the machine's load between two runs of the same code, beyond any one ``--factor``, so
these live apart from the regression suite (``benchmarks/``: timings, counts, bytes), in results of their own that
``asv compare`` and the Regressions page do not read. They share that suite's inputs, checks and pairing: its
package is registered here from the working tree, and only it (the repository root would shadow the commit's
``kv_attention``).
"""

import importlib.util
import pathlib
import sys

if "benchmarks" not in sys.modules:
    _suite = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    _spec = importlib.util.spec_from_file_location("benchmarks", _suite / "__init__.py",
                                                   submodule_search_locations=[str(_suite)])
    sys.modules["benchmarks"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["benchmarks"])
