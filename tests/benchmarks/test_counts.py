"""The counting machinery (benchmarks/counts.py): dumps, the cycle estimate, outcomes, and one real callgrind run."""

import shutil

import pytest

from benchmarks import counts
from benchmarks.common import timed_inputs, verified_strategy

EVENTS = {"Ir": 1000, "Dr": 300, "Dw": 200, "I1mr": 7, "D1mr": 11, "D1mw": 13, "ILmr": 2, "DLmr": 3, "DLmw": 5}
DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: Trigger: Client Request: {label}

positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 1000 300 200 7 11 13 2 3 5


ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6
fn=(1) memcpy
0 999 1 2 3 4 5 6 7 8
"""


def test_the_cycle_estimate_weighs_misses_as_kcachegrind():
    # KCachegrind: CEst = Ir + 10 L1m + 100 LLm, L1m = I1mr + D1mr + D1mw, LLm = ILmr + DLmr + DLmw
    assert counts.estimated_cycles(EVENTS) == 1000 + 10 * (7 + 11 + 13) + 100 * (2 + 3 + 5)


def test_read_dumps_takes_the_summary_of_labelled_dumps_only(tmp_path):
    (tmp_path / "callgrind.out.42.1").write_text(DUMP.format(label=counts.label(1, 3)))
    (tmp_path / "callgrind.out.42").write_text(DUMP.replace("Client Request: {label}", "Program termination"))
    (tmp_path / "status.jsonl").write_text("{}")
    assert counts.read_dumps(tmp_path) == {counts.label(1, 3): EVENTS}


def test_client_requests_do_nothing_outside_valgrind():
    requests = counts.ClientRequests()
    assert requests.request(requests.ZERO_STATS) == 0  # RDX = 0 falls through on a real CPU
    requests.dump_stats_at("not under valgrind")


def test_the_suite_counts_every_count_class_in_one_shared_setup_cache():
    """asv runs one setup_cache per place of definition: every count class inherits the base's, so valgrind
    starts once per commit, for every class of the suite."""
    from benchmarks import bench_batch, bench_cache, bench_heads, bench_prefill, bench_quantized, bench_ragged, bench_split

    classes = counts.suite_classes()
    assert classes == [bench_batch.BatchCounts, bench_batch.BatchSizeCounts, bench_cache.CacheCounts,
                       bench_heads.HeadsCounts, bench_prefill.PrefillCounts, bench_quantized.QuantizedCounts,
                       bench_ragged.RaggedCounts,
                       bench_split.CascadeCounts]
    assert all(c.setup_cache is counts.Counts.setup_cache for c in classes)
    assert TinyCounts not in classes  # a count class outside the suite is not the suite's


class TinyCounts(counts.Counts):
    """Two lengths of the preallocated decode, a point the commit lacks and a point whose check fails."""

    params = [[8, 16, "missing", "wrong"]]
    param_names = ["T"]

    def prepare(self, T):
        if T == "missing":
            raise NotImplementedError("kv_attention has no such strategy at this commit")
        if T == "wrong":
            raise AssertionError("preallocated at T=8: not equal to the oracle")
        return verified_strategy("preallocated", T), timed_inputs(T)


class ShortCounts(TinyCounts):
    """One short point of TinyCounts' decode."""

    params = [[8]]


def outcome_of(counted, point):
    bench = TinyCounts()
    bench.setup(counted, point)
    return bench.track_instructions(counted, point), bench.track_estimated_cycles(counted, point)


def test_setup_skips_fails_or_reports_as_the_counting_process_found():
    key = counts.class_key(TinyCounts)
    counted = {"points": {(key, (8,)): {"value": EVENTS}, (key, ("missing",)): {"skipped": "no such strategy"},
                          (key, ("wrong",)): {"failed": "AssertionError: not equal"}}}
    assert outcome_of(counted, 8) == (1000, counts.estimated_cycles(EVENTS))
    with pytest.raises(NotImplementedError, match="no such strategy"):
        outcome_of(counted, "missing")
    with pytest.raises(AssertionError, match="not equal"):
        outcome_of(counted, "wrong")
    with pytest.raises(AssertionError, match="was not checked"):
        outcome_of(counted, 16)


def test_without_valgrind_every_point_skips_saying_how_to_install_it(monkeypatch):
    monkeypatch.setattr(counts.shutil, "which", lambda name: None)
    counted = TinyCounts().setup_cache()
    assert counted == {"unavailable": f"valgrind is not installed: {counts.INSTALL_HINT}"}
    assert counts.count_classes([TinyCounts]) == counted
    with pytest.raises(NotImplementedError, match="apt-get install valgrind"):
        outcome_of(counted, 8)


@pytest.fixture(scope="module")
def counted():
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    from threadpoolctl import threadpool_limits

    # The one-thread pin, as asv.conf.json sets it: here for the native checks, in the environment for valgrind's.
    with pytest.MonkeyPatch.context() as patch, threadpool_limits(limits=1):
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            patch.setenv(name, "1")
        yield counts.count_classes([TinyCounts])


