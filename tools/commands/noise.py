"""``noise``: measure the gate on known changes, in a temporary clone (never on a branch of this repository).

    python3 tools/dev.py noise aa [--factor F] [--bench REGEX]
        A/A: an empty commit on top of HEAD, gate HEAD~1 HEAD; prints, per
        benchmark, the largest ratio between the two identical builds.
    python3 tools/dev.py noise slowdown STRATEGY [--slowdown 0.05,0.10,...] [--factor F] [--bench REGEX]
        For each fraction, a commit that makes STRATEGY's decode that much slower
        (a busy wait after the real work); gate HEAD vs it; says which were flagged.
    python3 tools/dev.py noise work STRATEGY [--extra 0.01,0.02,0.05] [--factor F] [--count-factor F] [--bench REGEX]
        Gates HEAD against itself to read its instruction counts; then, for each
        fraction, a commit whose STRATEGY's decode does that much more computation
        (a Python loop after the real work, sized from HEAD's own counts: not a
        wait); gate HEAD vs it; says which points were flagged, in which channel,
        and the count ratios measured.
    python3 tools/dev.py noise broken STRATEGY [--bench REGEX]
        A commit whose STRATEGY is 0.1 % off; the gate must exit 2 and print the rest.
    python3 tools/dev.py noise history [--library-commits 60]
        The main job's cost on a fresh clone: HEAD plus that many library commits
        (a comment changed in kv_attention/ each) as main, then the main job as a
        new user runs it (its own .venv, a fresh HOME, no .asv), then again after
        one more library commit; prints both times.

Each run clones HEAD into a temporary folder under /tmp, commits there, runs
the clone's ``gate`` with this checkout's .venv, and deletes the clone
(``--keep`` keeps it). Exit 0 when the gate behaved as expected, 1 otherwise.
A drill stopped, even by SIGKILL, stops its gate and asv with it (:mod:`tools.processes`).
"""

import argparse
import ast
import importlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import common, processes, results
from .gate import COUNT_BENCHMARKS, COUNT_FACTOR, DEFAULT_FACTOR, bench_regex, factor, param_names_of, point_params

LOCKS_WORKSPACE = True  # one measuring job at a time here (tools/lock.py); each clone has its own .asv/

SLOWDOWN = '''

import functools as _functools
import time as _time

_unchanged_{name} = {name}


@_functools.wraps(_unchanged_{name})  # the same signature: the suite asks it for cache=
def {name}(*args, **kwargs):  # injected by tools/dev.py noise: {percent:g} % slower
    start = _time.perf_counter()
    out = _unchanged_{name}(*args, **kwargs)
    stop = start + (_time.perf_counter() - start) * (1 + {fraction!r})
    while _time.perf_counter() < stop:
        pass
    return out
'''
WORK = '''

_unchanged_{name} = {name}
_EXTRA_{name} = {iterations!r}  # x.shape[:-1] of a count point -> loop iterations: {percent:g} % of its instructions
_PER_STEP_{name} = {per_step!r}  # x.shape[:-2] -> iterations per decode step, for the lengths not counted


def {name}(x, *args, **kwargs):  # injected by tools/dev.py noise work: {percent:g} % more computation
    out = _unchanged_{name}(x, *args, **kwargs)
    shape = tuple(x.shape[:-1])
    for _ in range(_EXTRA_{name}.get(shape, round(_PER_STEP_{name}.get(shape[:-1], 0) * shape[-1]))):
        pass
    return out
'''
# Instructions one iteration of WORK's loop costs (CPython 3.11 under callgrind, measured: 194.0 per iteration
# from 100,000 and 200,000 iterations); the drill prints the count ratios it got, so another Python shows.
LOOP_INSTRUCTIONS = 194
BROKEN = '''

_unchanged_{name} = {name}


def {name}(*args, **kwargs):  # injected by tools/dev.py noise: 0.1 % off, the gate must fail it
    return 1.001 * _unchanged_{name}(*args, **kwargs)
'''


