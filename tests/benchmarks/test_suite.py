"""The two suites as asv sees them (benchmarks/, the regression suite, and answers/, the lab's answers): only
benchmark modules and their inputs, each benchmark once, every version pinned, every paired ratio an answer."""

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks.ratios import Ratios

from .conftest import asv_listing

SUITE = Path(benchmarks.__file__).parent
SUITES = {"benchmarks": SUITE, "answers": SUITE.parent / "answers"}
INPUT_MODULES = {"__init__", "common", "counts", "pairs", "ratios"}  # each experiment's inputs are in its bench module
ANSWERS = {"CacheRatios", "BatchRatios", "BatchSizeRatios", "CheckFiniteRatios", "HeadsRatios", "PrefillRatios",
           "QuantizedRatios", "FusedRatios", "RaggedRatios", "PagedStepRatios", "SplitRatios", "CascadeRatios",
           "Roofline", "ModelStep", "ModelBatch", "ModelBatchBLAS", "SpeculativeRatios"}
BENCHMARK_NAME = re.compile(r"^(Time|Timeraw|Track|Mem|PeakMem)[A-Z_]|^(time|timeraw|track|mem|peakmem)_")


@pytest.mark.parametrize("suite, inputs", [("benchmarks", INPUT_MODULES), ("answers", {"__init__"})])
def test_a_suite_holds_only_benchmark_modules_and_their_inputs(suite, inputs):
    modules = {p.stem for p in SUITES[suite].glob("*.py")}
    assert {m for m in modules if not m.startswith("bench_")} == inputs
    assert [p.name for p in SUITES[suite].iterdir() if p.is_dir() and p.name != "__pycache__"] == []


def test_every_paired_ratio_is_an_answer_and_answers_registers_only_the_working_trees_benchmarks():
    """asv compare judges a tracked value by one factor and no samples: a paired ratio, which moves with the load,
    is the answers suite's. Its package adds nothing to sys.path (the root would shadow the commit's kv_attention)."""
    defined = {suite: {c.__name__ for path in sorted(SUITES[suite].glob("bench_*.py"))
                       for c in vars(importlib.import_module(f"{suite}.{path.stem}")).values()
                       if isinstance(c, type) and issubclass(c, Ratios) and c.__module__ == f"{suite}.{path.stem}"}
               for suite in SUITES}
    assert defined == {"benchmarks": set(), "answers": ANSWERS}
    code = ("import importlib.util, sys; before = list(sys.path); "
            f"spec = importlib.util.spec_from_file_location('answers', {str(SUITES['answers'] / '__init__.py')!r}, "
            f"submodule_search_locations=[{str(SUITES['answers'])!r}]); "
            "sys.modules['answers'] = module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
            "import answers.bench_cache; "
            "print(sys.path == before, sys.modules['benchmarks'].__file__, 'kv_attention' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=SUITE.parent / "tests", capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", str(SUITE / "__init__.py"), "False"]


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


@pytest.mark.parametrize("suite", SUITES)
def test_asv_discovers_each_benchmark_once_in_a_bench_module(suite):
    names = list(asv_listing(suite))
    assert names and all(name.startswith("bench_") for name in names)


@pytest.mark.parametrize("suite", SUITES)
def test_a_bench_module_that_imports_from_another_runs_only_its_own_benchmarks(suite):
    """bench_split takes the heads problem from bench_heads: an imported class would run again under its name."""
    for name in asv_listing(suite):
        module, *cls, _ = name.split(".")
        owner = getattr(importlib.import_module(f"{suite}.{module}"), cls[0]) if cls else None
        assert owner is None or owner.__module__ == f"{suite}.{module}", name


@pytest.mark.parametrize("suite", SUITES)
def test_every_benchmark_has_an_explicit_version(suite):
    """asv derives a version from the code unless one is given, and ignores results of another version:
    an explicit version (the function's, else its class's) keeps stored results comparable when the code moves."""
    for name, listed in asv_listing(suite).items():
        module, *cls, function = name.split(".")
        owner = importlib.import_module(f"{suite}.{module}")
        owner = getattr(owner, cls[0]) if cls else owner
        explicit = getattr(getattr(owner, function), "version", None) or cls and getattr(owner, "version", None)
        assert isinstance(explicit, str) and explicit == listed["version"], name


def test_each_class_measured_once_has_a_setup_cache_of_its_own():
    """asv runs one setup_cache per key (module and line): classes sharing a key would share values. Shared
    on purpose: the count classes' one callgrind process, and the model answers' one read of the weights."""
    classes = {}
    for suite in SUITES:
        for name, listed in asv_listing(suite).items():
            if listed.get("setup_cache_key"):
                classes.setdefault((suite, listed["setup_cache_key"]), set()).add(name.rsplit(".", 1)[0])
    shared = {key: names for key, names in classes.items() if len(names) > 1}
    counts = next(names for names in shared.values() if "bench_cache.CacheCounts" in names)
    assert all(name.endswith("Counts") for name in counts) and len(counts) >= 8
    assert [names for names in shared.values() if names != counts] == [
        {"bench_model.ModelBatch", "bench_model.ModelBatchBLAS", "bench_model.ModelStep"}]
    assert {"bench_cache.CacheRatios", "bench_work.CacheWork", "bench_work.BatchWork"} <= {
        names.pop() for names in classes.values() if len(names) == 1}


def test_retired_benchmarks_give_a_reason_and_are_gone_from_the_suite():
    """RETIRED lets a benchmark vanish without failing the gate; it must say why, and must not hide a live one.
    Every answer left the regression suite's results, so every one is there."""
    from benchmarks.common import RETIRED

    live = set(asv_listing())
    for name, reason in RETIRED.items():
        assert isinstance(reason, str) and reason.strip(), name
        assert name.split("(")[0] not in live or "(" in name, f"{name} is retired but still in the suite"
    assert set(asv_listing("answers")) <= set(RETIRED)


@pytest.mark.parametrize("suite", SUITES)
def test_at_a_commit_without_the_library_every_point_skips_and_none_fails(suite, monkeypatch):
    # asv skips a point whose setup() raises NotImplementedError but FAILS one whose benchmark function
    # raises it; there only asv_runner's SkipNotImplemented skips. The prefill cache bytes once failed
    # all 12 points at the oldest commit this way. Here the commit has no kv_attention API at all.
    import itertools
    import types

    from asv_runner.benchmarks.mark import SkipNotImplemented

    from benchmarks.counts import Counts

    monkeypatch.setitem(sys.modules, "kv_attention", types.ModuleType("kv_attention"))
    failed = []
    for module in (importlib.import_module(f"{suite}.{p.stem}") for p in sorted(SUITES[suite].glob("bench_*.py"))):
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


@pytest.mark.parametrize("suite", SUITES)
def test_a_benchmark_function_never_raises_a_plain_not_implemented_error(suite):
    # asv skips a point whose setup() raises NotImplementedError but FAILS one whose benchmark function does:
    # there, only asv_runner's SkipNotImplemented skips (as the prefill cache bytes learned at the oldest commit).
    import ast

    offenders = []
    for path in sorted(SUITES[suite].glob("bench_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and re.match(r"(time|track|peakmem|mem)_", node.name):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Raise) and "NotImplementedError" in ast.unparse(inner.exc or inner):
                        offenders.append(f"{path.name}:{inner.lineno} in {node.name}")
    assert not offenders, offenders
