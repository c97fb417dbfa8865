#!/usr/bin/env python3
"""The project's two commands, for a fresh machine with Python >= 3.10, git and pip.

    python3 tools/dev.py bench [--all]   benchmark recent commits of main with asv, publish the dashboard
    python3 tools/dev.py test [ARGS]     run python -m pytest tests (ARGS go to pytest)

Both first make ``.venv`` and install the project with its test and bench
extras there (again only when setup.cfg or pyproject.toml change), then re-run
themselves inside it. asv builds its own per-commit virtualenvs under .asv/env.
"""

import argparse
import hashlib
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
BRANCH = "main"
RECENT_LIBRARY_COMMITS = 10
LIBRARY_PATHS = ["kv_attention", "setup.cfg", "pyproject.toml"]  # what the package build reads
BUILD_FILES = ["setup.cfg", "pyproject.toml", "kv_attention/__init__.py"]  # all present => buildable
INSIDE_VENV = "KV_ATTENTION_DEV_VENV"


class JobError(Exception):
    """A failure worth one line to the user, not a traceback."""


def venv_python():
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv():
    """Create .venv and install ``.[test,bench]`` into it when missing or out of date."""
    if not venv_python().exists():  # missing, or left by a Python that is gone: (re)make it
        print(f"creating {VENV.relative_to(ROOT)} ...", flush=True)
        if subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)]).returncode != 0:
            raise JobError(f"python -m venv failed; on Debian/Ubuntu install python3-venv, or delete {VENV}")
    stamp = VENV / "kv-attention-installed"
    digest = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in ("setup.cfg", "pyproject.toml"))).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing kv_attention[test,bench] into .venv ...", flush=True)
    pip = [str(venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if subprocess.run(pip + ["-e", f"{ROOT}[test,bench]"]).returncode != 0:
        raise JobError("pip install of the project's test/bench dependencies failed (see above)")
    stamp.write_text(digest)


def run(*command, check=True):
    """Run a command from the repository root; JobError if it fails and ``check``."""
    result = subprocess.run(command, cwd=ROOT)
    if check and result.returncode != 0:
        raise JobError(f"`{' '.join(command)}` exited {result.returncode}")
    return result.returncode


def git(*args):
    """Stdout of ``git ARGS`` in the repository, stripped; JobError if git fails."""
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise JobError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def is_buildable(commit):
    """True when the commit has every file the package build needs."""
    listed = set(git("ls-tree", "-r", "--name-only", commit, "--", *BUILD_FILES).split())
    return listed == set(BUILD_FILES)


def select_commits(whole_history):
    """Commits of main to benchmark, newest first, never one the package cannot be built from."""
    if whole_history:
        candidates = git("rev-list", BRANCH).split()
    else:
        head = git("rev-list", "--max-count=2", BRANCH).split()  # main and main~1
        library = git("rev-list", f"--max-count={RECENT_LIBRARY_COMMITS}", BRANCH, "--", *LIBRARY_PATHS).split()
        candidates = list(dict.fromkeys(head + library))
    commits = [c for c in candidates if is_buildable(c)]
    if not commits:
        raise JobError(f"no commit of {BRANCH} has a buildable package ({', '.join(BUILD_FILES)})")
    return commits


def count_outcomes(commit, conf, benchmarks, machine):
    """Counter of ok / failed / skipped benchmark points asv stored for ``commit``."""
    from asv.results import iter_results_for_machine_and_hash

    counts, failed = Counter(), []
    for result in iter_results_for_machine_and_hash(conf.results_dir, machine, commit):
        for key in result.get_result_keys(benchmarks):
            if key not in benchmarks:
                continue
            value = result.get_result_value(key, benchmarks[key]["params"])
            for point in value if isinstance(value, list) else [value]:
                if point is None:
                    counts["failed"] += 1
                    failed.append(key)
                elif isinstance(point, float) and math.isnan(point):
                    counts["skipped"] += 1
                else:
                    counts["ok"] += 1
    return counts, sorted(set(failed))


def report(commits, head):
    """Print one line per commit; return the benchmarks that failed at ``head``."""
    from asv.benchmarks import Benchmarks
    from asv.config import Config
    from asv.machine import Machine
    from asv.util import UserError

    conf = Config.load(str(ROOT / "asv.conf.json"))
    try:
        benchmarks = Benchmarks.load(conf)
    except UserError as error:
        raise JobError(f"asv found no benchmarks to report on: {error}") from None
    machine = Machine.get_unique_machine_name()
    print(f"\nresults on machine {machine!r}:")
    head_failed, head_measured = [], False
    for commit in commits:
        counts, failed = count_outcomes(commit, conf, benchmarks, machine)
        subject = git("log", "-1", "--format=%s", commit)
        status = ", ".join(f"{counts[k]} {k}" for k in ("ok", "failed", "skipped")) if counts else "no results"
        print(f"  {commit[:8]}  {status:<30}  {subject[:60]}")
        if commit == head:
            head_failed, head_measured = failed, bool(counts)
    if not head_measured:
        raise JobError(f"{BRANCH} ({head[:8]}) has no results: its build or install failed (see above)")
    return head_failed


def record_machine(asv):
    """``asv machine --yes``: store this machine's defaults (hostname, CPU, RAM) without questions."""
    from asv.machine import Machine

    result = subprocess.run([*asv, "machine", "--yes"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise JobError(f"asv machine --yes failed: {result.stderr.strip() or result.stdout.strip()}")
    info = Machine.get_defaults()
    print(f"machine {info['machine']!r}: {info['cpu']}, {info['num_cpu']} CPUs, {info['os']}", flush=True)


def bench(args):
    """The main job: record the machine, benchmark recent commits, publish, judge main's tip."""
    asv = (sys.executable, "-m", "asv")
    commits = select_commits(args.all)
    record_machine(asv)
    hashfile = ROOT / ".asv" / "commits-to-run.txt"
    hashfile.parent.mkdir(exist_ok=True)
    hashfile.write_text("\n".join(commits) + "\n")
    print(f"benchmarking {len(commits)} commit(s) of {BRANCH}; benchmarks already measured on this machine are skipped", flush=True)
    run(*asv, "run", f"HASHFILE:{hashfile}", "--skip-existing", "--record-samples", check=False)
    run(*asv, "publish")
    head_failed = report(commits, git("rev-parse", BRANCH))
    print(f"\ndashboard written to {ROOT / '.asv' / 'html'}; view it on 127.0.0.1 with:\n"
          "  .venv/bin/python -m http.server --bind 127.0.0.1 --directory .asv/html 8080")
    if head_failed:
        raise JobError(f"{len(head_failed)} benchmark(s) failed their gate at {BRANCH}: {', '.join(head_failed)}")


def test(args):
    return run(sys.executable, "-m", "pytest", "tests", *args.pytest_args, check=False)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="tools/dev.py", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    bench_parser = commands.add_parser("bench", help="benchmark recent commits of main with asv and publish",
                                       allow_abbrev=False)
    bench_parser.add_argument("--all", action="store_true",
                              help="every buildable commit of main, not only main, main~1 and the "
                                   f"last {RECENT_LIBRARY_COMMITS} that changed the library or its build")
    commands.add_parser("test", add_help=False,  # so that `test --help` shows pytest's help
                        help="run python -m pytest tests; further arguments go to pytest")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "test":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.pytest_args = extra
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if os.environ.get(INSIDE_VENV) != "1":
            ensure_venv()
            os.environ[INSIDE_VENV] = "1"
            os.execv(str(venv_python()), [str(venv_python()), str(Path(__file__).resolve()), *argv])
        os.chdir(ROOT)
        return (bench if args.command == "bench" else test)(args) or 0
    except JobError as error:
        print(f"tools/dev.py {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