class Clone:
    """A temporary clone of HEAD in which commits can be made and gated."""

    def __init__(self, keep=False):
        self.path = Path(tempfile.mkdtemp(prefix="kv-attention-noise-"))
        self.keep = keep
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(common.ROOT), str(self.path)], check=True)
        subprocess.run(["git", "-C", str(self.path), "checkout", "--quiet", "--detach", common.git("rev-parse", "HEAD")],
                       check=True)
        self.base = self.git("rev-parse", "HEAD")

    def git(self, *args):
        command = ["git", "-C", str(self.path), "-c", "user.name=noise", "-c", "user.email=noise@localhost", *args]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()

    def commit(self, message, appended_to_decode=""):
        """A commit on top of the base: ``appended_to_decode`` added to kv_attention/decode.py.

        The working tree goes back to the base, so that every drill measures a commit that is not the
        one checked out (the suite's files come from the working tree, the package from the commit).
        """
        self.git("checkout", "--quiet", "--detach", self.base)
        if appended_to_decode:
            with open(self.path / "kv_attention" / "decode.py", "a") as decode:
                decode.write(appended_to_decode)
        self.git("commit", "--quiet", "--allow-empty", "-am", message)
        head = self.git("rev-parse", "HEAD")
        self.git("checkout", "--quiet", "--detach", self.base)
        return head

    def gate(self, head, factor, bench, count_factor=COUNT_FACTOR):
        """Run the clone's ``gate BASE HEAD`` with this checkout's .venv: (exit code, output)."""
        command = [sys.executable, "-m", "tools.dev", "gate", self.base, head, "--factor", str(factor),
                   "--count-factor", str(count_factor)] + (["--bench", bench] if bench else [])
        print(f"$ {' '.join(command)}", flush=True)
        result = processes.run(command, cwd=self.path, env={**os.environ, common.INSIDE_VENV: "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(result.stdout, flush=True)
        return result.returncode, result.stdout

    def rows(self, commits, bench):
        """``(asv compare rows of each commit, benchmark -> param_names)`` from the clone's stored results."""
        root = common.ROOT
        os.chdir(self.path)  # asv.conf.json's paths are relative
        common.ROOT = self.path
        try:
            conf, benchmarks, machine, env_names = results.asv_setup()
            rows = [results.compare_rows(conf, results.iter_results(conf, machine, c, env_names), bench)
                    for c in commits]
        finally:
            common.ROOT = root
            os.chdir(root)
        return rows, param_names_of(benchmarks)

    def point_ratios(self, head, bench):
        """``{(point label, env): head/base ratio}`` of every point both commits have a number for."""
        (base_rows, head_rows), _ = self.rows([self.base, head], bench)
        points = [results.unrolled(rows) for rows in (base_rows, head_rows)]
        ratios = {}
        for name, (value_2, _, _) in points[1].items():
            value_1 = points[0].get(name, (None,))[0]
            if value_1 and value_2 and not (math.isnan(value_1) or math.isnan(value_2)):
                ratios[name] = value_2 / value_1
        return ratios

    def close(self):
        if self.keep:
            print(f"clone kept at {self.path}")
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def flagged(output):
    """Benchmark points the gate named as regressions (without the channel the gate names after each)."""
    return [line.split(None, 2)[2].rsplit("  (", 1)[0] for line in output.splitlines()
            if line.startswith("REGRESSION ")]


PAIRED_LINE = re.compile(r"^\[pairs\] \d+/\d+ (.+): ([0-9.]+)x \[(\S+), (\S+)\], (\d+) pairs$")


def paired_ratios(output):
    """``{point label: per-pair median ratio}`` of the gate's ``[pairs]`` lines (:mod:`tools.pairs`)."""
    return {m.group(1): float(m.group(2)) for m in map(PAIRED_LINE.match, output.splitlines()) if m}


def print_families(title, ratios):
    """One line per benchmark of ``ratios`` (``{point label: ratio}``): points, min, median, max, worst deviation."""
    families = {}
    for label, ratio in ratios.items():
        families.setdefault(label.split("(")[0], []).append(ratio)
    print(f"\n{title}:")
    print(f"{'benchmark':<56} {'points':>6} {'min':>7} {'median':>7} {'max':>7} {'largest deviation':>18}")
    for family, values in sorted(families.items()):
        values.sort()
        deviation = max(abs(v - 1) for v in values)
        print(f"{family:<56} {len(values):>6} {values[0]:7.4f} {values[len(values) // 2]:7.4f} {values[-1]:7.4f} "
              f"{100 * deviation:>17.4f}%")


def aa(clone, args):
    head = clone.commit("A/A: no change")
    code, output = clone.gate(head, args.factor, args.bench, args.count_factor)
    unpaired = {label: ratio for (label, _), ratio in clone.point_ratios(head, args.bench).items()}
    print_families(f"A/A noise, asv's medians of two separate runs (HEAD {clone.base[:8]} twice; ratio = second / "
                   "first, over the parameter combinations)", unpaired)
    paired = paired_ratios(output)
    if paired:
        print_families("A/A noise of the timings in pairs (the gate's verdict: median of per-pair ratios)", paired)
    print(f"\ngate exit {code}; flagged at factor {args.factor} (counts {args.count_factor}): "
          f"{', '.join(flagged(output)) or 'nothing'}")
    return code == 0


def slowdown(clone, args):
    from benchmarks.common import PUBLIC_FUNCTIONS

    expected = f"'{args.strategy}'"
    ok = True
    for fraction in args.slowdown:
        code = SLOWDOWN.format(name=PUBLIC_FUNCTIONS[args.strategy], fraction=fraction, percent=100 * fraction)
        head = clone.commit(f"inject a {100 * fraction:g} % slowdown into {args.strategy}", code)
        exit_code, output = clone.gate(head, args.factor, args.bench)
        names = flagged(output)
        hits = [n for n in names if expected in n]
        print(f"slowdown {100 * fraction:g} % of {args.strategy}: gate exit {exit_code}; "
              f"{len(hits)} of its points flagged, {len(names) - len(hits)} other point(s) flagged")
        ok &= exit_code == 1 and bool(hits) and len(hits) == len(names)
    return ok


def belongs(label, strategy):
    """True for a point of ``strategy``: its name as a parameter, or the batch-size sweep for ``batched``."""
    return f"'{strategy}'" in label or (strategy == "batched" and ".BatchSize" in label)


def count_points(clone, strategy, bench):
    """``{x.shape[:-1]: instructions}`` of ``strategy``'s count points at the clone's base commit.

    The shape of each point's timed input comes from the suite's own ``prepare``.
    """
    from threadpoolctl import threadpool_limits

    (rows,), names = clone.rows([clone.base], bench)
    instructions = {}
    for (label, _), params in point_params(rows, names).items():
        if not label.startswith(tuple(key for key, *_ in rows if key.endswith(".track_instructions"))):
            continue
        value = results.unrolled(rows).get((label, rows[0][-1]), (None,))[0]
        if not belongs(label, strategy) or not value or math.isnan(value):
            continue
        module, cls = label.split("(")[0].split(".")[:2]
        counted = getattr(importlib.import_module(f"benchmarks.{module}"), cls)()
        with threadpool_limits(1):  # the correctness check in prepare verifies the benchmarks' one-thread pin
            _, inputs = counted.prepare(*(ast.literal_eval(v) for v in params.values()))
        instructions[tuple(inputs[0].shape[:-1])] = value
    return instructions


def work(clone, args):
    """Inject ``args.extra`` fractions of more computation into a strategy; the counts must flag every one of its
    count points, and nothing outside the strategy may be flagged."""
    from benchmarks.common import PUBLIC_FUNCTIONS

    clone.gate(clone.base, args.factor, args.bench, args.count_factor)  # measures the base commit
    counted = count_points(clone, args.strategy, args.bench)
    if not counted:
        raise common.UserError(f"no instruction counts of {args.strategy!r} at {clone.base[:8]} "
                               "(is valgrind installed? see the gate's output above)")
    widest = {shape[:-1]: shape for shape in sorted(counted, key=lambda s: s[-1])}  # the longest counted T
    ok, table = True, []
    for fraction in args.extra:
        iterations = {shape: round(fraction * n / LOOP_INSTRUCTIONS) for shape, n in counted.items()}
        per_step = {lead: iterations[shape] / shape[-1] for lead, shape in widest.items()}
        code = WORK.format(name=PUBLIC_FUNCTIONS[args.strategy], iterations=iterations, per_step=per_step,
                           percent=100 * fraction)
        head = clone.commit(f"inject {100 * fraction:g} % more work into {args.strategy}", code)
        exit_code, output = clone.gate(head, args.factor, args.bench, args.count_factor)
        names = flagged(output)
        ratios = {name[0]: r for name, r in clone.point_ratios(head, args.bench).items()}
        row = {"fraction": fraction, "exit": exit_code}
        for method in COUNT_BENCHMARKS + ("time_",):
            own = [label for label in ratios if belongs(label, args.strategy) and method_of_point(label, method)]
            hits = [label for label in own if label in names]
            row[method] = (len(hits), len(own), min((ratios[x] for x in own), default=math.nan),
                           max((ratios[x] for x in own), default=math.nan))
        row["others"] = [n for n in names if not belongs(n, args.strategy)]
        table.append(row)
        hits, total = row["track_instructions"][:2]
        ok &= exit_code == 1 and total > 0 and hits == total and not row["others"]
    print(f"\ninjected work into {args.strategy} (count factor {args.count_factor}, timing factor {args.factor}):")
    print(f"{'extra':>6} {'exit':>4}  {'instructions flagged (ratios)':<34} {'cycles flagged (ratios)':<34} "
          f"{'timings flagged (ratios)':<34} other points flagged")
    for row in table:
        cells = [f"{h} of {n} ({lo:.4f}-{hi:.4f})" for h, n, lo, hi in
                 (row[m] for m in COUNT_BENCHMARKS + ("time_",))]
        print(f"{100 * row['fraction']:>5g}% {row['exit']:>4}  {cells[0]:<34} {cells[1]:<34} {cells[2]:<34} "
              f"{len(row['others'])}{': ' + ', '.join(row['others']) if row['others'] else ''}")
    return ok


def method_of_point(label, method):
    """True when point ``label``'s benchmark method is ``method`` (or starts with it, for ``time_``)."""
    name = label.split("(")[0].rsplit(".", 1)[-1]
    return name.startswith(method) if method.endswith("_") else name == method


def broken(clone, args):
    from benchmarks.common import PUBLIC_FUNCTIONS

    head = clone.commit(f"break {args.strategy}", BROKEN.format(name=PUBLIC_FUNCTIONS[args.strategy]))
    code, output = clone.gate(head, args.factor, args.bench)
    failed = [line for line in output.splitlines() if line.startswith("FAILED at head")]
    others_compared = "Benchmarks that have stayed the same" in output
    print(f"broken {args.strategy}: gate exit {code}; {len(failed)} failed point(s); "
          f"comparison of the rest printed: {others_compared}")
    return code == 2 and failed and all(f"'{args.strategy}'" in line for line in failed) and others_compared


def history(clone, args):
    """Time the README's main job on a fresh clone of a long synthetic history, and its re-run after one commit."""
    for i in range(args.library_commits):
        with open(clone.path / "kv_attention" / "__init__.py", "a") as init:
            init.write(f"# synthetic library commit {i + 1} (tools/dev.py noise history)\n")
        clone.git("commit", "--quiet", "-am", f"synthetic library commit {i + 1}")
    clone.git("checkout", "--quiet", "-B", common.BRANCH)
    home = Path(tempfile.mkdtemp(prefix="kv-attention-home-"))
    env = {k: v for k, v in os.environ.items() if k not in (common.INSIDE_VENV, "VIRTUAL_ENV")}
    env.update(HOME=str(home), PIP_CACHE_DIR=str(home / ".cache" / "pip"))
    times = []
    try:
        for run in ("fresh clone", "after one more library commit"):
            if times:
                with open(clone.path / "kv_attention" / "__init__.py", "a") as init:
                    init.write("# one more library commit\n")
                clone.git("commit", "--quiet", "-am", "one more library commit")
            print(f"$ python3 tools/dev.py bench   # in {clone.path}, HOME={home}: {run}", flush=True)
            started = time.monotonic()
            code = processes.run(["python3", "tools/dev.py", "bench"], cwd=clone.path, env=env).returncode
            times.append((run, code, time.monotonic() - started))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(f"\nmain job on a clone of HEAD + {args.library_commits} library commits:")
    for run, code, seconds in times:
        print(f"  {run}: {seconds / 60:.0f} min {seconds % 60:.0f} s, exit {code}")
    return all(code == 0 for _, code, _ in times)


def strategy(text):
    """argparse type: a strategy of the cache or batch experiment (``benchmarks.common.PUBLIC_FUNCTIONS``)."""
    try:
        from benchmarks.common import PUBLIC_FUNCTIONS
    except ImportError:  # parsed before .venv exists (no numpy): checked again inside it
        return text
    if text not in PUBLIC_FUNCTIONS:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(sorted(PUBLIC_FUNCTIONS))}, got {text!r}")
    return text


def fractions(text):
    """argparse type: comma-separated fractions, each in (0, 10)."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(0 < v < 10 for v in values):
        raise argparse.ArgumentTypeError(f"expected fractions such as 0.05,0.1 (each in (0, 10)), got {text!r}")
    return values


DRILLS = {"aa": aa, "slowdown": slowdown, "work": work, "broken": broken, "history": history}


def library_commits(text):
    """argparse type of ``history --library-commits``: an integer from 1 to 1000."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 1000 (library commits to add), got {text!r}")
    return value