def test_one_callgrind_process_counts_each_point_and_keeps_the_outcomes(counted):
    points = {params: outcome for (_, params), outcome in counted["points"].items()}
    assert points[("missing",)] == {"skipped": "kv_attention has no such strategy at this commit"}
    assert points[("wrong",)] == {"failed": "AssertionError: preallocated at T=8: not equal to the oracle"}
    small, large = points[(8,)]["value"], points[(16,)]["value"]
    assert set(small) == set(EVENTS)
    # The preallocated decode's work is nearly linear in T (per-step Python and numpy calls dominate at d = 64):
    # twice the steps, about twice the instructions, and far from the millions a whole process's start-up costs.
    assert 1.6 < large["Ir"] / small["Ir"] < 2.4
    assert 100_000 < small["Ir"] < 5_000_000
    assert small["Dr"] + small["Dw"] < small["Ir"] and 0 <= small["DLmr"] <= small["D1mr"] <= small["Dr"]


def test_the_checks_run_natively_before_valgrind_and_only_passed_points_are_counted(monkeypatch):
    from threadpoolctl import threadpool_limits

    from benchmarks import common

    monkeypatch.setattr(common, "VERIFIED", set())
    with threadpool_limits(limits=1):
        checked = counts.check_classes([TinyCounts])
    assert checked == {(0, 2): {"skipped": "kv_attention has no such strategy at this commit"},
                       (0, 3): {"failed": "AssertionError: preallocated at T=8: not equal to the oracle"}}
    assert common.VERIFIED == {"preallocated at T=8, B=None", "preallocated at T=16, B=None"}


WORK = "def work():\n    return sum(range({n}))\n"
POINTS = '''from benchmarks.counts import Counts


class WorkCounts(Counts):
    params = [[1]]
    param_names = ["B"]

    def prepare(self, B):
        import kvwork

        return kvwork.work, ()
'''


def test_the_counts_are_of_the_installed_commit_not_of_the_working_tree(tmp_path, monkeypatch):
    """A repository whose second commit does 1,000 times the work of its first, its working tree at the first,
    the second installed as asv installs a commit (its own site folder, first on the environment's path): the
    count is the second's. Counting the working tree's copy gave the first's."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    import subprocess

    repo, site = tmp_path / "repo", tmp_path / "site"
    (repo / "kvwork").mkdir(parents=True)
    (repo / "worksuite").mkdir()
    (repo / "worksuite" / "__init__.py").write_text("")
    (repo / "worksuite" / "points.py").write_text(POINTS)

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for n in (100, 100_000):  # commit 1, then commit 2: 1,000 times the loop
        (repo / "kvwork" / "__init__.py").write_text(WORK.format(n=n))
        git("add", "-A")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"work {n}")
    second = git("rev-parse", "HEAD").strip()
    git("checkout", "-q", "HEAD~1")  # the working tree at commit 1
    site.mkdir()
    archive = subprocess.run(["git", "-C", str(repo), "archive", second, "kvwork"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(site)], input=archive, check=True)  # commit 2, installed
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.syspath_prepend(str(repo))
    from worksuite.points import WorkCounts

    counted = counts.count_classes([WorkCounts])
    events = counted["points"][(counts.class_key(WorkCounts), (1,))]["value"]
    assert events["Ir"] > 1_000_000  # 100,000 iterations of sum's loop; commit 1's 100 cost a few thousand


def test_the_counts_do_not_move_with_the_length_of_the_callers_tmpdir(tmp_path, monkeypatch):
    """The counting process's folder is under /tmp whatever TMPDIR says: its path's length is in the process's
    arguments, and a longer one moved the counts of identical code by up to 0.33 % before."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    from threadpoolctl import threadpool_limits

    runs = []
    for name in ("t", "a-temporary-folder-with-a-much-longer-name-than-the-first"):
        (tmp_path / name).mkdir()
        with pytest.MonkeyPatch.context() as patch, threadpool_limits(limits=1):
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                patch.setenv(var, "1")
            patch.setenv("TMPDIR", str(tmp_path / name))
            patch.setattr(counts.tempfile, "tempdir", None)  # tempfile reads TMPDIR once, then caches it
            runs.append(next(iter(counts.count_classes([ShortCounts])["points"].values())))
    assert runs[0]["value"]["Ir"] > 100_000 and runs[0] == runs[1]


def test_the_package_metadata_holds_no_readme():
    """asv_runner reads every installed distribution's METADATA in each benchmark process, so a README in it moved
    that process's heap with each README commit, and the counts of identical code (a cycle estimate by 4 %)."""
    import configparser

    from tools import common

    setup = configparser.ConfigParser()
    setup.read(common.ROOT / "setup.cfg")
    assert not {"long_description", "long_description_content_type"} & set(setup["metadata"])


def test_the_counting_process_reads_no_distribution_metadata(tmp_path):
    """The counting process keeps asv_runner out, so no installed METADATA (older commits': the README) moves its
    heap; the suite then skips with NotImplementedError. A probe in its place imports the suite's common module."""
    import json
    import subprocess
    import sys

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "child.py").write_text(
        "import json, sys\n"
        "def main(args):\n"
        "    opened = []\n"
        "    sys.addaudithook(lambda e, a: e == 'open' and 'dist-info' in str(a[0]) and opened.append(str(a[0])))\n"
        "    from benchmarks import common\n"
        "    json.dump({'opened': opened, 'skip': common.SkipNotImplemented.__name__}, open(args[0], 'w'))\n")
    out = tmp_path / "out.json"
    packages = {"benchmarks": counts.package_folder(counts.__name__), "probe": str(probe)}
    subprocess.run([sys.executable, *counts.CHILD_FLAGS, "-c", counts.CHILD.format(module="probe.child"),
                    json.dumps(packages), str(out)], env=counts.child_environment(), cwd="/", check=True)
    assert json.loads(out.read_text()) == {"opened": [], "skip": "NotImplementedError"}
