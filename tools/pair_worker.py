"""One side of a paired comparison (started by :mod:`tools.pairs`): ``<env python> -s tools/pair_worker.py
PACKAGE_DIR BENCHMARK_DIR``, a JSON request a line on stdin (``load`` a point; ``samples``), a JSON answer a line on
stdout. It runs the suite as asv does, through no asv code: the commit's ``kv_attention`` first on sys.path, the
working tree's suite package alone, ``setup_cache`` once per function, ``setup``/``teardown`` around every sample.
"""

import importlib
import importlib.util
import itertools
import json
import os
import sys
import time
import traceback

CLOCK = time.thread_time  # as benchmarks/ratios.py: one thread does the work; another job's time is not the code's

if __name__ == "__main__":
    del sys.path[0]  # this script's folder (tools/): nothing of it is imported
    sys.path.insert(0, sys.argv[1])  # the commit's kv_attention, first


def import_suite(benchmark_dir):
    """The suite's package (``benchmarks``) from ``benchmark_dir``, and nothing else of the folder around it."""
    name = os.path.basename(benchmark_dir)
    spec = importlib.util.spec_from_file_location(name, os.path.join(benchmark_dir, "__init__.py"),
                                                  submodule_search_locations=[benchmark_dir])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return name


class Worker:
    def __init__(self, benchmark_dir):
        self.suite = import_suite(benchmark_dir)
        self.calibrate = importlib.import_module(f"{self.suite}.pairs").calibrate
        self.caches = {}  # setup_cache function -> its value, computed once in this process
        self.instance = None

    def load(self, name, param_idx, number):
        """Point ``param_idx`` (None: unparametrized) of ``module.Class.method``, set up: ``{"loaded", "number"}``."""
        self.unload()
        module, cls, method = name.split(".")
        instance = getattr(importlib.import_module(f"{self.suite}.{module}"), cls)()
        point = () if param_idx is None else next(itertools.islice(
            itertools.product(*getattr(instance, "params", [])), param_idx, None))
        setup_cache = getattr(type(instance), "setup_cache", None)
        if setup_cache is not None and setup_cache not in self.caches:
            self.caches[setup_cache] = instance.setup_cache()
        self.args = ((self.caches[setup_cache],) if setup_cache is not None else ()) + tuple(point)
        self.instance, self.method = instance, getattr(instance, method)
        self.setup()
        calibrated = self.calibrate(self.call)  # in both workers: both have made the same calls before the pairs
        self.number = number or calibrated
        self.fresh = True
        return {"loaded": True, "number": self.number}

    def setup(self):
        if hasattr(self.instance, "setup"):
            self.instance.setup(*self.args)

    def teardown(self):
        if hasattr(self.instance, "teardown"):
            self.instance.teardown(*self.args)

    def call(self):
        self.method(*self.args)

    def samples(self, count):
        out = []
        for _ in range(count):
            if not self.fresh:  # setup before every sample but the first, as asv does
                self.teardown()
                self.setup()
            self.fresh = False
            start = CLOCK()
            for _ in range(self.number):
                self.call()
            out.append((CLOCK() - start) / self.number)
        return {"samples": out}

    def unload(self):
        if self.instance is not None:
            self.teardown()
        self.instance = None


def main(benchmark_dir):
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the suite prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    worker = Worker(benchmark_dir)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "load" in request:
                reply = worker.load(request["load"], request["param_idx"], request.get("number"))
            elif "samples" in request:
                reply = worker.samples(request["samples"])
            else:
                break
        except NotImplementedError as error:  # asv_runner's SkipNotImplemented is one too
            reply = {"skipped": str(error) or "not implemented at this commit"}
        except Exception as error:  # noqa: BLE001 (a failed check or benchmark fails its point only)
            traceback.print_exc()
            reply = {"failed": f"{type(error).__name__}: {error}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
    worker.unload()


if __name__ == "__main__":
    try:
        main(os.path.abspath(sys.argv[2]))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the gate says it stopped
        sys.exit(130)
