"""kv_attention.products: every formulation is the one product, and the plans are kept per machine, robustly."""

import json
import os

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from kv_attention import products


@pytest.fixture(autouse=True)
def fresh_plans(tmp_path, monkeypatch):
    """Plans in tmp_path's cache, none measured or read yet; set_threads undone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    products._kept.cache_clear(), products.choice.cache_clear()
    yield tmp_path / "kv_attention" / "plans.json"
    products._kept.cache_clear(), products.choice.cache_clear()
    products.set_threads(None)


def bound(x, w):
    """Rounding bound of a dot product of ``in`` terms, any order: in · eps · (|x| @ |w|ᵀ) (Higham, 3.1)."""
    return x.shape[-1] * np.finfo(np.result_type(x, w)).eps * (np.abs(x) @ np.abs(w).T)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
@pytest.mark.parametrize("name", list(products.FORMULATIONS))
def test_every_formulation_is_the_one_product(name, rows, dtype):
    rng = np.random.default_rng(rows)
    x, w = rng.standard_normal((rows, 70)).astype(dtype), rng.standard_normal((150, 70)).astype(dtype)  # 150: 64+64+22
    out = np.full((rows, 150), np.nan, dtype)
    products.FORMULATIONS[name](x, w, out)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.all(np.abs(out - exact) <= bound(x, w))


@pytest.mark.parametrize("shape", [(0, 3, 70), (1, 1, 70), (2, 4, 70), (3, 7, 70), (17, 70)])
def test_linear_takes_any_leading_shape_and_planned_formulation(shape):
    rng = np.random.default_rng(len(shape))
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((150, 70)).astype(np.float32)
    got = products.linear(x, w)
    exact = np.einsum("...i,oi->...o", x.astype(np.float64), w.astype(np.float64))
    assert got.shape == shape[:-1] + (150,) and got.dtype == np.float32
    assert np.all(np.abs(got - exact) <= bound(x, w))


def fake_clock(monkeypatch, cost):
    """perf_counter advanced only by calls made through the returned ``call(name)``, by ``cost[name]`` each."""
    now = [0.0]
    monkeypatch.setattr(products.time, "perf_counter", lambda: now[0])

    def call(name):
        now[0] += cost[name]

    return call


def test_plan_takes_the_least_median_and_keeps_it_in_the_process_and_the_file(monkeypatch, fresh_plans):
    call = fake_clock(monkeypatch, {"a": 3.0, "b": 1.0, "c": 2.0})
    calls = lambda: {n: (lambda n=n: call(n)) for n in "abc"}  # noqa: E731
    assert products.plan("entry", list("abc"), calls) == "b"
    assert json.loads(fresh_plans.read_text()) == {products.machine_key(): {"entry": "b"}}
    assert products.plan("entry", list("abc"), None) == "b"  # kept: not measured again (None is not called)
    products._kept.cache_clear()
    assert products.plan("entry", list("abc"), None) == "b"  # a new process reads it from the file


def test_the_file_is_keyed_by_machine_and_blas(monkeypatch, fresh_plans):
    key = products.machine_key()
    assert products.np.__version__ in key and all(i["internal_api"] in key for i in threadpool_info()
                                                  if i["user_api"] == "blas")
    fresh_plans.parent.mkdir(parents=True)
    fresh_plans.write_text(json.dumps({"another CPU; openblas 0.3 Haswell; numpy 1.0": {"entry": "a"}}))
    call = fake_clock(monkeypatch, {"a": 3.0, "b": 1.0})
    assert products.plan("entry", ["a", "b"], lambda: {n: (lambda n=n: call(n)) for n in "ab"}) == "b"
    assert json.loads(fresh_plans.read_text()) == {"another CPU; openblas 0.3 Haswell; numpy 1.0": {"entry": "a"},
                                                   key: {"entry": "b"}}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k": 3}', None])
def test_a_corrupt_or_stale_file_is_measured_again_and_rewritten(monkeypatch, fresh_plans, content):
    fresh_plans.parent.mkdir(parents=True)
    fresh_plans.write_text(content or json.dumps({products.machine_key(): {"entry": "gone"}}))  # None: a stale name
    call = fake_clock(monkeypatch, {"a": 3.0, "b": 1.0})
    assert products.plan("entry", ["a", "b"], lambda: {n: (lambda n=n: call(n)) for n in "ab"}) == "b"
    assert json.loads(fresh_plans.read_text())[products.machine_key()] == {"entry": "b"}


def test_an_unwritable_cache_keeps_the_plan_in_the_process(monkeypatch, tmp_path):
    (tmp_path / "kv_attention").write_text("a file where the directory would be")
    call = fake_clock(monkeypatch, {"a": 3.0, "b": 1.0})
    assert products.plan("entry", ["a", "b"], lambda: {n: (lambda n=n: call(n)) for n in "ab"}) == "b"
    assert products.plan("entry", ["a", "b"], None) == "b"


def test_choice_measures_every_formulation_on_copies_of_the_shape(monkeypatch):
    seen = []
    monkeypatch.setattr(products, "plan", lambda entry, names, calls: seen.append((entry, names, calls())) or "one")
    assert products.choice(150, 70, np.dtype(np.float32), 3, 1) == "one"
    (entry, names, calls), = seen
    assert entry == "150x70 float32 3 rows 1 threads" and names == ["one", "blocks", "per_row"] == list(calls)
    x, ws, y = products._stream(3, (150, 70), np.dtype(np.float32))
    assert x.shape == (3, 70) and ws.shape == (256, 150, 70) and y.shape == (3, 150)  # 256 copies of 42 KB: the cap


def blas_threads_now():
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_blas_threads_runs_at_the_chosen_count_and_respects_the_callers():
    run = products.blas_threads(blas_threads_now)
    products.set_threads(1)
    assert set(run()) == {1} and products.threads() == 1
    products.set_threads(None)
    with threadpool_limits(limits=1):  # a caller's own limit: left as it is
        assert products.threads() is None and set(run()) == {1}
    with pytest.raises(ValueError, match="threads"):
        products.set_threads(0)
    with pytest.raises(TypeError, match="threads"):
        products.set_threads("2")
    products.set_threads(1)
    with pytest.raises(ValueError, match="at most this machine's"):  # more than the CPUs only take turns on them
        products.set_threads((os.cpu_count() or 1) + 1)
    assert products.threads() == 1  # the refused count changed nothing


def test_the_default_count_is_the_plans_unless_a_variable_chose(monkeypatch, fresh_plans):
    if products._threads_now() != products._DEFAULT or max(products._DEFAULT, default=1) < 2:
        pytest.skip("the BLAS runs one thread here, or a variable chose its count")
    n = max(products._DEFAULT)
    fresh_plans.parent.mkdir(parents=True)
    fresh_plans.write_text(json.dumps({products.machine_key(): {f"BLAS threads of {n}": "1"}}))
    for variable in products.THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert products.threads() == 1 and set(products.blas_threads(blas_threads_now)()) == {1}
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert products.threads() is None


def test_the_commands_threads_option_sets_the_count(monkeypatch, capsys):
    from kv_attention import __main__ as cli

    for bad in ("0", "1000"):
        with pytest.raises(SystemExit):
            cli.parse_args(["hi", "--threads", bad])
        assert f"--threads must be from 1 to this machine's {os.cpu_count() or 1} CPUs, got {bad}" \
            in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(cli, "answer", lambda *args, **kwargs: seen.append(products.threads()))
    assert cli.main(["hi", "--threads", "1"]) == 0 and seen == [1]


def test_prepare_plans_every_row_count_of_each_shape_once_announcing_only_a_measurement(monkeypatch, fresh_plans):
    measured, announced = [], []
    real_plan = products.plan

    def plan(entry, names, calls):
        measured.append(entry) if products._kept().get(entry) not in names else None
        return real_plan(entry, names, lambda: {name: lambda: None for name in names})  # no time spent here

    monkeypatch.setattr(products, "plan", plan)
    products.set_threads(1)
    products.prepare([(8, 4), (4, 8), (8, 4)], np.float32, announce=lambda: announced.append(1))
    assert sorted(measured) == sorted(f"{s} float32 {n} rows 1 threads" for s in ("8x4", "4x8")
                                      for n in range(1, products.MAX_PLANNED + 1))
    assert announced == [1]  # once, before the first
    products._kept.cache_clear(), products.choice.cache_clear()
    measured.clear()
    products.prepare([(8, 4), (4, 8)], np.float32, announce=lambda: announced.append(2))
    assert measured == [] and announced == [1]  # all read from the file: nothing said