def setup_arguments(subparsers):
    parser = subparsers.add_parser("noise", allow_abbrev=False, help="A/A, injected slowdown and broken-strategy "
                                   "drills of the gate, in a temporary clone")
    drills = parser.add_subparsers(dest="drill", required=True)
    for name in DRILLS:
        sub = drills.add_parser(name, allow_abbrev=False)
        if name == "history":
            sub.add_argument("--library-commits", type=library_commits, default=60, metavar="N",
                             help="library commits added on top of HEAD (default 60)")
            sub.add_argument("--keep", action="store_true", help="keep the temporary clone")
            continue
        if name not in ("aa", "history"):
            sub.add_argument("strategy", type=strategy, help="a strategy of the cache or batch experiment")
        if name == "slowdown":
            sub.add_argument("--slowdown", type=fractions, default=[0.10], help="fractions, e.g. 0.05,0.10,0.20")
        if name == "work":
            sub.add_argument("--extra", type=fractions, default=[0.01, 0.02, 0.05],
                             help="fractions of more computation, e.g. 0.01,0.02,0.05")
        sub.add_argument("--factor", type=factor, default=DEFAULT_FACTOR)
        sub.add_argument("--count-factor", type=factor, default=COUNT_FACTOR)
        sub.add_argument("--bench", type=bench_regex, metavar="REGEX")
        sub.add_argument("--keep", action="store_true", help="keep the temporary clone")
        sub.add_argument("--neighbour", action="store_true",
                         help="run a neighbour beside the drill, busy and idle in turns of 1-5 s (a shared machine)")
    return parser


# A neighbour as on a shared machine: busy for 1-5 s, idle for 1-5 s, in turns (a fixed seed), for at most 2 h,
# and gone with the drill (it stops when its stdin closes).
NEIGHBOUR = """import random, select, sys, time
rng, end = random.Random(1), time.monotonic() + 7200
while time.monotonic() < end:
    busy = time.monotonic() + rng.uniform(1, 5)
    while time.monotonic() < busy:
        pass
    if select.select([sys.stdin], [], [], rng.uniform(1, 5))[0]:
        break
"""


def run(args):
    clone = Clone(keep=args.keep)
    neighbour = None
    if getattr(args, "neighbour", False):
        neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.PIPE)
        print("a neighbour runs beside the drill: busy 1-5 s, idle 1-5 s, in turns", flush=True)
    try:
        ok = DRILLS[args.drill](clone, args)
    except subprocess.CalledProcessError as error:
        raise common.UserError(str(error)) from None
    finally:
        if neighbour is not None:
            neighbour.stdin.close()
            neighbour.wait()
        clone.close()
    print("as expected" if ok else "NOT as expected")
    return 0 if ok else 1
