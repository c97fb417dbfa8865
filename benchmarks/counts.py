"""Instruction counts per decode: callgrind, with counting switched on around the decode only.

A timing moves with the machine's load; the instructions a decode executes do
not. An experiment's count points are a subclass of :class:`Counts` in its
bench module, with asv's ``params`` and ``param_names`` and a ``prepare``
method that returns ``(decode, inputs)`` through the experiment's correctness
check (``common.verified_decode`` and its wrappers), so the counts are taken on
the same timed problem, behind the same check, as the timings::

    class CacheCounts(Counts):
        params = [[16, 64], list(STRATEGIES["cache"])]
        param_names = ["T", "strategy"]

        def prepare(self, T, strategy):
            return verified_strategy(strategy, T), timed_inputs(T)

How the suite is counted: every count class inherits the one ``setup_cache``
of :class:`Counts`, and asv runs a ``setup_cache`` once per place it is defined
and environment, handing its result to every point of every class that shares
it. So valgrind starts ONCE per commit (its start-up with numpy costs seconds):
one process, the benchmark's own interpreter (``sys.executable``: the commit
under test's kv_attention, from its asv environment; the suite's packages alone
from the working tree, as asv imports them) under ``valgrind --tool=callgrind``
with instrumentation and collection off, in a fixed environment
(:func:`child_environment`) and folder, which for every parameter combination
of every count class of the suite

1. calls ``prepare`` to build the point's decode and inputs. The correctness
   check inside it has already run natively, in asv's process, before valgrind
   started (:func:`check_classes`: NotImplementedError skips the point, any
   other error fails it, as for the timings); the keys that passed are handed
   to the counting process, so under valgrind ``prepare`` does not check again;
2. decodes :data:`WARMUP_DECODES` times uninstrumented (the first call, with
   its first-call work: numpy's caches), so the counted decode is always the
   same call of the point's sequence;
3. switches instrumentation on (callgrind then clears its simulated caches:
   every point starts from the same cold caches), zeroes the counters,
   switches collection on, decodes, switches it off, dumps the counters under
   the point's label and switches instrumentation off.

Uninstrumented, valgrind runs numpy's BLAS kernels 30-90 times slower than
natively, and instrumented with the cache simulation 100 times or more, so a
class's points are a few small problems, one or two lengths of the timed ones.

The switches are callgrind's client requests (valgrind/callgrind.h), issued by
valgrind.h's amd64 "special instruction" sequence from an executable page
through ctypes (:class:`ClientRequests`): nothing outside the standard library
needs installing in asv's per-commit environment. Outside valgrind the
sequence does nothing. Garbage collection is off while a point is counted.

What is reported per point: ``Ir``, the instructions executed
(``track_instructions``), and an estimated cycle count
(``track_estimated_cycles``) from callgrind's cache simulation, weighed as
KCachegrind's "Cycle Estimation" (libcore/globalconfig.cpp:
``CEst = Ir + 10 L1m + 100 LLm``, L1m and LLm the sums of the instruction-read,
data-read and data-write misses of the first and last level). The simulated
caches are fixed (I1 and D1 32 KiB 8-way, LL 8 MiB 16-way, 64-byte lines, as
pythonspeed's cachegrind-benchmarking), so a count does not depend on the
host's caches; CPython's hash seed is fixed (``PYTHONHASHSEED=0``).

Where valgrind is missing, or the machine is not x86-64, every point skips
(NotImplementedError) with a message that says how to install it; the rest of
the suite runs.
"""

import abc
import ctypes
import gc
import importlib
import itertools
import json
import mmap
import os
import pkgutil
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from . import common

WARMUP_DECODES = 1  # uninstrumented decodes before the counted one (step 2 above)
COUNT_TIMEOUT = 600  # seconds for the suite's counting process (asv's setup_cache timeout)
CALLGRIND = (
    "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
    "--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64",
    "--dump-line=no", "--dump-instr=no", "--quiet",
)
MISS_WEIGHTS = {"L1": 10, "LL": 100}  # KCachegrind's CEst: cycles per L1 miss, per last-level miss
INSTALL_HINT = "install valgrind to count instructions (Debian/Ubuntu: apt-get install valgrind)"


class Uncountable(Exception):
    """This machine cannot count: no valgrind, or not x86-64. Every count point skips."""


