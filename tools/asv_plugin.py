"""asv's own commands, as its users type them, with this repository's guarantees.

asv 0.6 imports every module listed in ``asv.conf.json``'s ``"plugins"`` when a
command starts (``Command.run_from_args``: after parsing the command line,
before running the command; a name with a leading "." is imported from the
directory of asv.conf.json) and calls its ``setup()``. This one is listed as
``".tools.asv_plugin"``. Its ``setup()`` wraps asv's commands so that:

- ``asv run``, ``asv continuous`` and ``asv find`` always record every timing
  sample (``--record-samples``), and a point that has samples is never
  replaced by one that has none; ``--quick`` never replaces any stored
  measured value (a timing with or without samples, a ``track_`` count, a
  ``peakmem_``), only fills in points that have none, stored without samples
  so that the main job sees them as incomplete and measures them again;
- ``asv find`` warns that it judges a timing by single medians, says "no
  change to find" (exit 1) rather than naming a commit when every value it
  measured is equal, and forgets the benchmarks it measured for only some
  parameter combinations (as the gate does, removing a result file left
  empty), so that the main job measures them whole;
- ``asv publish`` writes the dashboard the main job writes
  (:func:`tools.commands.publish.finish`: local copies of its JavaScript,
  default views, repository text shown as text);
- ``asv preview`` listens on 127.0.0.1 unless ``KV_ATTENTION_PREVIEW_HOST``
  says otherwise (asv parses its command line before plugins load, so a new
  option is impossible), and prints the address it really listens on;
- the machine name is :func:`tools.machine.default_name` (hostname plus a
  hardware fingerprint) unless ``--machine`` gives one, which must be one plain
  folder name (:func:`tools.machine.check_name`), and ``asv compare``
  picks this machine's results when several machines have some.

asv imports this module in ``.venv``: it needs only the standard library and
asv. The wrappers lean on asv 0.6.6's internals (pinned in setup.cfg); the
tests run the real commands.
"""

import errno
import functools
import http.server
import math
import os
import socket
import sys

from . import machine

PREVIEW_HOST = "KV_ATTENTION_PREVIEW_HOST"  # the address asv preview listens on (default 127.0.0.1)
PREVIEW_PORTS = range(8080, 8090)  # tried in turn when no --port is given, as asv tries from 8080
_STATE = {"installed": False, "quick": False}


def setup():
    """asv's plugin hook: install the wrappers, once per process."""
    if _STATE["installed"]:
        return
    _STATE["installed"] = True
    _keep_samples()
    _wrap_run()
    _wrap_find()
    _wrap_publish()
    _wrap_preview()
    _name_machine()
    _wrap_compare()


# --- samples --------------------------------------------------------------------------------------


def is_measured(value):
    """A stored value that is a measurement: a number, not None (failed) or NaN (skipped)."""
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


def _sampled_points(results, benchmark, every=False):
    """``{index: (value, stats, samples)}`` of ``results``' stored points of ``benchmark`` that have samples
    (``every``: every measured point, with samples or not; what a --quick run must not replace)."""
    name = benchmark["name"]
    if name not in results.get_all_result_keys() or results.benchmark_version.get(name) != benchmark["version"]:
        return {}
    params = benchmark["params"]
    values = results.get_result_value(name, params)
    stats = results.get_result_stats(name, params)
    samples = results.get_result_samples(name, params) or [None] * len(values)
    return {j: (values[j], stats[j], samples[j]) for j in range(len(values))
            if samples[j] is not None or (every and is_measured(values[j]))}


def _restore(results, name, kept):
    """Put back each kept point whose new value is a measurement without samples; the number put back."""
    values = results._results[name]
    if values is None:  # every point failed: a failure is never hidden
        return 0
    samples = results._samples[name] or [None] * len(values)
    stats = results._stats[name] or [None] * len(values)
    restored = 0
    for j, (value, stat, sample) in kept.items():
        if j < len(values) and is_measured(values[j]) and samples[j] is None:
            values[j], stats[j], samples[j] = value, stat, sample
            restored += 1
    if restored:
        results._samples[name] = samples if any(s is not None for s in samples) else None
        results._stats[name] = stats if any(s is not None for s in stats) else None
    return restored


