"""The suite as asv sees it: only benchmark modules and their inputs, each benchmark once, every version pinned."""

import importlib
import inspect
import re
import sys
from pathlib import Path

import benchmarks

from .conftest import asv_listing

SUITE = Path(benchmarks.__file__).parent
INPUT_MODULES = {"__init__", "common", "counts", "pairs", "ratios"}  # each experiment's inputs are in its bench module
BENCHMARK_NAME = re.compile(r"^(Time|Timeraw|Track|Mem|PeakMem)[A-Z_]|^(time|timeraw|track|mem|peakmem)_")


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
    names = list(asv_listing())
    assert names and all(name.startswith("bench_") for name in names)


def test_a_bench_module_that_imports_from_another_runs_only_its_own_benchmarks():
    """bench_split takes the heads problem from bench_heads: an imported class would run again under its name."""
    for name in asv_listing():
        module, *cls, _ = name.split(".")
        owner = getattr(importlib.import_module(f"benchmarks.{module}"), cls[0]) if cls else None
        assert owner is None or owner.__module__ == f"benchmarks.{module}", name


def test_every_benchmark_has_an_explicit_version():
    """asv derives a version from the code unless one is given, and ignores results of another version:
    an explicit version (the function's, else its class's) keeps stored results comparable when the code moves."""
    for name, listed in asv_listing().items():
        module, *cls, function = name.split(".")
        owner = importlib.import_module(f"benchmarks.{module}")
        owner = getattr(owner, cls[0]) if cls else owner
        explicit = getattr(getattr(owner, function), "version", None) or cls and getattr(owner, "version", None)
        assert isinstance(explicit, str) and explicit == listed["version"], name


def test_each_class_measured_once_has_a_setup_cache_of_its_own():
    """asv runs one setup_cache per key (module and line): classes sharing a key would share values. Shared
    on purpose: the count classes' one callgrind process, and the model classes' one read of the weights."""
    classes = {}
    for name, listed in asv_listing().items():
        if listed.get("setup_cache_key"):
            classes.setdefault(listed["setup_cache_key"], set()).add(name.rsplit(".", 1)[0])
    shared = {key: names for key, names in classes.items() if len(names) > 1}
    counts = next(names for names in shared.values() if "bench_cache.CacheCounts" in names)
    assert all(name.endswith("Counts") for name in counts) and len(counts) >= 8
    assert [names for names in shared.values() if names != counts] == [
        {"bench_model.ModelBatch", "bench_model.ModelBatchBLAS", "bench_model.ModelStep"}]
    assert {"bench_cache.CacheRatios", "bench_work.CacheWork", "bench_work.BatchWork"} <= {
        names.pop() for names in classes.values() if len(names) == 1}


def test_retired_benchmarks_give_a_reason_and_are_gone_from_the_suite():
    """RETIRED lets a benchmark vanish without failing the gate; it must say why, and must not hide a live one."""
    from benchmarks.common import RETIRED

    live = set(asv_listing())
    for name, reason in RETIRED.items():
        assert isinstance(reason, str) and reason.strip(), name
        assert name.split("(")[0] not in live or "(" in name, f"{name} is retired but still in the suite"


def test_at_a_commit_without_the_library_every_point_skips_and_none_fails(monkeypatch):
    # asv skips a point whose setup() raises NotImplementedError but FAILS one whose benchmark function
    # raises it; there only asv_runner's SkipNotImplemented skips. The prefill cache bytes once failed
    # all 12 points at the oldest commit this way. Here the commit has no kv_attention API at all.
    import itertools
    import types

    from asv_runner.benchmarks.mark import SkipNotImplemented

    from benchmarks.counts import Counts

    monkeypatch.setitem(sys.modules, "kv_attention", types.ModuleType("kv_attention"))
    failed = []
    for module in (importlib.import_module(f"benchmarks.{p.stem}") for p in sorted(SUITE.glob("bench_*.py"))):
        for cls in [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]:
            names = [n for n in dir(cls) if BENCHMARK_NAME.match(n)]
            if not names or cls.__name__.startswith("_") or issubclass(cls, Counts):  # Counts: see test_counts
                continue
            cache = (cls().setup_cache(),) if hasattr(cls, "setup_cache") else ()
            for point in itertools.product(*getattr(cls, "params", [])):
                bench = cls()
                try:
                    bench.setup(*cache, *point)
                except NotImplementedError:
                    continue
                for name in names:
                    try:
                        getattr(bench, name)(*cache, *point)
                    except SkipNotImplemented:
                        pass
                    except NotImplementedError as error:
                        failed.append(f"{cls.__name__}.{name}{point}: {error}")
    assert not failed, failed


def test_a_benchmark_function_never_raises_a_plain_not_implemented_error():
    # asv skips a point whose setup() raises NotImplementedError but FAILS one whose benchmark function does:
    # there, only asv_runner's SkipNotImplemented skips (as the prefill cache bytes learned at the oldest commit).
    import ast

    offenders = []
    for path in sorted(Path(benchmarks.__file__).parent.glob("bench_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and re.match(r"(time|track|peakmem|mem)_", node.name):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Raise) and "NotImplementedError" in ast.unparse(inner.exc or inner):
                        offenders.append(f"{path.name}:{inner.lineno} in {node.name}")
    assert not offenders, offenders
