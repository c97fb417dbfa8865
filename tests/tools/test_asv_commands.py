"""asv's own commands as a user types them, on a throwaway project: the asv plugin's guarantees (tools/asv_plugin.py).

The project (built once for this module, its asv virtualenv too) is a package
``kv_attention`` whose ``WORK`` one commit changes, a suite of a cheap timing
and a ``track_`` count of that work, this checkout's ``tools/`` and the
project's asv.conf.json without its numpy matrix. Every asv command runs as a
subprocess with HOME in a temporary directory, so ~/.asv-machine.json is the
test's own. Each test gives asv its own results directory (``--config``).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import common, machine, results
from tools.commands import bench

# Several minutes on a busy 2-core machine: deselected by default (setup.cfg); CI runs them with -m asv_commands.
pytestmark = pytest.mark.asv_commands

ROOT = common.ROOT
FIND_HISTORY = ["package", "docs", "more work", "docs again"]  # "more work" changes WORK["b"]: 100 -> 150
BENCHMARKS = '''"""A cheap timing and a count of the package's work."""

import kv_attention


def time_sum():
    sum(range(50))


time_sum.repeat = (3, 5, 0.05)
time_sum.number = 100
time_sum.warmup_time = 0
time_sum.rounds = 1
time_sum.version = "1"


def peakmem_list():
    [0] * 200_000


peakmem_list.version = "1"


class Work:
    params = [["a", "b"]]
    param_names = ["part"]

    def track_work(self, part):
        return kv_attention.WORK[part]

    track_work.version = "1"


class Paired:
    """Measurable only where WORK["b"] is 150: which package a paired-timing worker imported."""

    def setup(self):
        if kv_attention.WORK["b"] != 150:
            raise NotImplementedError("WORK['b'] is not 150 at this commit")

    def time_work(self):
        sum(range(kv_attention.WORK["b"]))

    time_work.version = "1"
