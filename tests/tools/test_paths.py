"""Output paths (tools/paths.py) through ``report csv --out`` and ``report plots --out``: never through a FIFO, a
device or a symlink; every refused path checked afterwards to be what it was."""

import os
import stat

import pytest

from tools import paths

from .test_report import inside_venv, repo, report, write_run  # noqa: F401 (fixtures of the report tests)


@pytest.fixture
def project(repo):
    path, hashes = repo
    write_run(path / ".asv/results", hashes[2], n_samples=2)
    return path


def one_line_error(code, err, *words):
    assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith("tools/dev.py report: error: ")
    assert all(w in err for w in words), err


def test_a_fifo_is_refused_and_stays_a_fifo(project, capsys, tmp_path):
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    code, out, err = report(project, "csv", "--out", str(fifo), capsys=capsys)
    one_line_error(code, err, "is a FIFO, not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and "wrote" not in out


def test_a_device_is_refused_and_stays_a_device(project, capsys):
    code, _, err = report(project, "csv", "--out", "/dev/null", capsys=capsys)
    one_line_error(code, err, "is a character device, not a regular file")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_is_never_written_through(project, capsys, tmp_path):
    result = next((project / ".asv/results/box").glob("*-*.json"))
    before = result.read_bytes()
    for target in (result, tmp_path / "mine.csv"):
        link = tmp_path / "link.csv"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        code, _, err = report(project, "csv", "--out", str(link), capsys=capsys)
        one_line_error(code, err, "is a symlink, not a regular file")
        assert link.is_symlink() and result.read_bytes() == before and not (tmp_path / "mine.csv").exists()


def test_a_regular_file_is_replaced_whole(project, capsys, tmp_path):
    out = tmp_path / "deep" / "samples.csv"
    assert report(project, "csv", "--out", str(out), capsys=capsys)[0] == 0
    code, printed, _ = report(project, "csv", "--out", str(out), capsys=capsys)
    assert code == 0 and "wrote" in printed and out.read_text().startswith("commit,")
    assert [p.name for p in out.parent.iterdir()] == ["samples.csv"]  # no temporary file left


def test_plots_refuse_a_fifo_png_and_a_fifo_directory(project, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    figs = tmp_path / "figs"
    figs.mkdir()
    os.mkfifo(figs / "batch_per_step.png")
    code, _, err = report(project, "plots", "--out", str(figs), capsys=capsys)
    one_line_error(code, err, "batch_per_step.png", "is a FIFO")
    os.mkfifo(tmp_path / "fifo_dir")
    code, _, err = report(project, "plots", "--out", str(tmp_path / "fifo_dir"), capsys=capsys)
    one_line_error(code, err, "is a FIFO, not a directory")


def test_check_file_resolves_the_folders_symlinks(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert paths.check_file(tmp_path / "b" / "x.csv") == str(tmp_path / "a" / "x.csv")
