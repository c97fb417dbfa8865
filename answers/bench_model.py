"""The model experiment's answers: the decode step's fraction of the read rate, its time per token, and the batch
sweep against the BLAS alone, paired (benchmarks/bench_model.py: the model, its weights, caches, oracle and check).
"""

import numpy as np

from benchmarks.bench_model import (BATCH_LENGTH, BATCH_LENGTHS, BATCH_SIZES, MODEL, STEP_CACHES, STEP_LENGTHS,
                                    check_answer, gguf_path, kv_bytes_per_token, model_weights, step_bytes,
                                    verified_step)
from benchmarks.common import check_points
from benchmarks.ratios import Ratios

from . import bench_roofline  # the module, not its class: asv would collect an imported Roofline here again
from .bench_roofline import bandwidth_fraction

BLOCK_ROWS = 64  # rows of a weight a product in the BLAS-alone products' blocks (as kv_attention.products)


def read_kernel(t_len, batch):
    """A callable reading every weight and a K/V-sized buffer once (``np.vdot(a, a)``, as the roofline's), its bytes."""
    kv = np.ones(batch * (t_len + 1) * kv_bytes_per_token(MODEL) // 4, np.float32)  # written, so resident
    arrays = [*model_weights().values(), kv]
    nbytes = sum(a.nbytes for a in arrays)
    assert nbytes == step_bytes(t_len, batch), f"the read kernel reads {nbytes} bytes"
    return (lambda: [np.vdot(a, a) for a in arrays]), nbytes


def measure_step(T, cache):
    """The bandwidth fraction of one B = 1 step through caches of ``cache`` holding T (``bandwidth_fraction``)."""
    if T == STEP_LENGTHS[0] and cache != "static":
        raise NotImplementedError(f"at T = {T} the cache is 2 % of a step's bytes: a cache kind's cost shows at "
                                  f"T = {STEP_LENGTHS[-1]} (the seconds went to ModelBatch at T = 4096)")
    step = verified_step(cache, T, 1)
    read, nbytes = read_kernel(T, 1)
    return bandwidth_fraction(step, read, nbytes, 0, bench_roofline.Roofline.min_pairs)


def measure_batch(T, B):
    """B x time(B = 1) / time(B) of the static-cache step at T, with its interval, and B / time(B).

    Paired as the step's fraction is (``bandwidth_fraction``: a warm-up call each, then Roofline.min_pairs pairs of
    one call a side), the B = 1 step in the read kernel's place: its ratio is time(1) / time(B) per pair, and its
    "rate" over B "bytes" is B over the B-sequence step's median time.
    """
    if T != BATCH_LENGTH and B != max(BATCH_SIZES):
        raise NotImplementedError(f"at T = {T} only B = {max(BATCH_SIZES)}: the far end shows what the cache's "
                                  f"bytes take from the batch, for a few seconds a commit")
    one, many = verified_step("static", T, 1), verified_step("static", T, B)
    return scaled(bandwidth_fraction(many, one, B, 0, bench_roofline.Roofline.min_pairs), B)


def scaled(paired, B):
    """``bandwidth_fraction``'s time(1) / time(B) per pair, times B, and B over the B-row side's median time."""
    return {"ratio": B * paired["ratio"], "low": B * paired["low"], "high": B * paired["high"],
            "pairs": paired["pairs"], "positions_per_second": paired["step_gbps"] * 1e9}


def one(x, w, out):
    np.matmul(x, w.T, out=out)


def blocks(x, w, out):
    for i in range(0, len(w), BLOCK_ROWS):
        np.matmul(x, w[i : i + BLOCK_ROWS].T, out=out[:, i : i + BLOCK_ROWS])


def per_row(x, w, out):
    for row, o in zip(x, out):
        np.matmul(w, row, out=o)


FORMULATIONS = {f.__name__: f for f in (one, blocks, per_row)}  # as kv_attention.products plans them, written here
# for every commit: one product per weight, the weight BLOCK_ROWS rows a product, one matrix-vector product per row


def products(rows, formulation="one"):
    """``(take, outs)``: a callable taking every weight product of one step for ``rows`` rows, BLAS alone, into
    ``outs``: each layer's seven and the lm_head, ``x [rows, in] @ w.T``, x ones / in, each in ``formulation``."""
    weights = model_weights()
    layer = [n for n in weights if n.startswith("model.layers.") and not n.endswith("layernorm.weight")]
    mats = [weights[n] for n in layer] + [weights["model.embed_tokens.weight"]]  # tied: the embedding is lm_head
    inputs = {n: np.ones((rows, n), np.float32) / n for n in {w.shape[1] for w in mats}}
    outs = [np.empty((rows, len(w)), np.float32) for w in mats]
    product = FORMULATIONS[formulation]

    def take():
        for w, out in zip(mats, outs):
            product(inputs[w.shape[1]], w, out)

    return take, outs


def measure_blas(B):
    """B x time(1 row) / time(B rows) of :func:`products`, BLAS alone, paired as :func:`measure_batch`, in the
    formulation of B rows that gives the most (each paired in turn; one row: one product, a matrix-vector product);
    ``"ratios"``: each formulation's median."""
    one_row = products(1)[0]
    paired = {f: scaled(bandwidth_fraction(products(B, f)[0], one_row, B, 0, bench_roofline.Roofline.min_pairs), B)
              for f in FORMULATIONS}
    best = max(paired, key=lambda f: paired[f]["ratio"])
    return dict(paired[best], formulation=best, ratios={f: p["ratio"] for f, p in paired.items()})


STEP_PARAMS = [STEP_LENGTHS, STEP_CACHES]  # T outermost: each T's K/V drawn and its oracle run once


BATCH_PARAMS = [BATCH_LENGTHS, BATCH_SIZES[1:]]


BLAS_PARAMS = [BATCH_SIZES[1:]]


class _Measured:
    """The timed classes' one ``setup_cache``: defined once here, so asv runs it once per commit for all (its
    key is the place of definition), and the weights are drawn once. Not collected by asv (a leading ``_``)."""

    timeout = 600  # 99 s beside a load of 7 on 2 cores (4cdb2a53); over 300 s at a load of 11-13

    def setup_cache(self):
        try:  # the real model answers as transformers does, or no point is measured
            if gguf_path() is not None:
                check_answer(model_weights())
        except NotImplementedError:  # a commit without the model: every point skips by itself
            pass
        blas = check_points(BLAS_PARAMS, measure_blas)
        batch = check_points(BATCH_PARAMS, measure_batch)  # T = 4096's K/V and oracle serve the steps' too
        return {"blas": blas, "batch": batch, "step": check_points(STEP_PARAMS, measure_step)}


class ModelStep(_Measured, bench_roofline.Roofline):
    """One decode step of the whole model at B = 1, per cache kind and T: its time, and its fraction of the read rate.

    As the roofline's points (``track_ratio`` the fraction, ``track_step_gbps``, ``track_read_gbps``), with the
    time per token beside them.
    """

    params = STEP_PARAMS
    param_names = ["T", "cache"]

    def setup(self, measured, *point):
        super().setup(measured["step"], *point)

    def track_token_seconds(self, measured, T, cache):
        """Seconds per token: the step's median time in the pairs (its bytes over its rate)."""
        return self.measured["bytes"] / self.tracked("step_gbps") / 1e9

    track_token_seconds.unit = "seconds"
    track_token_seconds.version = "1"


class ModelBatch(_Measured, Ratios):
    """Positions/s of the decode step at B over that of B = 1, static caches at T: B x time(1) / time(B), paired.

    ``track_positions_per_second``: B over the B-sequence step's median time in the same pairs.
    """

    params = BATCH_PARAMS
    param_names = ["T", "B"]

    def setup(self, measured, *point):
        super().setup(measured["batch"], *point)

    def sides(self, T, B):  # measured by measure_batch in the shared setup_cache
        raise NotImplementedError

    def track_positions_per_second(self, measured, T, B):
        """B over the median time of the B-sequence step in the pairs (one new position of each sequence)."""
        return self.measured["positions_per_second"]

    track_positions_per_second.unit = "positions/s"
    track_positions_per_second.version = "2"


class ModelBatchBLAS(_Measured, Ratios):
    """The step's weight products alone (:func:`products`), B rows over one: B x time(1) / time(B), paired, in the
    best of three formulations at each B (:func:`measure_blas`): what the BLAS allows :class:`ModelBatch`, whose
    step adds attention, norms, RoPE and Python to the same products."""

    version = "2"  # 1: the weight 64 rows a product at every B; 2: the best of three formulations at each B

    params = BLAS_PARAMS
    param_names = ["B"]

    def setup(self, measured, *point):
        super().setup(measured["blas"], *point)

    def sides(self, B):  # measured by measure_blas in the shared setup_cache
        raise NotImplementedError