class ClientRequests:
    """callgrind's client requests from Python, through valgrind.h's amd64 special-instruction sequence.

    The sequence (valgrind.h, ``__SPECIAL_INSTRUCTION_PREAMBLE`` and
    ``VALGRIND_DO_CLIENT_REQUEST_EXPR`` for amd64-linux) rotates RDI by 3, 13,
    61 and 51 bits (128 in all: RDI unchanged) and then executes
    ``xchg rbx, rbx``; valgrind recognises it and runs the request whose
    arguments RAX points at, the result in RDX. On a real CPU it does nothing
    and returns 0. The request codes are callgrind.h's, from
    ``VG_USERREQ_TOOL_BASE('C', 'T')`` on.
    """

    # uint64_t request(uint64_t args[6]) in the System V amd64 calling convention.
    CODE = bytes.fromhex(
        "4889f8"      # mov rax, rdi        RAX = &args[0]
        "31d2"        # xor edx, edx        RDX = 0, the result outside valgrind
        "48c1c703"    # rol rdi, 3          the preamble
        "48c1c70d"    # rol rdi, 13
        "48c1c73d"    # rol rdi, 61
        "48c1c733"    # rol rdi, 51
        "4887db"      # xchg rbx, rbx       RDX = client_request(RAX)
        "4889d0"      # mov rax, rdx
        "c3"          # ret
    )
    BASE = (ord("C") << 24) | (ord("T") << 16)
    DUMP_STATS, ZERO_STATS, TOGGLE_COLLECT, DUMP_STATS_AT, START_INSTRUMENTATION, STOP_INSTRUMENTATION = (
        range(BASE, BASE + 6))

    def __init__(self):
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise Uncountable(f"counting needs an x86-64 machine (this is {platform.machine()})")
        try:
            self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        except (OSError, AttributeError) as error:
            raise Uncountable(f"cannot map an executable page for valgrind's client requests: {error}") from None
        self._page.write(self.CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._call = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64))(address)

    def request(self, code, argument=0):
        args = (ctypes.c_uint64 * 6)(code, argument, 0, 0, 0, 0)
        return self._call(args)

    def dump_stats_at(self, label):
        text = ctypes.create_string_buffer(label.encode())
        self.request(self.DUMP_STATS_AT, ctypes.addressof(text))


def count_decode(requests, decode, inputs, name):
    """Count one ``decode(*inputs)`` under callgrind, its counters dumped as ``name`` (steps 2 and 3 above)."""
    for _ in range(WARMUP_DECODES):
        decode(*inputs)
    gc.collect()
    gc.disable()
    requests.request(requests.START_INSTRUMENTATION)
    try:
        requests.request(requests.ZERO_STATS)
        requests.request(requests.TOGGLE_COLLECT)
        try:
            decode(*inputs)
        finally:
            requests.request(requests.TOGGLE_COLLECT)
        requests.dump_stats_at(name)
    finally:
        requests.request(requests.STOP_INSTRUMENTATION)
        gc.enable()


def estimated_cycles(events):
    """KCachegrind's cycle estimation from callgrind's events: Ir + 10 L1 misses + 100 last-level misses."""
    l1 = events["I1mr"] + events["D1mr"] + events["D1mw"]
    ll = events["ILmr"] + events["DLmr"] + events["DLmw"]
    return events["Ir"] + MISS_WEIGHTS["L1"] * l1 + MISS_WEIGHTS["LL"] * ll


def label(class_index, index):
    return f"kv-attention-point-{class_index}-{index}"


def class_key(cls):
    """``bench_cache.CacheCounts``: how a count class is named in the counted results."""
    return f"{cls.__module__.split('.', 1)[-1]}.{cls.__qualname__}"


def read_dumps(folder):
    """``{label: {event: count}}`` of the callgrind dumps in ``folder`` that a client request labelled."""
    dumps = {}
    for name in sorted(os.listdir(folder)):
        if not name.startswith("callgrind.out"):
            continue
        trigger, events = None, None
        with open(os.path.join(folder, name)) as dump:
            for line in dump:
                if line.startswith("desc: Trigger: Client Request: "):
                    trigger = line.split(": ", 3)[-1].strip()
                elif line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith("summary:"):
                    if trigger and events:
                        dumps[trigger] = dict(zip(events, map(int, line.split()[1:])))
                    break
    return dumps


def why_uncountable():
    """None when this machine can count; else the reason, with how to install valgrind."""
    if shutil.which("valgrind") is None:
        return f"valgrind is not installed: {INSTALL_HINT}"
    try:
        ClientRequests()
    except Uncountable as error:
        return str(error)
    return None


# The counting process: the interpreter of the commit's asv environment, which imports kv_attention from its own
# site-packages. Only the suite's packages come from the working tree, each imported from its own folder by
# importlib's recipe for a source file (as asv imports the suite: that one package name, never a folder on
# sys.path), so the working tree's kv_attention beside them is not what is counted. Nor is the current folder
# ("" for -c: dropped) on sys.path; -s: no user site-packages. Nor asv_runner (the suite then skips with
# NotImplementedError): importing it reads every installed distribution's METADATA (asv_runner/benchmarks/__init__.py),
# which held the README up to e3c0b52, so a README line moved the counted heap and the counts of identical code.
CHILD_FLAGS = ("-s",)
CHILD = ("import importlib.util as u, json, sys; sys.path[:] = [p for p in sys.path if p]\n"
         "sys.modules['asv_runner'] = None\n"
         "for n, d in json.loads(sys.argv[1]).items():\n"
         "    s = u.spec_from_file_location(n, d + '/__init__.py', submodule_search_locations=[d])\n"
         "    sys.modules[n] = u.module_from_spec(s); s.loader.exec_module(sys.modules[n])\n"
         "import {module} as c; c.main(sys.argv[2:])")