def _same(values, others):
    """Two stored columns of values are equal, NaN (skipped) equal to NaN."""
    def key(value):
        return "NaN" if isinstance(value, float) and math.isnan(value) else value

    return values is not None and [key(v) for v in values] == [key(v) for v in others]


def _keep_samples():
    """Every result asv adds records its samples (but a --quick one), and never replaces one that has them;
    a --quick one replaces no measured value at all."""
    from asv.results import Results

    original = Results.add_result

    @functools.wraps(original)
    def add_result(self, benchmark, result, *args, **kwargs):
        quick = _STATE["quick"]
        kwargs["record_samples"] = not quick
        kept = _sampled_points(self, benchmark, every=quick)
        name = benchmark["name"]
        before = list(self._results.get(name) or [])
        when = self._started_at.get(name), self._duration.get(name)
        original(self, benchmark, result, *args, **kwargs)
        if kept and _restore(self, name, kept) and _same(self._results[name], before):
            # the run stored nothing new: the benchmark keeps when it was measured (the report's "measured")
            for column, value in zip((self._started_at, self._duration), when):
                if value is None:
                    column.pop(name, None)
                else:
                    column[name] = value

    Results.add_result = add_result


def _wrap_run():
    """``asv run`` (and ``asv continuous``, which calls it): a --quick run stores its points without samples."""
    from asv.commands.run import Run
    from asv.console import log

    original = Run.run.__func__

    def run(cls, conf, *args, **kwargs):
        quick = bool(kwargs.get("quick"))
        if quick and not kwargs.get("dry_run"):
            log.info("--quick: one sample per point, stored without samples and never over a measured "
                     "point (so the main job measures it again); add --dry-run to store nothing")
        _STATE["quick"] = quick
        try:
            return original(cls, conf, *args, **kwargs)
        finally:
            _STATE["quick"] = False

    Run.run = classmethod(functools.wraps(original)(run))


# --- asv find -------------------------------------------------------------------------------------


def _find_note(conf, bench):
    """A warning when ``asv find`` is about to judge a timing by single medians, or None."""
    from asv.benchmarks import Benchmarks
    from asv.util import UserError

    try:
        benchmarks = Benchmarks.load(conf, regex=bench)
    except UserError:  # no benchmarks.json yet: asv find discovers the suite itself
        return None
    timed = [name for name, b in benchmarks.items() if b.get("type") == "time"]
    if len(timed) != 1:
        return None
    params = benchmarks[timed[0]].get("params") or []
    selected = benchmarks.benchmark_selection.get(timed[0])
    points = len(selected) if selected is not None else math.prod(len(p) for p in params)
    spread = (f"the largest change over its {points} parameter combinations, so noise at any one of them "
              "can be named" if points > 1 else "one median per commit, without a significance test")
    return (f"asv find judges the timing {timed[0]} by {spread}; for a timing, python3 tools/dev.py bisect "
            "GOOD BAD --bench 'NAME\\(PARAMS\\)' applies the gate's rule to one point")


class _FindLog:
    """asv's log, for asv find: holds back its last line, "Greatest regression found: ...", for :func:`_wrap_find`."""

    def __init__(self, log):
        self._log, self.verdict = log, None

    def info(self, message, *args, **kwargs):
        if str(message).startswith("Greatest "):
            self.verdict = message
        else:
            self._log.info(message, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._log, name)


def _no_change(values):
    """The one value every commit ``asv find`` measured has (a tuple of its selected points), or None.

    ``values``: ``{commit: [value of each selected point]}``; a commit whose points all failed
    is not measured (asv find steps over it too); NaN equals NaN.
    """
    seen = {tuple("n/a" if isinstance(v, float) and math.isnan(v) else v for v in points)
            for points in values.values() if any(v is not None for v in points)}
    return next(iter(seen)) if len(seen) == 1 else None