'''
PACKAGE = {
    "setup.cfg": "[metadata]\nname = kv-attention-tiny\nversion = 0.1\n\n[options]\npackages = kv_attention\n",
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61", "wheel"]\nbuild-backend = "setuptools.build_meta"\n',
    "benchmarks/__init__.py": "",
    "benchmarks/bench_tiny.py": BENCHMARKS,
    "benchmarks/pairs.py": (ROOT / "benchmarks" / "pairs.py").read_text(),  # the paired-timing core
}


class Project:
    def __init__(self, root, env):
        self.root, self.env, self.commits = root, env, {}

    def git(self, *args):
        return subprocess.run(["git", "-C", str(self.root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    def commit(self, message, files):
        for name, text in files.items():
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            (self.root / name).write_text(text)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        self.commits[message] = self.git("rev-parse", "HEAD")
        return self.commits[message]

    def config(self, name):
        """A copy of asv.conf.json whose results and html are ``.asv/<name>-results`` and ``-html``."""
        conf = json.loads((self.root / "asv.conf.json").read_text())
        conf.update(results_dir=f".asv/{name}-results", html_dir=f".asv/{name}-html")
        path = self.root / f"asv-{name}.json"
        path.write_text(json.dumps(conf, indent=1))
        return path

    def asv(self, *args, config=None, check=True, timeout=600):
        """``asv [--config CONFIG] ARGS`` in the project, as a user runs it; the CompletedProcess."""
        command = [sys.executable, "-m", "asv", *args] + (["--config", str(config)] if config else [])
        result = subprocess.run(command, cwd=self.root, env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def stored(self, config, commit, name="bench_tiny.time_sum"):
        """``(values, samples)`` of benchmark ``name`` in ``commit``'s result file, or None if it has none."""
        results_dir = self.root / json.loads(Path(config).read_text())["results_dir"]
        files = list(results_dir.glob(f"*/{commit[:8]}-*.json"))
        if not files:
            return None
        data = json.loads(files[0].read_text())
        row = data["results"].get(name)
        if row is None:
            return None
        columns = dict(zip(data["result_columns"], row))
        return columns["result"], columns.get("samples")

    def result_files(self, config):
        """The names of every result file under ``config``'s results_dir (machine.json aside)."""
        results_dir = self.root / json.loads(Path(config).read_text())["results_dir"]
        return sorted(p.name for p in results_dir.glob("*/*.json") if p.name != "machine.json")

    def column(self, config, commit, name, column):
        """One stored column (``started_at``, ``result``, ...) of benchmark ``name`` at ``commit``."""
        results_dir = self.root / json.loads(Path(config).read_text())["results_dir"]
        data = json.loads(next(results_dir.glob(f"*/{commit[:8]}-*.json")).read_text())
        return dict(zip(data["result_columns"], data["results"][name]))[column]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("asv-project")
    home = tmp_path_factory.mktemp("home")
    real_home = Path.home()
    env = {**os.environ, "HOME": str(home),  # pip and virtualenv keep their configuration and caches
           "XDG_CONFIG_HOME": os.environ.get("XDG_CONFIG_HOME", str(real_home / ".config")),
           "XDG_DATA_HOME": os.environ.get("XDG_DATA_HOME", str(real_home / ".local" / "share")),
           "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(real_home / ".cache"))}
    env.pop("PYTHONPATH", None)
    project = Project(root, env)
    project.git("init", "-q", "-b", "main")
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    del conf["matrix"]  # no numpy: a cheap environment
    files = {**PACKAGE, "asv.conf.json": json.dumps(conf, indent=1), "README.md": "tiny"}
    for message in FIND_HISTORY:
        work = 150 if message in ("more work", "docs again") else 100
        files = {**files, "kv_attention/__init__.py": f'WORK = {{"a": 100, "b": {work}}}\n'}
        if message.startswith("docs"):
            files = {"README.md": message}
        project.commit(message, files)
    (root / ".gitignore").write_text(".asv/\nasv-*.json\n")
    project.asv("machine", "--yes")
    project.asv("setup", check=False)  # the virtualenv, once for every test (asv setup always exits 1)
    return project


def test_asv_machine_records_hostname_and_fingerprint_unless_given_a_name(project):
    recorded = json.loads((Path(project.env["HOME"]) / ".asv-machine.json").read_text())
    name = machine.default_name()
    assert re.fullmatch(r".+-[0-9a-f]{8}", name) and name in recorded
    assert recorded[name]["machine"] == name and recorded[name]["cpu"] == machine.cpu_description()
    project.asv("machine", "--yes", "--mach", "lab-box")  # argparse's abbreviation counts as given
    assert "lab-box" in json.loads((Path(project.env["HOME"]) / ".asv-machine.json").read_text())


def test_plain_asv_run_records_samples_and_quick_never_replaces_them(project):
    config = project.config("run")
    head, before = project.commits["docs again"], project.commits["more work"]
    project.asv("run", f"{head}^!", config=config)  # plain asv run, no --record-samples
    values, samples = project.stored(config, head)
    assert len(samples[0]) >= 3 and min(samples[0]) <= values[0] <= max(samples[0])
    counts = {name: [project.column(config, head, name, c) for c in ("result", "started_at")]
              for name in ("bench_tiny.Work.track_work", "bench_tiny.peakmem_list")}
    out = project.asv("run", "--quick", f"{before}~1..{head}", config=config).stdout  # both
    assert "stored without samples" in out
    assert project.stored(config, head) == (values, samples)  # the measured point stands
    for name, (value, started_at) in counts.items():  # and so do the counts and peakmem, without samples
        assert [project.column(config, head, name, c) for c in ("result", "started_at")] == [value, started_at]
    quick_values, quick_samples = project.stored(config, before)
    assert quick_values[0] > 0 and quick_samples is None  # a new quick point has no samples


def test_plain_asv_continuous_records_samples(project):
    config = project.config("continuous")
    base, head = project.commits["docs"], project.commits["more work"]
    result = project.asv("continuous", "--no-record-samples", "--bench", "time_sum", base, head,
                         config=config, check=False)
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: the timing moved (noise)
    for commit in (base, head):
        assert len(project.stored(config, commit)[1][0]) >= 3


def test_the_main_job_measures_a_stored_timing_without_samples_again(project, monkeypatch, capsys):
    from asv.machine import Machine

    monkeypatch.setattr(common, "ROOT", project.root)
    monkeypatch.setattr(Machine, "hardcoded_machine_name", None)
    monkeypatch.chdir(project.root)
    for key, value in project.env.items():
        monkeypatch.setenv(key, value)
    head = project.commits["docs again"]
    project.asv("run", "--quick", f"{head}^!")
    conf, benchmarks, name, env_names = results.asv_setup()
    assert name == machine.default_name()
    assert not results.has_results(head, conf, benchmarks, name, env_names)
    monkeypatch.setattr(bench, "select_commits", lambda whole_history, bound=None: [head])
    monkeypatch.setattr(bench, "publish", lambda: None)
    args = bench.setup_arguments(argparse.ArgumentParser().add_subparsers()).parse_args([])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "measured again" in out and "benchmarking 1" in out
    assert re.search(r"\n  \.venv/bin/python -m asv preview\nand open http://127\.0\.0\.1:80\d\d/", out), out
    assert len(project.stored(project.root / "asv.conf.json", head)[1][0]) >= 3
    assert results.has_results(head, conf, benchmarks, name, env_names)


def test_paired_workers_time_each_commit_with_its_own_package_not_the_working_trees(project, monkeypatch):
    """The working tree is at 'docs again' (WORK['b'] = 150). 'docs' has 100: its worker skips the point,
    as asv does at that commit; 'more work' and 'docs again' both have 150 and are paired."""
    from asv.machine import Machine

    from tools import pairs

    monkeypatch.setattr(common, "ROOT", project.root)
    monkeypatch.setattr(Machine, "hardcoded_machine_name", None)
    monkeypatch.chdir(project.root)
    for key, value in project.env.items():
        monkeypatch.setenv(key, value)
    conf, benchmarks, _, _ = results.asv_setup()
    if benchmarks is None or "bench_tiny.Paired.time_work" not in benchmarks:
        project.asv("run", "--quick", "--dry-run", "--bench", "Paired", f"{project.commits['docs again']}^!")
        conf, benchmarks, _, _ = results.asv_setup()
    env = pairs.environments(conf)[0]
    points = pairs.timing_points(benchmarks, ["bench_tiny.Paired.time_work", "bench_tiny.time_sum"])
    assert [label for *_, label in points] == ["bench_tiny.Paired.time_work", "bench_tiny.time_sum"]
    docs, more, again = (project.commits[m] for m in ("docs", "more work", "docs again"))
    skipped = pairs.measure(conf, env, docs, more, points[:1], progress=lambda line: None)
    assert skipped == {"bench_tiny.Paired.time_work": {"skipped": "WORK['b'] is not 150 at this commit",
                                                       "role": "base"}}
    paired = pairs.measure(conf, env, more, again, points, progress=lambda line: None)
    for outcome in paired.values():
        assert isinstance(outcome, pairs.Paired) and outcome.pairs >= pairs.MIN_PAIRS
        assert outcome.low <= outcome.ratio <= outcome.high


def test_asv_find_names_the_commit_where_a_count_changed(project):
    config = project.config("find")
    good, change, bad = (project.commits[m] for m in ("docs", "more work", "docs again"))
    result = project.asv("find", f"{good}^..{bad}", r"track_work\('b'\)", config=config)
    assert re.search(r"Greatest regression found: (\w+)", result.stdout).group(1) == change[:8]
    # measured for one parameter combination only: not kept, so the main job measures it whole
    assert all(project.stored(config, c, "bench_tiny.Work.track_work") is None for c in (good, change, bad))
    assert project.result_files(config) == []  # and no empty result file is left behind


def test_asv_find_says_no_change_to_find_when_every_value_is_equal(project):
    """Issue 20: asv find named a commit ("Greatest regression found") though every value was equal."""
    config = project.config("find-equal")
    first, last = project.commits["package"], project.commits["docs again"]
    result = project.asv("find", f"{first}..{last}", r"track_work\('a'\)", config=config, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no change to find: bench_tiny.Work.track_work is 100 at each of the" in result.stdout
    assert "Greatest regression found" not in result.stdout
    assert project.result_files(config) == []


def test_bisect_names_the_commit_where_a_count_changed_by_the_gates_rule(project):
    env = {**project.env, common.INSIDE_VENV: "1"}

    def bisect(*args):
        return subprocess.run([sys.executable, "-m", "tools.dev", "bisect", *args], cwd=project.root, env=env,
                              capture_output=True, text=True, timeout=600)

    good, change, bad = (project.commits[m] for m in ("package", "more work", "docs again"))
    found = bisect(good, bad, "--bench", r"track_work\('b'\)")
    assert found.returncode == 0, found.stdout + found.stderr
    assert re.search(r"first bad commit: (\w+) more work", found.stdout).group(1) == change[:8]
    assert "1.500x of its parent" in found.stdout
    several = bisect(good, bad, "--bench", "track_work")
    assert several.returncode == 2 and "selects 2 benchmark points" in several.stderr
    equal = bisect(good, bad, "--bench", r"track_work\('a'\)")
    assert equal.returncode == 1 and "no change to find" in equal.stdout, equal.stdout + equal.stderr
    files = [p for p in (project.root / ".asv" / "results").glob("*/*.json") if p.name != "machine.json"]
    empty = [p.name for p in files if not json.loads(p.read_text())["results"]]
    assert empty == []  # what bisect measured for one combination only is not kept, nor left as an empty file


@pytest.mark.skipif(shutil.which("npm") is None, reason="no npm: the dashboard cannot be made offline-ready")
def test_plain_asv_publish_writes_the_offline_dashboard_with_its_views(project):
    config = project.config("publish")
    project.asv("run", "--quick", f"{project.commits['docs again']}^!", config=config)
    project.asv("publish", config=config)
    html = project.root / ".asv" / "publish-html"
    index = (html / "index.html").read_text()
    assert not re.findall(r'(?:src|href)="https?://(?!github\.com)', index)
    assert (html / "vendor" / "jquery" / "dist" / "jquery.min.js").is_file()
    assert '<script src="kv-attention-views.js"></script>' in index
    assert "p-part=%27a%27" not in (html / "kv-attention-views.js").read_text()  # part is no compared parameter


def start_preview(project, *args, env=None):
    """``asv preview ARGS`` in the background: ``(process, its 'Serving at' line)``."""
    config = project.config("preview")
    (project.root / ".asv" / "preview-html").mkdir(parents=True, exist_ok=True)
    (project.root / ".asv" / "preview-html" / "index.html").write_text("<p>dashboard</p>")
    process = subprocess.Popen([sys.executable, "-m", "asv", "preview", "--config", str(config), *args],
                               cwd=project.root, env={**project.env, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "Serving" in line or "rror" in line:
            break
    return process, "".join(lines)


def listening_addresses(port):
    """Local addresses of the TCP sockets listening on ``port`` (Linux /proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if int(hex_port, 16) == port and state == "0A":  # LISTEN
                    found.add(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the listening sockets from /proc/net/tcp")
def test_asv_preview_listens_on_loopback_and_prints_the_address_it_really_uses(project):
    blocker = socket.socket()
    try:
        blocker.bind(("127.0.0.1", 8080))  # taken, by this test or by someone else
        blocker.listen()
    except OSError:
        pass
    process, out = start_preview(project)
    try:
        match = re.search(r"Serving \S+ at http://127\.0\.0\.1:(\d+)/", out)
        assert match, out
        port = int(match.group(1))
        assert port != 8080 and "8080 already in use" in out
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            time.sleep(0.2)
            assert b"dashboard" in connection.recv(4096) + connection.recv(4096)
    finally:
        process.terminate()
        process.wait(timeout=10)
        blocker.close()
    process, out = start_preview(project, "--port", "0", env={"KV_ATTENTION_PREVIEW_HOST": "0.0.0.0"})
    try:
        assert re.search(r"at http://0\.0\.0\.0:\d+/ \(listening on every interface", out), out
    finally:
        process.terminate()
        process.wait(timeout=10)