# What the counting process inherits of the environment: the thread pins and OpenBLAS's kernel choice (they
# change what is executed) and PYTHONPATH (asv's --python=same). Nothing else: asv's ASV_* variables, temporary
# paths and the shell's variables differ between runs, and the process's initial state moves with them.
INHERITED = ("OPENBLAS_", "OMP_", "MKL_", "GOTO", "PYTHONPATH")
FIXED_ENVIRONMENT = {"PYTHONHASHSEED": "0", "LC_ALL": "C", "PYTHONDONTWRITEBYTECODE": "1"}
FIXED_TMP = "/tmp"  # the counting process's folder's parent (counting_folder_parent)


def child_environment():
    """The counting process's environment: :data:`FIXED_ENVIRONMENT` and the inherited variables, sorted."""
    inherited = {k: v for k, v in os.environ.items() if k.startswith(INHERITED)}
    return dict(sorted({**inherited, "PATH": os.defpath, **FIXED_ENVIRONMENT}.items()))


def counting_folder_parent():
    """Where the counting process's folder goes: /tmp where writable, whatever the caller's TMPDIR.

    The folder's path is in the counting process's arguments, and the length of the strings a process holds
    moves its heap, and with it where numpy's buffers fall and how many instructions its loops take on their
    unaligned ends: TMPDIR=/tmp against a 45-character TMPDIR moved the counts of identical code by up to
    0.33 % (``CacheCounts(16, 'preallocated')``). Under /tmp the path has one length in every run.
    """
    return FIXED_TMP if os.path.isdir(FIXED_TMP) and os.access(FIXED_TMP, os.W_OK | os.X_OK) else None


def package_folder(module):
    """The folder of the package of ``module`` (a dotted name, already imported): for the counting process."""
    return os.path.dirname(os.path.abspath(sys.modules[module.split(".")[0]].__file__))


def suite_classes():
    """Every count class of the suite: the concrete subclasses of :class:`Counts` in its modules, sorted by name."""
    package = __name__.rsplit(".", 1)[0]
    for module in pkgutil.iter_modules([os.path.dirname(os.path.abspath(__file__))]):
        importlib.import_module(f"{package}.{module.name}")
    found, todo = set(), [Counts]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if not getattr(sub, "__abstractmethods__", None) and sub.__module__.startswith(package + "."):
                found.add(sub)
    return sorted(found, key=class_key)


def count_classes(classes):
    """Count every parameter combination of ``classes`` (subclasses of :class:`Counts`) in ONE callgrind process.

    Returns ``{"unavailable": reason}`` or ``{"points": {(class_key, params): outcome}}``,
    each outcome as :func:`common.check_points` gives it: ``{"value": {event: count}}``,
    ``{"skipped": why}`` or ``{"failed": why}``, for :func:`common.replay`.
    """
    reason = why_uncountable()
    if reason is not None:
        return {"unavailable": reason}
    checked = check_classes(classes)
    packages = {name.split(".")[0]: package_folder(name) for name in (__name__, *(c.__module__ for c in classes))}
    with tempfile.TemporaryDirectory(prefix="kv-attention-counts-", dir=counting_folder_parent()) as folder:
        status_file, plan_file = os.path.join(folder, "status.jsonl"), os.path.join(folder, "plan.json")
        with open(plan_file, "w") as plan:
            json.dump({"classes": [f"{c.__module__}:{c.__qualname__}" for c in classes],
                       "points": [list(point) for point in points_of(classes) if point[:2] not in checked],
                       "verified": sorted(common.VERIFIED)}, plan)
        command = ["valgrind", *CALLGRIND, f"--callgrind-out-file={folder}/callgrind.out.%p", sys.executable,
                   *CHILD_FLAGS, "-c", CHILD.format(module=__name__), json.dumps(packages), status_file, plan_file]
        try:
            run = subprocess.run(command, env=child_environment(), cwd="/", capture_output=True, text=True,
                                 timeout=COUNT_TIMEOUT - 30)
            ended = f"exit {run.returncode}: {run.stderr.strip()[-2000:]}" if run.returncode else ""
        except subprocess.TimeoutExpired:
            ended = f"the counting process took longer than {COUNT_TIMEOUT - 30} s"
        statuses = dict(checked)
        if os.path.exists(status_file):
            with open(status_file) as lines:
                statuses.update({(s["class"], s["index"]): s for s in map(json.loads, lines)})
        dumps = read_dumps(folder)
    points = {}
    for class_index, index, params in points_of(classes):
        status = statuses.get((class_index, index), {})
        if "skipped" in status or "failed" in status:
            outcome = {k: status[k] for k in ("skipped", "failed") if k in status}
        elif label(class_index, index) in dumps:
            outcome = {"value": dumps[label(class_index, index)]}
        else:
            outcome = {"failed": f"not counted: the counting process stopped ({ended or 'no dump'})"}
        points[(class_key(classes[class_index]), params)] = outcome
    return {"points": points}


