"""Two commits' timings compared in pairs: asv times BASE and HEAD in separate runs, minutes apart, and on a
shared VM the drift between them decides as much as the code. Two workers (:mod:`tools.pair_worker`), each with its
commit's ``kv_attention``, alternate bursts of samples on one core (``benchmarks/pairs.py``), layouts fixed.
"""

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

from . import common

WORKER = Path(__file__).with_name("pair_worker.py")
SECONDS_PER_POINT = 1.5  # of pairs per timing point, both sides together (the first pair sizes the rest)
ANSWER_TIMEOUT = 600  # seconds a worker may take over one request (asv's setup_cache timeout is 600 for counts)
MIN_PAIRS, MAX_PAIRS = 9, 60  # 9: the fewest ratios whose 95 % interval is not [min, max] ([x_(2), x_(8)])
CONFIRM_SECONDS, CONFIRM_MAX_PAIRS = 3 * SECONDS_PER_POINT, 200  # a flagged point, measured again: longer


@dataclass(frozen=True)
class Paired:
    """One point's paired verdict: the median of per-pair ratios HEAD / BASE, its 95 % interval, the pairs."""

    ratio: float
    low: float
    high: float
    pairs: int

    def worse(self, factor):
        return self.ratio > factor and self.low > 1

    def decided(self, factor, strict=False):
        """False where the pairs left the verdict open: the median beyond ``factor`` or the interval above 1, not
        both (a 5 % slowdown at 1.028x [1.014, 1.049]). ``strict`` (confirming a flagged point): decided only when
        worse or the whole interval is below ``factor`` (1.0015x [0.962, 1.058] is not)."""
        if strict:
            return self.worse(factor) or self.high < factor
        return (self.ratio > factor) == (self.low > 1)


class PointFailed(Exception):
    """``(worker, answer)``: a point skipped or failed while it was sampled (asv's setup runs before every sample)."""


ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h: what `setarch -R` sets


def fixed_layout():
    """Before exec: no address-space randomisation (``setarch -R``): each randomised process of identical code gets a
    speed of its own (Mytkowicz et al., ASPLOS 2009). Where personality(2) is refused, the process runs as it is."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        current = libc.personality(0xFFFFFFFF)
        if current != -1:
            libc.personality(current | ADDR_NO_RANDOMIZE)


class Worker:
    """A :mod:`tools.pair_worker` process in ``env`` with the commit's package from ``package_dir``."""

    def __init__(self, env, package_dir, benchmark_dir, cwd):
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # asv strips it too
        environ.update(env.env_vars)  # the matrix's env_nobuild: the one-thread BLAS pin
        environ["PYTHONHASHSEED"] = "0"  # one hash seed for both: dicts and sets laid out alike
        self.process = subprocess.Popen([env.python, "-s", str(WORKER), str(package_dir), str(benchmark_dir)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environ, cwd=cwd,
                                        text=True, preexec_fn=fixed_layout if sys.platform == "linux" else None)

    def ask(self, **request):
        """The worker's answer to ``request``; UserError if it stopped or gave none within :data:`ANSWER_TIMEOUT`."""
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT)
            line = self.process.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            line = ""
        if line is None:
            self.process.kill()
            raise common.UserError(f"no answer within {ANSWER_TIMEOUT} s")
        if not line:
            raise common.UserError(f"the worker stopped (exit {self.process.wait()}; see its output above)")
        return json.loads(line)

    def samples(self, count):
        """``count`` seconds per call; PointFailed if the point's setup or call raised (``{"failed": why}``)."""
        answer = self.ask(samples=count)
        if "samples" not in answer:
            raise PointFailed(self, answer)
        return answer["samples"]

    def stop(self):
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def package_of(commit, folder):
    """``folder``/<commit>: the commit's kv_attention (pure Python), from git."""
    target = Path(folder) / commit
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(common.ROOT), "archive", commit, "kv_attention"], capture_output=True)
    if archive.returncode != 0 or subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout).returncode:
        raise common.UserError(f"cannot extract kv_attention of {commit[:8]}: {archive.stderr.decode().strip()}")
    return target