def _wrap_find():
    """``asv find``: a warning for timings, "no change to find" rather than a commit when every value it
    measured is equal, and no partial benchmark (nor an empty result file) left for the main job to skip."""
    from asv.commands import find
    from asv.commands.find import Find
    from asv.console import log

    original = Find.run.__func__

    def run(cls, conf, range_spec, bench, *args, **kwargs):
        note = _find_note(conf, bench)
        if note:
            log.warning(note)
        values, names, measure = {}, set(), find.run_benchmarks

        def run_benchmarks(benchmarks, env, *run_args, **run_kwargs):  # what asv find measures, commit by commit
            result = measure(benchmarks, env, *run_args, **run_kwargs)
            for name in benchmarks:
                stored = result.get_result_value(name, benchmarks[name]["params"])
                chosen = benchmarks.benchmark_selection.get(name)
                values[result.commit_hash] = [v for i, v in enumerate(stored) if chosen is None or i in chosen]
                names.add(name)
            return result

        find.log, find.run_benchmarks = _FindLog(log), run_benchmarks
        try:
            code = original(cls, conf, range_spec, bench, *args, **kwargs)
            same = _no_change(values)
            if find.log.verdict is None:
                return code
            if same is None:
                log.info(find.log.verdict)
                return code
            shown = ", ".join(f"{v:,}" if is_measured(v) else str(v) for v in same)
            log.info(f"no change to find: {', '.join(sorted(names))} is {shown} at each of the {len(values)} "
                     "commits asv find measured, so it names no commit (exit 1)")
            return 1
        finally:
            find.log, find.run_benchmarks = log, measure
            if not kwargs.get("skip_save"):
                _drop_partial(conf, range_spec, bench, kwargs.get("machine"), kwargs.get("env_spec"))

    Find.run = classmethod(functools.wraps(original)(run))


def _drop_partial(conf, range_spec, bench, machine_name, env_spec):
    """Forget what ``asv find`` measured for only some parameter combinations (see results.drop_partial)."""
    from asv.console import log
    from asv.environment import get_environments
    from asv.machine import Machine
    from asv.repo import get_repo
    from asv.util import ProcessError, UserError

    from . import results

    try:
        commits = set(get_repo(conf).get_hashes_from_range(range_spec))
        env_names = {env.name for env in get_environments(conf, env_spec, verbose=False)}
    except (UserError, ProcessError):  # asv find has said what is wrong with the range or the environments
        return
    name = machine_name or Machine.get_unique_machine_name()
    if results.drop_partial(conf, name, env_names, commits, bench):
        log.info("results asv find measured for only some parameter combinations of a benchmark were not "
                 "kept, so that the main job measures that benchmark whole")


# --- asv publish and asv preview ------------------------------------------------------------------


def _wrap_publish():
    """``asv publish``, then what the main job adds to the dashboard (tools/commands/publish.py: finish)."""
    from asv.commands.publish import Publish
    from asv.console import log

    original = Publish.run.__func__

    def run(cls, conf, *args, **kwargs):
        code = original(cls, conf, *args, **kwargs)
        from asv.util import UserError

        from .common import UserError as CommandError
        from .commands.publish import finish

        try:
            finish(conf.html_dir, say=log.info)
        except CommandError as error:
            raise UserError(str(error)) from None
        return code

    Publish.run = classmethod(functools.wraps(original)(run))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(html_dir, host, port=0):
    """An HTTP server for ``html_dir`` on ``host``: ``(server, taken)``, ``taken`` the ports found in use.

    ``port`` 0 tries 8080 to 8089 in turn; another port is that one only.
    Raises asv's UserError when no port is free or ``host`` cannot be bound.
    """
    from asv.util import UserError

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html_dir))
    server_class = _Server6 if ":" in host else _Server
    taken = []
    for candidate in PREVIEW_PORTS if port == 0 else [port]:
        try:
            return server_class((host, candidate), handler), taken
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise UserError(f"cannot listen on {host} port {candidate}: {error.strerror or error}") from None
            taken.append(candidate)
    raise UserError(f"port{'s' if len(taken) > 1 else ''} {', '.join(map(str, taken))} on {host} "
                    "already in use: give a free one with --port")