def points_of(classes):
    """``(class_index, index, params)`` of every parameter combination of ``classes``, in order."""
    for class_index, cls in enumerate(classes):
        for index, params in enumerate(itertools.product(*cls.params)):
            yield class_index, index, params


def check_classes(classes):
    """Run every point's ``prepare``, and so its correctness check, natively in this process (step 1 above).

    Returns ``{(class_index, index): outcome}`` of the points that skip or fail,
    which valgrind does not run; the checks that passed are in ``common.VERIFIED``.
    """
    outcomes = {}
    for cls in classes:
        def check(*point):
            cls().prepare(*point)  # the decode and inputs are built again under valgrind

        outcomes[cls] = common.check_points(cls.params, check)
    return {(class_index, index): outcomes[classes[class_index]][params]
            for class_index, index, params in points_of(classes)
            if "value" not in outcomes[classes[class_index]][params]}


def main(argv):
    """The counting process, under valgrind: ``STATUS_FILE PLAN_FILE``; one JSON line per point counted.

    The plan (JSON): ``classes``, ``MODULE:CLASS`` names; ``points``, the
    ``[class_index, index, params]`` to count; ``verified``, the keys whose
    correctness check passed natively.
    """
    status_file, plan_file = argv
    with open(plan_file) as plan:
        plan = json.load(plan)
    common.VERIFIED.update(plan["verified"])
    classes = [getattr(importlib.import_module(module), qualname)
               for module, qualname in (name.split(":") for name in plan["classes"])]
    requests = ClientRequests()
    with open(status_file, "w") as status:
        for class_index, index, params in plan["points"]:
            started = time.process_time()
            try:
                decode, inputs = classes[class_index]().prepare(*params)
                count_decode(requests, decode, inputs, label(class_index, index))
                outcome = {"counted": True}
            except NotImplementedError as error:  # as natively; a difference under valgrind fails or skips the point
                outcome = {"skipped": str(error) or "not implemented at this commit"}
            except Exception as error:  # noqa: BLE001 (a wrong or broken decode fails its point only)
                outcome = {"failed": f"{type(error).__name__}: {error}"}
            # valgrind's CPU time on the point, as text of one width: a number's length would vary with the
            # machine's load, and so would what this line allocates before the next point's counted decode
            outcome["seconds"] = f"{time.process_time() - started:012.3f}"
            status.write(json.dumps({"class": class_index, "index": index, **outcome}) + "\n")
            status.flush()


class Counts(common.Benchmark, abc.ABC):
    """An experiment's count points: asv's ``params`` and ``param_names``, and ``prepare``.

    Every subclass shares this class's ``setup_cache``, so asv counts the whole
    suite's count points in one callgrind process per commit and environment.
    """

    timeout = COUNT_TIMEOUT  # also the timeout of setup_cache
    # 2: the correctness check runs natively, one uninstrumented decode before the counted one,
    # and smaller problems (a count moved by up to 1.7 %, so version 1's history is not comparable).
    # 3: the commit's own kv_attention is counted (versions 1 and 2 counted the working tree's whenever it
    # was not the commit under test) in a fixed environment (the shell's moved counts by up to 1 %).
    # 4: the counting process no longer imports asv_runner (CHILD), whose reading of every METADATA moved the heap.
    version = "4"  # of both tracked values; an experiment whose counts change meaning sets its own

    @abc.abstractmethod
    def prepare(self, *params):
        """``(decode, inputs)`` of one point, after the experiment's correctness check on the timed problem."""

    def setup_cache(self):
        return count_classes(suite_classes())

    def setup(self, counted, *params):
        if "unavailable" in counted:
            raise NotImplementedError(counted["unavailable"])
        self.events = common.replay(counted["points"], (class_key(type(self)), tuple(params)))

    def track_instructions(self, counted, *params):
        """Instructions executed by one decode (callgrind's Ir)."""
        return self.events["Ir"]

    track_instructions.unit = "instructions"

    def track_estimated_cycles(self, counted, *params):
        """Estimated cycles of one decode: Ir + 10 L1 misses + 100 last-level misses (KCachegrind's CEst)."""
        return estimated_cycles(self.events)

    track_estimated_cycles.unit = "cycles"
