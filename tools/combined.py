"""Several machines' results in one dashboard, by asv's own ``asv publish``.

asv publishes every machine found in its ``results_dir`` (one folder per
machine, named as asv named it, holding its ``machine.json``) and its pages
let the reader choose between them: a "machine" panel beside each graph and
in the summary list. :func:`publish_together` therefore gives ``asv publish``
a results directory that holds each machine's folder:

- in a new temporary directory, a copy of the configured ``results_dir``'s
  machine folders and of every ``--with`` directory's (``docs/results``):
  each folder's ``machine.json`` and result files copied byte for byte under
  the folder's own name, and the configured ``benchmarks.json`` (else the
  first ``--with`` directory's);
- a copy of the project's ``asv.conf.json`` whose ``results_dir`` is that
  directory (its other paths made absolute, its ``.``-plugins linked), with
  which ``asv publish`` runs; the asv plugin then finishes the dashboard as
  after any ``asv publish`` (:func:`tools.commands.publish.finish`).

A machine keeps its identity: nothing is renamed or rewritten, and a machine
name (folder name or ``machine.json``'s ``machine``) found in two folders, of
two directories or of one, is refused, since asv would merge the two into one
machine. Nothing is written
into the directories read; a file there that is not a regular file (a FIFO, a
device, a dangling symlink) is never opened. A result file asv cannot read (not
a regular file, unreadable, not JSON, not an asv result file of its folder's
machine) is left out with a note naming it and why, and the rest is published:
asv publish itself would skip it, warning only of the temporary copy. The
temporary directory is removed afterwards.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

from . import common
from .common import UserError
from .results import check_with_dir, machine_folders, machine_name, read_file

PATH_KEYS = ("repo", "benchmark_dir", "env_dir", "html_dir")  # config paths asv reads relative to the config


def load_config(path):
    """The asv config at ``path`` (JSON with comments, read by asv's own loader) as a dict."""
    from asv.util import load_json

    try:
        conf = load_json(str(path), js_comments=True)
    except Exception as exc:  # asv raises its UserError, or others on odd content
        raise UserError(f"cannot read asv config {path}: {str(exc) or type(exc).__name__}") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("results_dir", "results"), str):
        raise UserError(f"cannot read asv config {path}: not an object with a string results_dir")
    return conf


def unreadable_result(path, machine):
    """Why asv cannot read ``path`` as a result file of ``machine`` (asv's ``Results.load``, as asv publish
    reads it: JSON of asv's format, of that machine), or None if it can."""
    from asv.results import Results

    try:
        Results.load(path, machine_name=machine)
    except Exception as exc:  # asv raises UserError, and others on odd content
        return str(exc).replace(path, "it")[:200] or type(exc).__name__
    return None


def gather(results_dir, also):
    """``[(source directory, folder name, folder path, machine name)]`` of every machine to publish.

    ``results_dir`` (the configured one) may be missing or empty when ``also``
    holds machines; every ``also`` directory must hold one (:func:`tools.results.check_with_dir`).
    Raises UserError when a machine name (a folder's, or the one its machine.json names, asv's) is found in
    two folders, of two directories or of one: asv would show them as one machine.
    """
    sources = [str(results_dir)]
    for path in also:
        check_with_dir(str(path), sources)
        sources.append(os.path.abspath(path))
    found, seen = [], {}
    for source in sources:
        if not os.path.isdir(source):
            continue
        for folder, path in machine_folders(source).items():
            name = machine_name(path)
            for label in {folder, name}:
                if label in seen and seen[label] != path:
                    raise UserError(f"machine {label!r} has results in both {seen[label]} and {path}: asv "
                                    "would show them as one machine, and a machine's results are never merged "
                                    "or renamed; leave one of them out")
                seen[label] = path
            found.append((source, folder, path, name))
    if not found:
        raise UserError(f"{' nor '.join(sources)} holds no machine's results: run the main job first")
    return found


def copy_machine(path, target, machine, say):
    """Copy ``machine.json`` and the result files (``*.json``) of ``machine``'s folder ``path`` into ``target``.

    ``target`` is a new folder of a new directory, each file created there
    anew. Only regular files are read. A result file that cannot be read, or
    that asv cannot read as ``machine``'s (:func:`unreadable_result`), is left
    out with a note naming it and why, as the main job names each unreadable
    result file it moves aside (:func:`tools.results.quarantine_unreadable`);
    the directory read stays as it is. Returns ``(result files copied, left out)``.
    """
    os.mkdir(target)
    copied = skipped = 0
    for name in sorted(os.listdir(path)):
        if not name.endswith(".json") or name == "benchmarks.json":  # asv reads no benchmarks.json here
            continue
        source, copy = os.path.join(path, name), os.path.join(target, name)
        data, reason = read_file(source)
        if data is not None:
            with open(copy, "xb") as f:
                f.write(data)
            if name != "machine.json" and (reason := unreadable_result(copy, machine)):
                os.unlink(copy)
        if reason:
            say(f"note: skipped {source}: {reason}")
            skipped += name != "machine.json"
        else:
            copied += name != "machine.json"
    return copied, skipped