def measure(env, base, head, points, progress=print, factor=None, seconds=SECONDS_PER_POINT,
            max_pairs=MAX_PAIRS, strict=False):
    """``{label: Paired or {"skipped" or "failed": why, "role": "base" or "head"}}`` of ``points`` (``[(benchmark,
    param_idx, label)]``), about ``seconds`` of pairs each, a verdict left open measured further (``factor``)."""
    from benchmarks.pairs import median_interval, pairs_within

    def decided(ratios):
        return factor is None or Paired(*median_interval(ratios), len(ratios)).decided(factor, strict)

    outcomes = {}
    with tempfile.TemporaryDirectory(prefix="kv-attention-pairs-") as folder:
        packages = [package_of(commit, folder) for commit in (base, head)]
        workers = []
        try:
            for i, (name, param_idx, label) in enumerate(points):
                if not workers:  # at the start, and again after a worker stopped or hung
                    workers = start_workers(env, packages, common.ROOT / "benchmarks", folder)
                try:
                    loaded, role = workers[0].ask(load=name, param_idx=param_idx, number=None), "base"
                    if "loaded" in loaded:
                        loaded, role = workers[1].ask(load=name, param_idx=param_idx, number=loaded["number"]), "head"
                    if "loaded" not in loaded:
                        outcomes[label] = {**loaded, "role": role}
                        continue
                    ratios = pairs_within(workers[0].samples, workers[1].samples, seconds, MIN_PAIRS, max_pairs,
                                          decided=decided)
                except PointFailed as error:  # its setup or call raised midway: the point fails (or skips) only
                    worker, answer = error.args
                    outcomes[label] = {**answer, "role": "base" if worker is workers[0] else "head"}
                    continue
                except common.UserError as error:  # a worker stopped: this point fails; the next starts two new ones
                    dead = [role for role, w in zip(("base", "head"), workers) if w.process.poll() is not None]
                    outcomes[label] = {"failed": f"paired-timing worker: {error}", "role": (dead or ["head"])[0]}
                    for worker in workers:
                        worker.stop()
                    workers = []
                    continue
                ratio, low, high = median_interval(ratios)
                outcomes[label] = Paired(ratio, low, high, len(ratios))
                progress(f"[pairs] {i + 1}/{len(points)} {label}: {ratio:.4f}x [{low:.4f}, {high:.4f}], "
                         f"{len(ratios)} pairs")
        finally:
            for worker in workers:
                worker.stop()
    return outcomes


def measure_confirmed(env, base, head, points, factor, progress=print):
    """:func:`measure`, then each point worse than ``factor`` again with two new workers, longer and strictly: it
    stays worse only if that confirms it (with the smaller ratio). A false alarm rarely repeats, a regression does."""
    measured = measure(env, base, head, points, progress, factor)
    confirm = [point for point in points if isinstance(measured[point[2]], Paired) and measured[point[2]].worse(factor)]
    if confirm:
        progress(f"confirming {len(confirm)} point(s) worse than {factor}x, in pairs again with two new workers:")
        second = measure(env, base, head, confirm, progress, factor, CONFIRM_SECONDS, CONFIRM_MAX_PAIRS, True)
        for label, again in second.items():
            if not (isinstance(again, Paired) and again.worse(factor)) or again.ratio < measured[label].ratio:
                measured[label] = again  # not confirmed: the second verdict stands; confirmed: the smaller
    return measured


def start_workers(env, packages, benchmark_dir, folder):
    """BASE's and HEAD's workers, both pinned to the last core this process may run on."""
    workers = [Worker(env, package, benchmark_dir, folder) for package in packages]
    for worker in workers:
        os.sched_setaffinity(worker.process.pid, {max(os.sched_getaffinity(0))})
    return workers


Env = namedtuple("Env", "name python env_vars")  # an asv environment; env_vars: the matrix's (the BLAS pin)


def environments():
    """asv's configured environments (one per matrix entry), as asv names them and where it makes them."""
    from asv.config import Config
    from asv.environment import get_environments

    conf = Config.load(str(common.ROOT / "asv.conf.json"))
    return [Env(env.name, str(common.ROOT / conf.env_dir / env.dir_name / "bin" / "python"), dict(env.env_vars))
            for env in get_environments(conf, None, verbose=False)]
