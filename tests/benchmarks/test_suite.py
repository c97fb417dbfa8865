"""The suite as asv sees it: only benchmark modules and their inputs, each benchmark once, every version pinned."""

import importlib
import inspect
import re
from pathlib import Path

import pytest

import benchmarks

SUITE = Path(benchmarks.__file__).parent
INPUT_MODULES = {"__init__", "common", "counts", "heads_inputs", "prefill_inputs", "ragged_inputs",
                 "serve_inputs", "split_inputs"}
BENCHMARK_NAME = re.compile(r"^(Time|Timeraw|Track|Mem|PeakMem)[A-Z_]|^(time|timeraw|track|mem|peakmem)_")


def discovered():
    discovery = pytest.importorskip("asv_runner.discovery")
    return list(discovery.disc_benchmarks(str(SUITE)))


def test_benchmarks_holds_only_benchmark_modules_and_their_inputs():
    modules = {p.stem for p in SUITE.glob("*.py")}
    assert {m for m in modules if not m.startswith("bench_")} == INPUT_MODULES
    assert [p.name for p in SUITE.iterdir() if p.is_dir() and p.name != "__pycache__"] == []


def test_input_modules_define_nothing_asv_would_run():
    """asv imports every module under benchmarks/ and runs the functions and the methods of every class
    it finds in a module's namespace, imported ones included, whose names look like benchmarks (abstract
    classes, such as counts.Counts, and names starting with _ excepted)."""
    for name in sorted(INPUT_MODULES - {"__init__"}):
        module = importlib.import_module(f"benchmarks.{name}")
        names = [n for n in vars(module) if BENCHMARK_NAME.match(n)]
        classes = [v for k, v in vars(module).items()
                   if isinstance(v, type) and not inspect.isabstract(v) and not k.startswith("_")]
        names += [f"{c.__name__}.{n}" for c in classes for n in dir(c) if BENCHMARK_NAME.match(n)]
        assert names == [], module.__name__


def test_asv_discovers_each_benchmark_once_in_a_bench_module():
    names = [b.name for b in discovered()]
    assert names and len(names) == len(set(names))
    assert all(name.startswith("bench_") for name in names)


def test_every_benchmark_has_an_explicit_version():
    """asv derives a version from the code unless one is given, and ignores results of another version:
    an explicit version keeps stored results comparable when the code around a benchmark moves."""
    for benchmark in discovered():
        explicit = getattr(benchmark.func, "version", None) or getattr(benchmark._attr_sources[-1], "version", None)
        assert isinstance(explicit, str) and explicit == benchmark.version, benchmark.name


def test_retired_benchmarks_give_a_reason_and_are_gone_from_the_suite():
    """RETIRED lets a benchmark vanish without failing the gate; it must say why, and must not hide a live one."""
    from benchmarks.common import RETIRED

    live = {b.name for b in discovered()}
    for name, reason in RETIRED.items():
        assert isinstance(reason, str) and reason.strip(), name
        assert name.split("(")[0] not in live or "(" in name, f"{name} is retired but still in the suite"
