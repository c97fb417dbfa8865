"""One side of a paired comparison: the suite's benchmarks timed in one commit's asv environment, on request.

``<env python> -s tools/pair_worker.py PACKAGE_DIR BENCHMARK_DIR`` (started by :mod:`tools.pairs`): a JSON
request a line on stdin (``load`` a point: its setup_cache, setup and calibration; ``samples``: K samples of N calls,
setup before each as asv does), a JSON answer a line on stdout; what benchmarks print goes to stderr.
"""

import json
import os
import sys
import time
import traceback

CLOCK = time.thread_time  # as benchmarks/ratios.py: one thread does the work; another job's time is not the code's

if __name__ == "__main__":
    del sys.path[0]  # this script's folder (tools/): nothing of it is imported
    sys.path.insert(0, sys.argv[1])  # the commit's kv_attention, first


class Worker:
    def __init__(self, benchmark_dir):
        self.benchmark_dir = benchmark_dir
        self.caches = {}  # setup_cache key -> its value, computed once in this process
        self.benchmark = None

    def load(self, name, param_idx, number):
        from asv_runner.discovery import get_benchmark_from_name

        self.unload()
        benchmark = get_benchmark_from_name(self.benchmark_dir, name if param_idx is None else f"{name}-{param_idx}")
        from benchmarks.pairs import calibrate  # the suite's own, importable once asv_runner imported the suite
        if benchmark.setup_cache_key is not None:
            if benchmark.setup_cache_key not in self.caches:
                self.caches[benchmark.setup_cache_key] = benchmark.do_setup_cache()
            benchmark.insert_param(self.caches[benchmark.setup_cache_key])
        self.args = benchmark._build_params()
        for setup in benchmark._setups:  # asv_runner's do_setup, whose NotImplementedError keeps its message
            setup(*self.args)
        self.benchmark = benchmark
        calibrated = calibrate(self.call)  # in both workers, so that both have made the same calls before the pairs
        self.number = number or calibrated
        self.fresh = True
        return {"loaded": True, "number": self.number}

    def call(self):
        self.benchmark.func(*self.args)

    def samples(self, count):
        out = []
        for _ in range(count):
            if not self.fresh:  # setup before every sample but the first, as asv does
                self.benchmark.do_teardown()
                self.benchmark.do_setup()
            self.fresh = False
            start = CLOCK()
            for _ in range(self.number):
                self.call()
            out.append((CLOCK() - start) / self.number)
        return {"samples": out}

    def unload(self):
        if self.benchmark is not None:
            self.benchmark.do_teardown()
        self.benchmark = None


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
        except NotImplementedError as error:
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
