"""Output paths (tools/paths.py) through ``report csv --out`` and ``report plots --out``: each attack of issue 12.

Every refused path is checked afterwards to be exactly what it was: the device
still a device, the FIFO still a FIFO, the result file and the tracked config
byte for byte unchanged.
"""

import os
import socket
import stat
import subprocess

import pytest

from tools import paths

from .test_report import inside_venv, repo, report, write_run  # noqa: F401 (fixtures of the report tests)


@pytest.fixture
def project(repo):
    """test_report's repository with results, and a tracked asv.conf.json (``project.config``)."""
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], n_samples=2)
    subprocess.run(["git", "-C", str(path), "add", "asv.conf.json"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "config"],
                   check=True)
    return path


def csv(project, capsys, out):
    return report(project, "csv", "--out", str(out), capsys=capsys)


def one_line_error(code, err, *words):
    assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith("tools/dev.py report: error: ")
    assert all(w in err for w in words), err


def test_a_fifo_is_refused_and_stays_a_fifo(project, capsys, tmp_path):
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    code, out, err = csv(project, capsys, fifo)
    one_line_error(code, err, "is a FIFO, not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and "wrote" not in out


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_node_is_refused_and_stays_a_device(project, capsys, tmp_path):
    device = tmp_path / "full"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # a copy of /dev/full
    except PermissionError:  # root without CAP_MKNOD (a container)
        pytest.skip("mknod is not permitted here")
    code, _, err = csv(project, capsys, device)
    one_line_error(code, err, "is a character device")
    assert stat.S_ISCHR(os.lstat(device).st_mode) and os.lstat(device).st_rdev == os.makedev(1, 7)


def test_dev_null_and_anything_in_the_system_directories_is_refused(project, capsys, tmp_path):
    code, _, err = csv(project, capsys, "/dev/null")
    one_line_error(code, err, "is inside /dev")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    (tmp_path / "devices").symlink_to("/dev")
    code, _, err = csv(project, capsys, tmp_path / "devices" / "new.csv")  # through a symlink too
    one_line_error(code, err, "resolved", "is inside /dev")
    assert not os.path.lexists("/dev/new.csv")


def test_an_empty_path_is_refused(project, capsys):
    code, _, err = csv(project, capsys, "")
    one_line_error(code, err, "the path is empty")


def test_a_socket_and_a_directory_are_refused(project, capsys, tmp_path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock.csv"))
    try:
        code, _, err = csv(project, capsys, tmp_path / "sock.csv")
        one_line_error(code, err, "is a socket")
    finally:
        server.close()
    (tmp_path / "folder.csv").mkdir()
    code, _, err = csv(project, capsys, tmp_path / "folder.csv")
    one_line_error(code, err, "is a directory")
    assert (tmp_path / "folder.csv").is_dir()


def test_a_symlink_into_the_results_directory_is_refused(project, capsys, tmp_path):
    result = next((project / ".asv/results/box").glob("*-*.json"))
    before = result.read_bytes()
    link = tmp_path / "innocent.csv"
    link.symlink_to(result)
    code, _, err = csv(project, capsys, link)
    one_line_error(code, err, "resolved to", ".asv")
    assert result.read_bytes() == before and link.is_symlink()


def test_the_tracked_config_is_refused_directly_and_through_a_symlink(project, capsys, tmp_path):
    config = project / "asv.conf.json"
    before = config.read_bytes()
    code, _, err = csv(project, capsys, config)
    one_line_error(code, err, "a file git tracks")
    link = tmp_path / "elsewhere" / "link.csv"
    link.parent.mkdir()
    link.symlink_to(config)
    code, _, err = csv(project, capsys, link)
    one_line_error(code, err, "a file git tracks", "resolved to")
    assert config.read_bytes() == before


def test_inside_asv_and_git_is_refused(project, capsys):
    for out, words in ((project / ".asv/report/s.csv", f"is inside {project / '.asv'}"),
                       (project / ".git/s.csv", ".git directory"),
                       (paths.common.ROOT / ".asv" / "s.csv", "is inside")):
        code, _, err = csv(project, capsys, out)
        one_line_error(code, err, words)
        assert not out.exists()


def test_a_read_only_file_is_refused(project, capsys, tmp_path):
    kept = tmp_path / "kept.csv"
    kept.write_text("mine")
    kept.chmod(0o444)
    if os.access(kept, os.W_OK) and os.geteuid() != 0:
        pytest.skip("this filesystem ignores permissions")
    code, _, err = csv(project, capsys, kept)
    one_line_error(code, err, "read-only")
    assert kept.read_text() == "mine"


def test_replacing_a_regular_file_says_so_and_keeps_its_mode(project, capsys, tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("old")
    old.chmod(0o640)
    code, out, _ = csv(project, capsys, old)
    assert code == 0 and f"replaced the existing file {old}" in out
    assert old.read_text().startswith("commit,") and stat.S_IMODE(old.stat().st_mode) == 0o640
    code, out, _ = csv(project, capsys, tmp_path / "new.csv")
    assert code == 0 and "replaced" not in out


def test_a_symlink_to_an_allowed_file_writes_the_target_and_stays_a_link(project, capsys, tmp_path):
    target = tmp_path / "real" / "target.csv"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    code, out, _ = csv(project, capsys, link)
    assert code == 0 and link.is_symlink() and target.read_text().startswith("commit,")


def test_plots_refuse_a_symlink_in_place_and_write_nothing(project, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    result = next((project / ".asv/results/box").glob("*-*.json"))
    before = result.read_bytes()
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "ratios_vs_T.png").symlink_to(result)
    code, out, err = report(project, "plots", "--out", str(figs), capsys=capsys)
    one_line_error(code, err, "ratios_vs_T.png", "resolved to", ".asv")
    assert result.read_bytes() == before and sorted(p.name for p in figs.iterdir()) == ["ratios_vs_T.png"]


def test_plots_refuse_a_fifo_png_and_a_fifo_or_protected_directory(project, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    figs = tmp_path / "figs"
    figs.mkdir()
    os.mkfifo(figs / "time_vs_T.png")
    code, _, err = report(project, "plots", "--out", str(figs), capsys=capsys)
    one_line_error(code, err, "time_vs_T.png", "is a FIFO")
    os.mkfifo(tmp_path / "fifo_dir")
    code, _, err = report(project, "plots", "--out", str(tmp_path / "fifo_dir"), capsys=capsys)
    one_line_error(code, err, "is a FIFO, not a directory")
    code, _, err = report(project, "plots", "--out", str(project / ".asv/results/figs"), capsys=capsys)
    one_line_error(code, err, "is inside")
    assert not (project / ".asv/results/figs").exists()
    (tmp_path / "notes.md").write_text("mine")
    code, _, err = report(project, "plots", "--out", str(tmp_path / "notes.md"), capsys=capsys)
    one_line_error(code, err, "is a regular file, not a directory")
    before = sorted(os.listdir("/dev"))
    code, _, err = report(project, "plots", "--out", "/dev", capsys=capsys)
    one_line_error(code, err, "is inside /dev")
    assert sorted(os.listdir("/dev")) == before


def test_plots_replace_their_own_files_and_say_so(project, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    figs = tmp_path / "figs"
    assert report(project, "plots", "--out", str(figs), capsys=capsys)[0] == 0
    from tools.report.plots import FIGURES

    code, out, _ = report(project, "plots", "--out", str(figs), capsys=capsys)
    assert code == 0 and out.count("replaced ") == len(FIGURES) == 7
    assert [p.name for p in figs.iterdir() if p.name.startswith(".tmp-")] == []


def test_check_file_returns_the_resolved_path(tmp_path, monkeypatch):
    monkeypatch.setattr(paths.common, "ROOT", tmp_path / "project")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert paths.check_file(tmp_path / "b" / "x.csv") == (str(tmp_path / "a" / "x.csv"), False)
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(tmp_path / "project" / ".asv" / "results" / "x.json")
    with pytest.raises(paths.UserError, match="resolved to"):
        paths.check_file(dangling)
