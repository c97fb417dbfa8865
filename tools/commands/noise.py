"""``noise``: measure the gate on known changes, in a temporary clone (never on a branch of this repository).

    python3 tools/dev.py noise aa [--factor F] [--bench REGEX]
        A/A: an empty commit on top of HEAD, gate HEAD~1 HEAD; prints, per
        benchmark, the largest ratio between the two identical builds.
    python3 tools/dev.py noise slowdown STRATEGY [--slowdown 0.05,0.10,...] [--factor F] [--bench REGEX]
        For each fraction, a commit that makes STRATEGY's decode that much slower
        (a busy wait after the real work); gate HEAD vs it; says which were flagged.
    python3 tools/dev.py noise broken STRATEGY [--bench REGEX]
        A commit whose STRATEGY is 0.1 % off; the gate must exit 2 and print the rest.

Each run clones HEAD into a temporary folder under /tmp, commits there, runs
the clone's ``gate`` with this checkout's .venv, and deletes the clone
(``--keep`` keeps it). Exit 0 when the gate behaved as expected, 1 otherwise.
"""

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import common, processes, results
from .gate import DEFAULT_FACTOR, bench_regex, factor

LOCKS_WORKSPACE = True  # one measuring job at a time here (tools/lock.py); each clone has its own .asv/

SLOWDOWN = '''

import time as _time

_unchanged_{name} = {name}


def {name}(*args, **kwargs):  # injected by tools/dev.py noise: {percent:g} % slower
    start = _time.perf_counter()
    out = _unchanged_{name}(*args, **kwargs)
    stop = start + (_time.perf_counter() - start) * (1 + {fraction!r})
    while _time.perf_counter() < stop:
        pass
    return out
'''
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
        """A commit on top of the base: ``appended_to_decode`` added to kv_attention/decode.py."""
        self.git("checkout", "--quiet", "--detach", self.base)
        if appended_to_decode:
            with open(self.path / "kv_attention" / "decode.py", "a") as decode:
                decode.write(appended_to_decode)
        self.git("commit", "--quiet", "--allow-empty", "-am", message)
        return self.git("rev-parse", "HEAD")

    def gate(self, head, factor, bench):
        """Run the clone's ``gate BASE HEAD`` with this checkout's .venv: (exit code, output)."""
        command = [sys.executable, "-m", "tools.dev", "gate", self.base, head,
                   "--factor", str(factor)] + (["--bench", bench] if bench else [])
        print(f"$ {' '.join(command)}", flush=True)
        result = processes.run(command, cwd=self.path, env={**os.environ, common.INSIDE_VENV: "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(result.stdout, flush=True)
        return result.returncode, result.stdout

    def ratios(self, head, bench):
        """``{benchmark: [head/base ratio of each parameter combination]}`` from the clone's stored results."""
        root = common.ROOT
        os.chdir(self.path)  # asv.conf.json's paths are relative
        common.ROOT = self.path
        try:
            conf, _, machine, env_names = results.asv_setup()
            points = [results.unrolled(results.compare_rows(conf, results.iter_results(conf, machine, c, env_names),
                                                            bench)) for c in (self.base, head)]
        finally:
            common.ROOT = root
            os.chdir(root)
        ratios = {}
        for name, (value_2, _, _) in points[1].items():
            value_1 = points[0].get(name, (None,))[0]
            if value_1 and value_2 and not (math.isnan(value_1) or math.isnan(value_2)):
                family = name[0].split("(")[0]
                ratios.setdefault(family, []).append(value_2 / value_1)
        return ratios

    def close(self):
        if self.keep:
            print(f"clone kept at {self.path}")
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def flagged(output):
    """Benchmark points the gate named as regressions."""
    return [line.split(None, 2)[2] for line in output.splitlines() if line.startswith("REGRESSION ")]


def aa(clone, args):
    head = clone.commit("A/A: no change")
    code, output = clone.gate(head, args.factor, args.bench)
    print(f"\nA/A noise (HEAD {clone.base[:8]} twice; ratio = second / first run, over the parameter combinations):")
    print(f"{'benchmark':<52} {'points':>6} {'min':>6} {'median':>7} {'max':>6}")
    for family, values in sorted(clone.ratios(head, args.bench).items()):
        values.sort()
        print(f"{family:<52} {len(values):>6} {values[0]:6.3f} {values[len(values) // 2]:7.3f} {values[-1]:6.3f}")
    print(f"\ngate exit {code}; flagged at factor {args.factor}: {', '.join(flagged(output)) or 'nothing'}")
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


def broken(clone, args):
    from benchmarks.common import PUBLIC_FUNCTIONS

    head = clone.commit(f"break {args.strategy}", BROKEN.format(name=PUBLIC_FUNCTIONS[args.strategy]))
    code, output = clone.gate(head, args.factor, args.bench)
    failed = [line for line in output.splitlines() if line.startswith("FAILED at head")]
    others_compared = "Benchmarks that have stayed the same" in output
    print(f"broken {args.strategy}: gate exit {code}; {len(failed)} failed point(s); "
          f"comparison of the rest printed: {others_compared}")
    return code == 2 and failed and all(f"'{args.strategy}'" in line for line in failed) and others_compared


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


DRILLS = {"aa": aa, "slowdown": slowdown, "broken": broken}


def setup_arguments(subparsers):
    parser = subparsers.add_parser("noise", allow_abbrev=False, help="A/A, injected slowdown and broken-strategy "
                                   "drills of the gate, in a temporary clone")
    drills = parser.add_subparsers(dest="drill", required=True)
    for name in DRILLS:
        sub = drills.add_parser(name, allow_abbrev=False)
        if name != "aa":
            sub.add_argument("strategy", type=strategy, help="a strategy of the cache or batch experiment")
        if name == "slowdown":
            sub.add_argument("--slowdown", type=fractions, default=[0.10], help="fractions, e.g. 0.05,0.10,0.20")
        sub.add_argument("--factor", type=factor, default=DEFAULT_FACTOR)
        sub.add_argument("--bench", type=bench_regex, metavar="REGEX")
        sub.add_argument("--keep", action="store_true", help="keep the temporary clone")
    return parser


def run(args):
    clone = Clone(keep=args.keep)
    try:
        ok = DRILLS[args.drill](clone, args)
    except subprocess.CalledProcessError as error:
        raise common.UserError(str(error)) from None
    finally:
        clone.close()
    print("as expected" if ok else "NOT as expected")
    return 0 if ok else 1
