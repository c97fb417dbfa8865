"""The gate's paired timings (tools/pairs.py) with stand-in workers: verdicts, a worker that stops, the layout."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from tools import pairs


class FakeWorker:
    """A worker whose samples are ``cost`` seconds each, ``stops`` at the point named so."""

    def __init__(self, cost, stops=None):
        self.cost, self.stops = cost, stops
        self.process = SimpleNamespace(poll=lambda: None, pid=0)
        self.stopped = False

    def ask(self, load=None, param_idx=None, number=None):
        if load == self.stops:
            self.process = SimpleNamespace(poll=lambda: -9, pid=0)
            raise pairs.common.UserError("the worker stopped (exit -9; see its output above)")
        if load == "skips":
            return {"skipped": "not at this commit"}
        return {"loaded": True, "number": number or 4}

    def samples(self, n):
        return [self.cost] * n

    def stop(self):
        self.stopped = True


def run(monkeypatch, base_cost, head_cost, names, stops=None):
    started = []

    def start(env, packages, benchmark_dir, folder):
        workers = [FakeWorker(base_cost), FakeWorker(head_cost, stops=stops if not started else None)]
        started.append(workers)
        return workers

    monkeypatch.setattr(pairs, "package_of", lambda commit, folder: commit)
    monkeypatch.setattr(pairs, "start_workers", start)
    points = [(name, 0, name) for name in names]
    return pairs.measure(None, "base", "head", points, progress=lambda line: None), started


def test_each_point_gets_the_median_of_its_per_pair_ratios_and_its_interval(monkeypatch):
    outcomes, _ = run(monkeypatch, 1.0, 1.25, ["a", "skips"])
    assert outcomes["a"].ratio == pytest.approx(1.25) and outcomes["a"].pairs >= pairs.MIN_PAIRS
    assert outcomes["a"].low == pytest.approx(1.25) and outcomes["a"].worse(1.03)
    assert outcomes["skips"] == {"skipped": "not at this commit", "role": "base"}


def test_a_worker_that_stops_fails_its_point_only_and_new_workers_take_the_rest(monkeypatch):
    outcomes, started = run(monkeypatch, 1.0, 1.0, ["a", "b", "c"], stops="b")
    assert outcomes["b"] == {"failed": "paired-timing worker: the worker stopped (exit -9; see its output above)",
                             "role": "head"}
    assert outcomes["a"].ratio == outcomes["c"].ratio == pytest.approx(1.0)
    assert len(started) == 2 and all(w.stopped for w in started[0])  # the first pair stopped, two new ones


@pytest.mark.parametrize("paired, decided", [
    (pairs.Paired(1.05, 1.02, 1.08, 9), True),   # worse: beyond the factor, the interval above 1
    (pairs.Paired(1.00, 0.97, 1.03, 9), True),   # not worse: neither
    (pairs.Paired(1.028, 1.014, 1.049, 26), False),  # the interval above 1, the median short of the factor
    (pairs.Paired(1.09, 0.79, 1.22, 14), False),  # the median beyond the factor, the interval reaching below 1
])
def test_a_verdict_is_open_when_only_one_of_its_two_conditions_holds(paired, decided):
    assert paired.decided(1.03) is decided and paired.worse(1.03) is (paired.ratio > 1.03 and paired.low > 1)


def test_the_gate_measures_an_open_verdict_further_and_a_settled_one_not(monkeypatch):
    """A fake clock, 0.1 s a sample (one a side per pair); HEAD's samples 1.04 or 0.97 of BASE's, at random."""
    import random

    from benchmarks import pairs as within

    now = [0.0]
    monkeypatch.setattr(within.time, "perf_counter", lambda: now[0])

    class Timed(FakeWorker):
        def __init__(self, cost, spread=None):
            super().__init__(cost)
            self.spread = spread

        def samples(self, n):
            now[0] += 0.1 * n
            return [self.cost * (self.spread() if self.spread else 1.0) for _ in range(n)]

    def measured(factor, seed=1):
        draw = random.Random(seed)
        monkeypatch.setattr(pairs, "package_of", lambda commit, folder: commit)
        monkeypatch.setattr(pairs, "start_workers",
                            lambda *args: [Timed(1.0), Timed(1.0, lambda: 1.04 if draw.random() < 0.55 else 0.97)])
        return pairs.measure(None, "b", "h", [("a", 0, "a")], progress=lambda line: None, factor=factor)["a"]

    first = measured(factor=None)
    assert first.pairs == pairs.MIN_PAIRS and not first.decided(1.03)  # 1.04x, 0.97 inside its interval
    again = measured(factor=1.03)
    assert again.pairs > first.pairs and again.pairs <= pairs.MAX_PAIRS
    assert measured(factor=1.5).pairs == pairs.MIN_PAIRS  # settled at once: not worse


@pytest.mark.skipif(sys.platform != "linux", reason="personality(2) is Linux's")
def test_workers_start_without_address_space_randomisation():
    def run_once(preexec):
        return subprocess.run([sys.executable, "-c", "print(open('/proc/self/personality').read().strip(), "
                               "hex(id(object())))"], capture_output=True, text=True, preexec_fn=preexec).stdout
    fixed = {run_once(pairs.fixed_layout) for _ in range(3)}
    assert len(fixed) == 1 and int(fixed.pop().split()[0], 16) & pairs.ADDR_NO_RANDOMIZE


def test_a_flagged_point_is_confirmed_by_a_longer_measurement_that_settles_strictly(monkeypatch):
    calls = []

    def measure(env, base, head, points, progress=print, factor=None, seconds=pairs.SECONDS_PER_POINT,
                max_pairs=pairs.MAX_PAIRS, strict=False):
        calls.append((seconds, max_pairs, strict, factor))
        return {label: pairs.Paired(1.05, 1.02, 1.08, 20) for *_, label in points}

    monkeypatch.setattr(pairs, "measure", measure)
    out = pairs.measure_confirmed(None, "b", "h", [("a", 0, "a")], 1.03, progress=lambda line: None)
    assert calls == [(pairs.SECONDS_PER_POINT, pairs.MAX_PAIRS, False, 1.03),
                     (pairs.CONFIRM_SECONDS, pairs.CONFIRM_MAX_PAIRS, True, 1.03)]
    assert out["a"].worse(1.03) and pairs.CONFIRM_SECONDS > pairs.SECONDS_PER_POINT
    wide = pairs.Paired(1.0015, 0.962, 1.058, 32)
    assert wide.decided(1.03) and not wide.decided(1.03, strict=True)  # not cleared: its interval reaches 1.058
    assert pairs.Paired(1.00, 0.99, 1.02, 60).decided(1.03, strict=True)


def test_a_point_whose_setup_fails_while_sampled_fails_alone_and_the_workers_go_on(monkeypatch):
    """asv's setup runs before every sample: a worker may answer ``{"failed": ...}`` to a samples request. That
    point fails, named with the worker's role; the next point is measured by the same two workers."""
    class FailsAt(FakeWorker):
        def samples(self, n):
            if self.point == "flaky":
                raise pairs.PointFailed(self, {"failed": "AssertionError: check failed on the 7th setup"})
            return super().samples(n)

        def ask(self, load=None, param_idx=None, number=None):
            self.point = load
            return super().ask(load, param_idx, number)

    started = []

    def start(*args):
        started.append([FakeWorker(1.0), FailsAt(1.0)])
        return started[-1]

    monkeypatch.setattr(pairs, "package_of", lambda commit, folder: commit)
    monkeypatch.setattr(pairs, "start_workers", start)
    points = [(name, 0, name) for name in ("flaky", "fine")]
    outcomes = pairs.measure(None, "b", "h", points, progress=lambda line: None)
    assert outcomes["flaky"] == {"failed": "AssertionError: check failed on the 7th setup", "role": "head"}
    assert outcomes["fine"].ratio == pytest.approx(1.0) and len(started) == 1