def write_config(conf, base, results_dir, work, html_dir=None):
    """``(work/asv.conf.json, its html_dir)``: ``conf`` with ``results_dir`` (and ``html_dir``) set, paths absolute.

    asv reads a config's relative paths, and imports its ``.``-plugins, from the
    config's own directory: each such plugin's top package is linked from ``base``.
    """
    conf = dict(conf, results_dir=str(results_dir))
    for key in PATH_KEYS:
        value = conf.get(key, "html" if key == "html_dir" else None)
        if isinstance(value, str) and "://" not in value:
            conf[key] = os.path.join(base, value)
    if html_dir is not None:
        conf["html_dir"] = os.path.abspath(html_dir)
    for plugin in conf.get("plugins") or []:
        if isinstance(plugin, str) and plugin.startswith(".") and len(plugin) > 1:
            package = plugin[1:].split(".")[0]
            link = work / package
            if not os.path.lexists(link) and os.path.exists(os.path.join(base, package)):
                link.symlink_to(os.path.join(base, package), target_is_directory=True)
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=2))
    return path, conf["html_dir"]


def graphed(html_dir):
    """``{folder: names of the benchmarks graphed}`` of a published dashboard (asv writes a benchmark's graph
    of a machine to ``graphs/.../machine-NAME/.../BENCHMARK.json``, and a ``summary.json`` beside them).

    NAME is asv's ``sanitize_filename`` of the machine's name (``/`` and ``<>:"\\^|?*`` become ``_``): look a
    machine up with :func:`graphs_of`.
    """
    names = {}
    for root, _, files in os.walk(os.path.join(html_dir, "graphs")):
        machines = [p[len("machine-"):] for p in Path(root).parts if p.startswith("machine-")]
        if machines:
            names.setdefault(machines[-1], set()).update(f[:-5] for f in files
                                                         if f.endswith(".json") and f != "summary.json")
    return names


def graphs_of(graphs, machine):
    """The benchmarks :func:`graphed` found for ``machine``, under the folder name asv gave it."""
    from asv.util import sanitize_filename

    return graphs.get(sanitize_filename(machine), set())


def files(count):
    """``1 result file``, ``2 result files``."""
    return f"{count} result file" + ("" if count == 1 else "s")


def left_out(count):
    """`` (2 left out: asv cannot read them, see the notes)``, or nothing when none was."""
    return f" ({count} left out: asv cannot read {'it' if count == 1 else 'them'}, see the notes)" if count else ""


def shown(path):
    """``path`` relative to the repository when inside it (``docs/results``), else as is."""
    path = os.path.abspath(path)
    inside = os.path.commonpath([path, str(common.ROOT)]) == str(common.ROOT)
    return os.path.relpath(path, common.ROOT) if inside else path


def publish_together(also, config=None, html_dir=None, say=print):
    """``asv publish`` of the configured results and every machine of the ``also`` directories, together.

    ``config`` defaults to this repository's asv.conf.json, ``html_dir`` to its
    ``html_dir``. Returns ``(html_dir, [(machine, source, result files, benchmarks graphed,
    result files left out)])``; each one left out is named on ``say`` (:func:`copy_machine`).

    Raises:
        UserError: a directory cannot be read or holds no machine, a machine is
            in two of them, there is no benchmarks.json, or asv publish fails
            or leaves a machine out.
    """
    config = Path(config or common.ROOT / "asv.conf.json")
    conf = load_config(config)
    base = os.path.dirname(os.path.abspath(config))
    results_dir = os.path.join(base, conf.get("results_dir", "results"))
    output = os.path.realpath(html_dir or os.path.join(base, conf.get("html_dir", "html")))
    for path in also:  # asv publish empties its html_dir: a --with directory inside it would be deleted
        real = os.path.realpath(path)
        if real == output or real.startswith(output + os.sep):
            raise UserError(f"--with {path}: inside the dashboard's folder {output}, which publishing replaces")
    machines = gather(results_dir, also)
    sources = [results_dir, *(os.path.abspath(p) for p in also)]
    benchmarks = next((data for data in (read_file(os.path.join(s, "benchmarks.json"))[0] for s in sources)
                       if data is not None), None)
    if benchmarks is None:
        raise UserError(f"no benchmarks.json in {' nor '.join(sources)}: asv publish needs the suite's "
                        "(asv run writes it)")
    work = Path(tempfile.mkdtemp(prefix="kv-attention-publish-"))
    try:
        combined = work / "results"
        combined.mkdir()
        (combined / "benchmarks.json").write_bytes(benchmarks)
        counts = {}
        for source, folder, path, name in machines:
            counts[name] = copy_machine(path, combined / folder, name, say)
            say(f"machine {name}: {files(counts[name][0])}, from {shown(source)}" + left_out(counts[name][1]))
        published, html = write_config(conf, base, combined, work, html_dir)
        common.run(*common.ASV, "--config", str(published), "publish")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    try:
        listed = set(json.loads(Path(html, "index.json").read_text())["machines"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"asv publish wrote no readable {html}/index.json") from None
    missing = sorted({name for _, _, _, name in machines} - listed)
    if missing:
        raise UserError(f"asv publish left out machine {', '.join(missing)}: its machine.json or result files "
                        "could not be read (see asv's warnings above)")
    graphs = graphed(html)
    return html, [(name, source, counts[name][0], len(graphs_of(graphs, name)), counts[name][1])
                  for source, _, _, name in machines]