def _url(host, port):
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _wrap_preview():
    """``asv preview``: loopback unless asked otherwise, and the address it really listens on."""
    from asv.commands.preview import Preview
    from asv.console import log
    from asv.util import UserError

    def run(cls, conf, port=0, browser=False):
        if not os.path.isfile(os.path.join(conf.html_dir, "index.html")):
            raise UserError(f"no dashboard in {conf.html_dir}: run asv publish first")
        host = os.environ.get(PREVIEW_HOST) or "127.0.0.1"
        server, taken = serve(conf.html_dir, host, port)
        real_host, real_port = server.server_address[:2]
        if taken:
            log.info(f"port {', '.join(map(str, taken))} already in use: serving on port {real_port} instead")
        url = _url(real_host, real_port)
        where = ("every interface: other machines can reach it" if real_host in ("0.0.0.0", "::")
                 else f"{real_host} only")
        log.info(f"Serving {conf.html_dir} at {url} (listening on {where}; set {PREVIEW_HOST}=0.0.0.0 "
                 "to listen on every interface)")
        sys.stdout.flush()
        if browser:
            import webbrowser

            webbrowser.open(_url("127.0.0.1" if real_host in ("0.0.0.0", "::") else real_host, real_port))
        log.info("Press ^C to abort\n")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            return None
        finally:
            server.server_close()

    Preview.run = classmethod(run)


# --- the machine ----------------------------------------------------------------------------------


def given(option, argv=None):
    """True when ``option`` (or an abbreviation argparse would accept) is on asv's command line."""
    words = {option[:k] for k in range(3, len(option) + 1)}
    return any(arg.split("=", 1)[0] in words for arg in (sys.argv[1:] if argv is None else argv))


def _name_machine():
    """This host's machine name is :func:`machine.default_name`, for every asv command."""
    from asv.commands.machine import Machine as MachineCommand
    from asv.machine import Machine

    name = machine.default_name()
    Machine.hardcoded_machine_name = name
    defaults = Machine.get_defaults

    def get_defaults():
        return {**defaults(), "machine": name}

    Machine.get_defaults = staticmethod(get_defaults)
    original = MachineCommand.run.__func__

    def run(cls, **kwargs):
        # asv built `asv machine`'s --machine default (the bare hostname) before this plugin loaded.
        if not given("--machine"):
            kwargs["machine"] = name
        return original(cls, **kwargs)

    MachineCommand.run = classmethod(functools.wraps(original)(run))
    saved = Machine.save

    def save(self, results_dir):  # where asv writes <results_dir>/<machine>/machine.json, before any result
        from asv.util import UserError

        try:
            machine.check_name(self.machine)
        except ValueError as error:
            raise UserError(str(error)) from None
        return saved(self, results_dir)

    Machine.save = functools.wraps(saved)(save)


def _wrap_compare():
    """``asv compare`` without --machine, when several machines have results: this machine's, if it has any."""
    from asv.commands.compare import Compare
    from asv.machine import Machine, iter_machine_files
    from asv.util import load_json

    original = Compare.run.__func__

    def run(cls, conf, *args, **kwargs):
        if kwargs.get("machine") is None:
            names = {load_json(path).get("machine") for path in iter_machine_files(conf.results_dir)}
            if len(names) > 1 and Machine.get_unique_machine_name() in names:
                kwargs["machine"] = Machine.get_unique_machine_name()
        return original(cls, conf, *args, **kwargs)

    Compare.run = classmethod(functools.wraps(original)(run))