def test_a_worker_answering_a_failure_to_a_samples_request_raises_point_failed():
    worker = pairs.Worker.__new__(pairs.Worker)
    worker.ask = lambda **request: {"failed": "AssertionError: not equal to the oracle"}
    with pytest.raises(pairs.PointFailed) as raised:
        worker.samples(3)
    assert raised.value.args == (worker, {"failed": "AssertionError: not equal to the oracle"})


def worker_answers(package_dir, *requests):
    """tools/pair_worker.py's answers to ``requests``, in a process of this interpreter with kv_attention from
    ``package_dir`` and the suite from the working tree."""
    import json

    env = {**pairs.os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    suite = pairs.common.ROOT / "benchmarks"
    run = subprocess.run([sys.executable, "-s", str(pairs.WORKER), str(package_dir), str(suite)],
                         input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, text=True,
                         env=env, cwd=package_dir, timeout=300)
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_the_worker_runs_the_working_trees_benchmark_on_the_commits_package_as_plain_python(tmp_path):
    """A point of CacheStrategy: its setup (the correctness check) and samples of its method; at a commit whose
    kv_attention lacks the function, setup's NotImplementedError skips the point, as asv would."""
    import itertools

    from benchmarks.bench_cache import CacheStrategy

    index = list(itertools.product(*CacheStrategy.params)).index((16, "concat"))
    load = {"load": "bench_cache.CacheStrategy.time_decode", "param_idx": index, "number": None}
    loaded, sampled = worker_answers(pairs.common.ROOT, load, {"samples": 3})
    assert loaded == {"loaded": True, "number": loaded["number"]} and loaded["number"] >= 1
    assert len(sampled["samples"]) == 3 and all(0 < s < 0.1 for s in sampled["samples"])
    old = tmp_path / "old"
    (old / "kv_attention").mkdir(parents=True)
    (old / "kv_attention" / "__init__.py").write_text("")  # a commit before cached_attention
    assert worker_answers(old, load) == [{"skipped": "kv_attention has no cached_attention at this commit"}]
    failed, = worker_answers(old, {"load": "bench_cache.NoSuchClass.time_decode", "param_idx": 0})
    assert failed["failed"].startswith("AttributeError")


def test_no_private_asv_name_is_used():
    """benchmarks/, tools/ and tests/ use asv and asv_runner through public names only: an upgrade that renames a
    private one (a leading underscore, or a private module such as asv_runner's _aux) would break them silently."""
    import re

    private = re.compile(r"\basv(?:_runner)?(?:\.[a-z]\w*)*\._(?!_)\w"  # asv's private modules and names, not dunders
                         r"|\.(?:_attr_sources|_build_params|_setups|_setup_cache|insert_param|do_setup_cache)\b")
    root = pairs.common.ROOT
    offenders = [f"{path.relative_to(root)}:{n + 1}: {line.strip()}"
                 for folder in ("benchmarks", "tools", "tests") for path in sorted((root / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines()) if private.search(line)]
    assert not offenders, offenders
