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
            raise pairs.WorkerError("the worker stopped (exit -9; see its output above)")
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

    monkeypatch.setattr(pairs, "package_of", lambda conf, env, commit, folder: commit)
    monkeypatch.setattr(pairs, "start_workers", start)
    conf = SimpleNamespace(benchmark_dir="benchmarks")
    points = [(name, 0, name) for name in names]
    return pairs.measure(conf, None, "base", "head", points, progress=lambda line: None), started


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


@pytest.mark.skipif(sys.platform != "linux", reason="personality(2) is Linux's")
def test_workers_start_without_address_space_randomisation():
    def run_once(preexec):
        return subprocess.run([sys.executable, "-c", "print(open('/proc/self/personality').read().strip(), "
                               "hex(id(object())))"], capture_output=True, text=True, preexec_fn=preexec).stdout
    fixed = {run_once(pairs.fixed_layout) for _ in range(3)}
    assert len(fixed) == 1 and int(fixed.pop().split()[0], 16) & pairs.ADDR_NO_RANDOMIZE
