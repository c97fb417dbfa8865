"""serve: every request equals its own reference however it is scheduled, and the schedule is the documented one.

Outputs are compared with the naive per-request reference (float64, rtol = atol =
1e-10). Schedules, preemptions, recomputed tokens and prefix hits are traced by
hand in the comments, from the rules of the scheduler's module docstring.
"""

import dataclasses
import math
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_attention as kv

from ..references import serve_reference

TOL = {"rtol": 1e-10, "atol": 1e-10}
V, D_MODEL, D_K, D_V = 40, 4, 3, 5


def model(seed=0, vocab=V):
    """(embedding [V, 4], w_q [4, 3], w_k [4, 3], w_v [4, 5])."""
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((vocab, D_MODEL))
    return (embedding, *(rng.standard_normal((D_MODEL, d)) / 2.0 for d in (D_K, D_K, D_V)))


def assert_exact(result, requests, weights):
    assert list(result.outputs) == [r.request_id for r in requests]
    for r in requests:
        expected = serve_reference(r.token_ids, r.prompt_len, *weights)
        got = result.outputs[r.request_id]
        assert got.shape == (len(r.token_ids) - r.prompt_len + 1, D_V) and got.dtype == np.float64
        np.testing.assert_allclose(got, expected, **TOL, err_msg=str(r.request_id))


def tokens(rng, n):
    return rng.integers(0, V, n).tolist()


def test_the_schedule_decodes_first_then_prefills_running_then_admits_in_chunks():
    # block_size 4, budget 4. A: prompt 6, 2 decoded, arrives at 0; B: prompt 5, 1 decoded, arrives at 1.
    # step 0: A admitted, prefill 4.          step 1: A prefills its last 2 (output 0), B admitted with 2.
    # step 2: A decodes 1 (output 1); B prefills 3 (output 0).   step 3: A and B decode (A's and B's last).
    weights = model(1)
    rng = np.random.default_rng(1)
    requests = [kv.Request("A", tokens(rng, 8), 6), kv.Request("B", tokens(rng, 6), 5, arrival_step=1)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=100, max_num_batched_tokens=4)
    stats = result.stats
    assert stats.prefill_tokens_per_step == (4, 4, 3, 0) and stats.decode_tokens_per_step == (0, 0, 1, 2)
    assert (stats.steps, stats.preemptions, stats.recomputed_tokens, stats.prefix_hit_tokens) == (4, 0, 0, 0)
    assert stats.peak_blocks == 2 + 2  # A's prompt and its growth: 2 blocks; B's: 2
    assert_exact(result, requests, weights)


def test_a_budget_smaller_than_a_prompt_chunks_its_prefill():
    weights = model(2)
    rng = np.random.default_rng(2)
    requests = [kv.Request("long", tokens(rng, 30), 27), kv.Request("short", tokens(rng, 9), 4, arrival_step=2)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=20, max_num_batched_tokens=5)
    per_step = [p + d for p, d in zip(result.stats.prefill_tokens_per_step, result.stats.decode_tokens_per_step)]
    assert max(per_step) == 5 and result.stats.prefill_tokens_per_step[:5] == (5, 5, 5, 5, 5)  # 27 = 5 × 5 + 2
    assert result.stats.prefill_tokens == 27 + 4 and result.stats.decode_tokens == 3 + 5
    assert_exact(result, requests, weights)


def test_mixed_arrivals_and_gaps_each_request_exact():
    weights = model(3)
    rng = np.random.default_rng(3)
    arrivals = [0, 0, 3, 3, 9, 40, 40, 41]  # an idle stretch before 40 is jumped over
    requests = [
        kv.Request(f"r{i}", tokens(rng, int(rng.integers(2, 20))), 1, arrival_step=a) for i, a in enumerate(arrivals)
    ]
    requests = [kv.Request(r.request_id, r.token_ids, int(rng.integers(1, len(r.token_ids) + 1)), r.arrival_step)
                for r in requests]
    result = kv.serve(requests, *weights, block_size=3, num_blocks=40, max_num_batched_tokens=7)
    assert result.stats.steps < 41 + sum(len(r.token_ids) for r in requests[5:])
    assert_exact(result, requests, weights)


def test_one_budget_loop_as_vllm_v1_two_prompts_share_the_first_step_to_the_last_token():
    # The case: two 50-token prompts, block_size 4, budget 64. V1 (vllm/v1/core/sched/scheduler.py)
    # gives A its 50 tokens and B the 14 left: 64 in the first step. (V0's chunked prefill gave 62.)
    # step 1: B, running, gets its last 36 tokens (output 0); A, caught up, decodes its 1 token first.
    weights = model(3)
    rng = np.random.default_rng(3)
    requests = [kv.Request("A", tokens(rng, 51), 50), kv.Request("B", tokens(rng, 51), 50)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=100, max_num_batched_tokens=64)
    stats = result.stats
    assert stats.prefill_tokens_per_step == (64, 36, 0) and stats.decode_tokens_per_step == (0, 1, 1)
    assert_exact(result, requests, weights)


def test_a_waiting_request_takes_the_blocks_of_its_chunk_only():
    # block_size 2, 3 blocks, budget 4; A, B: prompt 6. V1's allocate_slots takes blocks per scheduled chunk.
    # step 0: A admitted with 4 tokens (2 blocks), no budget left.  step 1: A's last 2 tokens take its third
    # block (output 0; A done, freed). B, with 2 of budget, waits: the pool is full while A runs.
    # step 2: B admitted with 4 tokens (2 blocks), though its whole prompt needs 3.  step 3: B's last 2.
    weights = model(6)
    rng = np.random.default_rng(6)
    requests = [kv.Request("A", tokens(rng, 6), 6), kv.Request("B", tokens(rng, 6), 6)]
    result = kv.serve(requests, *weights, block_size=2, num_blocks=3, max_num_batched_tokens=4)
    stats = result.stats
    assert stats.prefill_tokens_per_step == (4, 2, 4, 2) and stats.preemptions == 0 and stats.peak_blocks == 3
    assert_exact(result, requests, weights)


def test_preemption_takes_the_latest_admitted_and_recomputes_what_it_knew():
    # block_size 2, 4 blocks; A and B: prompt 2 and 4 decoded tokens each (3 blocks each at full length).
    # step 0: both admitted (1 block each), prefill 2 + 2.  step 1: both decode, a block each: pool full.
    # step 2: both decode in their blocks.  step 3: A needs a block: B, admitted last, is preempted (2 blocks
    # freed); A decodes.  step 4: A decodes its last token; B (5 known tokens, 3 blocks) does not fit yet.
    # step 5: A is done; B is admitted and recomputes its 4 tokens with its fifth (output 3).  step 6: B's last.
    weights = model(4)
    rng = np.random.default_rng(4)
    requests = [kv.Request("A", tokens(rng, 6), 2), kv.Request("B", tokens(rng, 6), 2)]
    result = kv.serve(requests, *weights, block_size=2, num_blocks=4, max_num_batched_tokens=10)
    stats = result.stats
    assert stats.prefill_tokens_per_step == (4, 0, 0, 0, 0, 4, 0)  # step 5: the 4 recomputed tokens
    assert stats.decode_tokens_per_step == (0, 2, 2, 1, 1, 1, 1)  # step 5: B's fifth, computed for the first time
    assert (stats.preemptions, stats.recomputed_tokens, stats.peak_blocks) == (1, 4, 4)
    assert_exact(result, requests, weights)  # every output row, also those from before the preemption


def test_no_request_is_admitted_in_a_step_that_preempted_one_even_one_that_would_fit():
    # The case. block_size 4, 5 blocks, caching on; A and C: the same 12 tokens, prompt 8, 4 decoded.
    # step 0: both admitted (2 blocks each; C's duplicate blocks stay uncached), prefill 8 + 8: 1 block free.
    # step 1: A decodes token 8 into the free block; C needs a block, none is free: C, admitted last, is
    # preempted, its 2 blocks freed. C (9 known tokens) would now fit: A's 2 cached blocks are a hit and its
    # third takes 1 of the 2 free. vLLM V1 admits nothing in a step that preempted, and neither does serve.
    # step 2: A decodes token 9; C is admitted (8 hit tokens) and computes token 8 (output 1), a token past
    # its prompt computed for the first time: a decode token (V1 has no phases; ServeStats counts it so).
    # steps 3-4: A and C decode (A's last at step 4).  step 5: C's last token.
    weights = model(9)
    toks = list(range(8)) + [1, 2, 3, 4]
    requests = [kv.Request("A", toks, 8), kv.Request("C", toks, 8)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=5, max_num_batched_tokens=32,
                      enable_prefix_caching=True)
    stats = result.stats
    assert stats.prefill_tokens_per_step == (16, 0, 0, 0, 0, 0)
    assert stats.decode_tokens_per_step == (0, 1, 2, 2, 2, 1)  # (0, 1, 1, ...) + C's readmission at step 1
    assert (stats.preemptions, stats.recomputed_tokens, stats.prefix_hit_tokens, stats.peak_blocks) == (1, 0, 8, 5)
    assert_exact(result, requests, weights)


def test_a_pool_too_small_for_everyone_preempts_and_stays_exact():
    weights = model(5)
    rng = np.random.default_rng(5)
    requests = [kv.Request(i, tokens(rng, 24), 8, arrival_step=i // 3) for i in range(6)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=8, max_num_batched_tokens=16)
    stats = result.stats
    assert stats.preemptions > 0 and stats.recomputed_tokens > 0 and stats.peak_blocks <= 8
    assert stats.prefill_tokens + stats.decode_tokens == 6 * 24 + stats.recomputed_tokens
    assert_exact(result, requests, weights)


def test_shared_prefixes_hit_the_cache_with_caching_and_give_the_same_outputs():
    # block_size 4, a system prompt of 8 tokens (2 blocks). A: system + 3 own tokens, prompt 11, at step 0;
    # B: system + 2, prompt 10, at step 1. With caching, B starts from A's 2 cached blocks: 8 hit tokens,
    # and B computes only its positions 8 and 9 at step 1.
    weights = model(6)
    rng = np.random.default_rng(6)
    system = tokens(rng, 8)
    requests = [kv.Request("A", system + tokens(rng, 5), 11), kv.Request("B", system + tokens(rng, 4), 10, 1)]
    plain = kv.serve(requests, *weights, block_size=4, num_blocks=20, max_num_batched_tokens=32)
    cached = kv.serve(requests, *weights, block_size=4, num_blocks=20, max_num_batched_tokens=32,
                      enable_prefix_caching=True)
    assert plain.stats.prefix_hit_tokens == 0 and cached.stats.prefix_hit_tokens == 8
    assert plain.stats.prefill_tokens_per_step[:2] == (11, 10) and cached.stats.prefill_tokens_per_step[:2] == (11, 2)
    assert cached.stats.peak_blocks == plain.stats.peak_blocks - 2  # the system prompt's blocks held once
    assert_exact(plain, requests, weights)
    assert_exact(cached, requests, weights)
    for r in requests:
        np.testing.assert_allclose(cached.outputs[r.request_id], plain.outputs[r.request_id], **TOL)


def test_blocks_are_named_by_their_whole_prefix_not_their_own_tokens():
    # B's second block holds A's second block's tokens, after another first block: no hit.
    weights = model(7)
    rng = np.random.default_rng(7)
    first_a, first_b, second = tokens(rng, 4), tokens(rng, 4), tokens(rng, 4)
    requests = [kv.Request("A", first_a + second + [1], 9), kv.Request("B", first_b + second + [1], 9, 5)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=20, max_num_batched_tokens=32,
                      enable_prefix_caching=True)
    assert result.stats.prefix_hit_tokens == 0
    assert_exact(result, requests, weights)


@pytest.mark.parametrize("prompt_len, hits", [(8, 4), (9, 8)])
def test_a_fully_cached_prompt_still_computes_its_last_token(prompt_len, hits):
    # The same tokens again, after the first request is done and freed (its blocks stay cached). The hit is
    # limited to the full blocks of the prompt but its last token: with 8 = 2 blocks, the last block (4 tokens)
    # is computed again; with 9, the 2 blocks are hit and only the ninth token is computed.
    weights = model(8)
    ids = np.random.default_rng(8).integers(0, V, prompt_len + 2).tolist()
    requests = [kv.Request("first", ids, prompt_len), kv.Request("again", ids, prompt_len, arrival_step=20)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=10, max_num_batched_tokens=64,
                      enable_prefix_caching=True)
    assert result.stats.prefix_hit_tokens == hits
    assert result.stats.prefill_tokens == prompt_len + prompt_len - hits
    assert_exact(result, requests, weights)
    np.testing.assert_allclose(result.outputs["again"], result.outputs["first"], **TOL)


def test_max_num_seqs_bounds_the_running_requests():
    weights = model(9)
    rng = np.random.default_rng(9)
    requests = [kv.Request(i, tokens(rng, 7), 3) for i in range(4)]
    result = kv.serve(requests, *weights, block_size=4, num_blocks=20, max_num_batched_tokens=100, max_num_seqs=1)
    # One request at a time: its prompt in a step, then 4 decoded tokens, one per step.
    assert result.stats.prefill_tokens_per_step == (3, 0, 0, 0, 0) * 4
    assert result.stats.decode_tokens_per_step == (0, 1, 1, 1, 1) * 4
    assert_exact(result, requests, weights)


def test_float32_in_float32_out_and_inputs_unchanged():
    embedding, *ws = model(10)
    e32, w32 = embedding.astype(np.float32), [w.astype(np.float32) for w in ws]
    for a in (e32, *w32):
        a.flags.writeable = False
    ids = np.random.default_rng(10).integers(0, V, 12)
    ids.flags.writeable = False
    request = kv.Request("a", ids, 5)
    result = kv.serve([request], e32, *w32, block_size=4, num_blocks=3, max_num_batched_tokens=3)
    out = result.outputs["a"]
    assert out.dtype == np.float32 and out.shape == (8, D_V)
    np.testing.assert_allclose(out, serve_reference(ids, 5, e32, *w32), rtol=1e-4, atol=1e-5)
    mixed = kv.serve([request], embedding, *w32, block_size=4, num_blocks=3, max_num_batched_tokens=3)
    assert mixed.outputs["a"].dtype == np.float64


def test_no_requests_serve_nothing():
    result = kv.serve([], *model(), num_blocks=0, max_num_batched_tokens=1)
    assert result.outputs == {} and result.stats.steps == 0 and result.stats.prefill_tokens_per_step == ()


def bad_requests():
    good = [1, 2, 3, 4]
    return [
        ([kv.Request("a", good, 0)], ValueError, r"request 'a' \(requests\[0\]\): prompt_len must be >= 1, got 0"),
        ([kv.Request("a", good, 5)], ValueError, r"request 'a' \(requests\[0\]\): prompt_len must be in \[1, len"),
        ([kv.Request("a", good, 2), kv.Request("b", [1, V], 1)], ValueError,
         rf"request 'b' \(requests\[1\]\): token_ids\[1\] = {V} is not a row of the embedding: "
         rf"ids must be in \[0, V={V}\)"),
        ([kv.Request("a", [-1, 2], 1)], ValueError, r"request 'a' .*token_ids\[0\] = -1"),
        ([kv.Request("a", good, 2), kv.Request("a", good, 2)], ValueError,
         r"request 'a' \(requests\[1\]\) repeats the request_id of requests\[0\]"),
        ([kv.Request("big", list(range(33)), 2)], ValueError,
         r"request 'big' \(requests\[0\]\) can never fit the pool: "
         r"its 33 tokens need 3 blocks of block_size=16, and num_blocks=2"),
        ([kv.Request("a", [1.0, 2.0], 1)], TypeError, r"request 'a' \(requests\[0\]\): token_ids must be integers"),
        ([kv.Request("a", [[1, 2]], 1)], ValueError, r"request 'a' .*must be a 1-D sequence"),
        ([kv.Request("a", good, 1.5)], TypeError, r"request 'a' .*prompt_len must be an integer"),
        ([kv.Request("a", good, 1, -1)], ValueError, r"request 'a' .*arrival_step must be >= 0"),
        ([kv.Request(["a"], good, 1)], TypeError, r"requests\[0\]: request_id must be hashable"),
        ([kv.Request(float("nan"), good, 1), kv.Request(float("nan"), good, 1)], ValueError,
         r"requests\[0\]: request_id must equal itself to key the outputs, got nan"),
        ([("a", good, 1)], TypeError, r"requests\[0\] must be a Request, got tuple"),
        (kv.Request("a", good, 1), TypeError, "requests must be a list of Request, got Request"),
    ]


@pytest.mark.parametrize("requests, error, message", bad_requests())
def test_bad_requests_are_refused_before_anything_runs(requests, error, message, monkeypatch):
    monkeypatch.setattr("kv_attention.scheduler.Scheduler", None)  # nothing may run
    with pytest.raises(error, match=message):
        kv.serve(requests, *model(), num_blocks=2, max_num_batched_tokens=8)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"max_num_batched_tokens": 0}, ValueError, "max_num_batched_tokens must be >= 1, got 0"),
        ({"max_num_batched_tokens": -3}, ValueError, "max_num_batched_tokens must be >= 1"),
        ({"max_num_seqs": 0}, ValueError, "max_num_seqs must be >= 1"),
        ({"block_size": 0}, ValueError, "block_size must be >= 1"),
        ({"num_blocks": -1}, ValueError, "num_blocks must be >= 0"),
        ({"num_blocks": 2.0}, TypeError, "num_blocks must be an integer"),
        ({"num_blocks": None}, TypeError, "num_blocks must be given, the size of the pool serve makes, unless cache="),
        ({"enable_prefix_caching": "yes"}, TypeError, "enable_prefix_caching must be True or False"),
    ],
)
def test_bad_options_are_refused(options, error, message):
    kwargs = {"num_blocks": 4, "max_num_batched_tokens": 8, **options}
    with pytest.raises(error, match=message):
        kv.serve([kv.Request("a", [1, 2, 3], 2)], *model(), **kwargs)


def test_bad_arrays_are_refused():
    embedding, w_q, w_k, w_v = model()
    request = [kv.Request("a", [1, 2, 3], 2)]
    options = {"num_blocks": 4, "max_num_batched_tokens": 8}
    with pytest.raises(ValueError, match=r"embedding must be \[V, D_model\], got shape \(40,\)"):
        kv.serve(request, embedding[:, 0], w_q, w_k, w_v, **options)
    with pytest.raises(ValueError, match=r"w_k has 3 rows but embedding has D_model=4"):
        kv.serve(request, embedding, w_q, w_k[:3], w_v, **options)
    bad = embedding.copy()
    bad[7, 0] = np.nan
    with pytest.raises(ValueError, match="embedding contains NaN or inf"):
        kv.serve(request, bad, w_q, w_k, w_v, **options)
    with pytest.raises(TypeError, match="embedding must be a float32 or float64 array"):
        kv.serve(request, embedding.astype(np.int64), w_q, w_k, w_v, **options)
    ragged = [[0.1, 0.2, 0.3], [0.4]] + w_q[2:].tolist()  # rows of 3 and of 1: no array
    for name, args in (("w_q", (ragged, w_k, w_v)), ("w_v", (w_q, w_k, ragged))):
        with pytest.raises(ValueError, match=rf"^{name} is not a rectangular array"):
            kv.serve(request, embedding, *args, **options)


# --- properties (hypothesis): random workloads against each request's own reference ---------------------


@st.composite
def workloads(draw):
    """(requests, weights, options): 1-6 requests sharing parts of one prefix, random arrivals, pools and budgets."""
    vocab = draw(st.integers(2, 6))  # few ids: prefixes repeat, blocks are shared
    d_model, d_k, d_v = (draw(st.integers(1, 4)) for _ in range(3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = (rng.standard_normal((vocab, d_model)) * draw(st.floats(0.1, 3.0)),
               *(rng.standard_normal((d_model, d)) / np.sqrt(d_model) for d in (d_k, d_k, d_v)))
    shared = rng.integers(0, vocab, draw(st.integers(0, 10))).tolist()
    requests = []
    for i in range(draw(st.integers(1, 6))):
        ids = shared[: draw(st.integers(0, len(shared)))] + rng.integers(0, vocab, draw(st.integers(0, 8))).tolist()
        ids = ids or [0]
        requests.append(kv.Request(i, ids, draw(st.integers(1, len(ids))), draw(st.integers(0, 6))))
    block_size = draw(st.integers(1, 4))
    least = max(math.ceil(len(r.token_ids) / block_size) for r in requests)  # each request must fit alone
    ample = sum(math.ceil(len(r.token_ids) / block_size) for r in requests)
    options = {
        "block_size": block_size,
        "num_blocks": draw(st.integers(least, max(least, ample))),
        "max_num_batched_tokens": draw(st.integers(1, 12)),
        "max_num_seqs": draw(st.none() | st.integers(1, 4)),
        "enable_prefix_caching": draw(st.booleans()),
    }
    return requests, weights, options, ample


@settings(max_examples=120, deadline=None)
@given(workload=workloads())
def test_every_request_equals_its_own_reference_and_the_counts_add_up(workload):
    requests, weights, options, ample = workload
    result = kv.serve(requests, *weights, **options)
    for r in requests:
        np.testing.assert_allclose(result.outputs[r.request_id], serve_reference(r.token_ids, r.prompt_len, *weights),
                                   **TOL)
    stats, total = result.stats, sum(len(r.token_ids) for r in requests)
    per_step = [p + d for p, d in zip(stats.prefill_tokens_per_step, stats.decode_tokens_per_step)]
    assert len(per_step) == stats.steps and all(1 <= n <= options["max_num_batched_tokens"] for n in per_step)
    assert stats.peak_blocks <= options["num_blocks"]
    assert stats.decode_tokens <= sum(len(r.token_ids) - r.prompt_len for r in requests)
    computed = stats.prefill_tokens + stats.decode_tokens
    if not options["enable_prefix_caching"]:
        assert stats.prefix_hit_tokens == 0 and computed == total + stats.recomputed_tokens
    assert computed >= total - stats.prefix_hit_tokens
    if options["num_blocks"] >= ample:  # every request at full length fits at once: nobody is preempted
        assert stats.preemptions == 0
    if stats.preemptions == 0:
        assert stats.recomputed_tokens == 0 and computed == total - stats.prefix_hit_tokens


def test_reprs_are_short_whatever_the_lengths():
    request = kv.Request("a", list(range(3000)), 2990)
    assert repr(request) == "Request('a', 3000 tokens, prompt_len=2990, arrival_step=0)"
    # A Request is checked only by serve: its repr holds for token ids without a length.
    assert repr(kv.Request(0, 5, 1)) == "Request(0, token_ids=5, prompt_len=1, arrival_step=0)"
    assert repr(kv.Request(0, None, 1.5)) == "Request(0, token_ids=None, prompt_len=1.5, arrival_step=0)"
    stats = kv.ServeStats(steps=2, preemptions=0, recomputed_tokens=0, prefix_hit_tokens=4, peak_blocks=3,
                          prefill_tokens_per_step=(6, 0), decode_tokens_per_step=(0, 2))
    assert repr(stats) == ("ServeStats(steps=2, preemptions=0, recomputed_tokens=0, prefix_hit_tokens=4, "
                           "peak_blocks=3, prefill_tokens=6, decode_tokens=2)")
    result = kv.ServeResult({"a": np.zeros((11, 5)), 7: np.zeros((1, 5))}, stats)
    assert repr(result) == f"ServeResult(outputs={{'a': [11, 5], 7: [1, 5]}}, stats={stats!r})"


def test_the_token_past_the_prompt_in_a_recomputing_chunk_counts_as_decode():
    """Blocks of 1, 2 blocks: b preempts a; a's readmitted chunk recomputes 2 tokens and computes 1 new one."""
    embedding = np.eye(2)
    requests = [kv.Request("a", [0, 0], 1), kv.Request("b", [1, 1], 1)]
    result = kv.serve(requests, embedding, embedding, embedding, embedding, block_size=1, num_blocks=2,
                      max_num_batched_tokens=2)
    # 2 prompt tokens and the recomputed ones are prefill; each request's one token past its prompt is decode
    assert result.stats.decode_tokens == 2
    assert result.stats.prefill_tokens == 2 + result.stats.recomputed_tokens


# --- the model: a request as a prompt and max_tokens, the caller's arrays only read, a caller's cache ------------

LLAMA = kv.ModelConfig(vocab_size=61, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2)
LLAMA_W = kv.init_weights(LLAMA, seed=3, dtype=np.float64)


def generated(prompt, n):
    """The model's own ``generate`` of ``n`` tokens after ``prompt``: the reference of a served request."""
    return kv.generate(LLAMA, LLAMA_W, [list(prompt)], n)[0, len(prompt):]


def llama_pool(num_blocks=16, caching=True):
    return kv.PagedKVCache(num_blocks, 4, LLAMA.head_dim, LLAMA.head_dim, np.float64, enable_prefix_caching=caching,
                           num_kv_heads=LLAMA.num_key_value_heads, num_layers=LLAMA.num_hidden_layers)


def pool_state(pool):
    """Everything a failed serve must leave as it was: tables, lengths, every layer's stored K/V, refcounts, cached
    blocks, the free queue in order, the peak, and each sequence's recorded token ids and hashes."""
    ids = pool.seq_ids
    stored = [[a[i, : n].tolist() for i, n in enumerate(lengths) for a in (k, v)]
              for k, v, lengths in (pool.gather(ids, layer) for layer in range(pool.num_layers))] if ids else []
    cached = [b for b in range(pool.num_blocks) if pool.block_pool.is_cached(b)]
    return dict(tables=[pool.block_table(s) for s in ids], lengths=[pool.get_seq_length(s) for s in ids],
                stored=stored, cached=cached, cached_kv=[[p[b].tolist() for b in cached] for p in pool.k_caches],
                ref_counts=[pool.ref_count(b) for b in range(pool.num_blocks)], free=pool.block_pool.free_blocks(),
                peak=pool.peak_blocks, private=repr((pool._token_ids, pool._block_hashes, pool._num_cached)))


def test_a_request_is_a_prompt_and_max_tokens_and_equals_its_own_generate():
    rng = np.random.default_rng(5)
    system = rng.integers(0, 61, 8).tolist()
    prompts = [system + rng.integers(0, 61, int(rng.integers(1, 6))).tolist() for _ in range(4)]
    requests = [kv.Request(i, p, max_tokens=3 + i, arrival_step=i // 2) for i, p in enumerate(prompts)]
    result = kv.serve(requests, model=(LLAMA, LLAMA_W), block_size=4, num_blocks=12, max_num_batched_tokens=9,
                      enable_prefix_caching=True)
    for i, prompt in enumerate(prompts):
        np.testing.assert_array_equal(result.outputs[i], generated(prompt, 3 + i))
    placeholders = [kv.Request(i, p + [0] * (2 + i), len(p)) for i, p in enumerate(prompts)]  # today's form
    again = kv.serve(placeholders, model=(LLAMA, LLAMA_W), num_blocks=12, max_num_batched_tokens=9)
    assert all(np.array_equal(again.outputs[i], result.outputs[i]) for i in range(4))
    with pytest.raises(ValueError, match=r"request 0 \(requests\[0\]\): max_tokens is for the model"):
        kv.serve([kv.Request(0, [1, 2, 3], 2, max_tokens=2)], model=(LLAMA, LLAMA_W), num_blocks=4,
                 max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="max_tokens is for the model.* and the single head"):
        kv.serve([kv.Request(0, [1, 2, 3], max_tokens=2)], *model(), num_blocks=4, max_num_batched_tokens=4)


@pytest.mark.parametrize("caching, num_blocks", [(True, 12), (False, 5)])  # 5 blocks of 4: preemptions
def test_each_request_stops_at_its_end_token_kept_and_computes_nothing_past_it(caching, num_blocks):
    rng = np.random.default_rng(5)  # greedy without an end token: [55, 14, 6, 5, 34, 34, 34, 4],
    system = rng.integers(0, 61, 8).tolist()  # [50, 42, 29, 17, 17, ...] twice, [41, 17, 60, 17, ...]
    prompts = [system + rng.integers(0, 61, int(rng.integers(1, 6))).tolist() for _ in range(4)]
    config = dataclasses.replace(LLAMA, eos_token_id=17)
    requests = [kv.Request(i, p, max_tokens=8, arrival_step=i // 2) for i, p in enumerate(prompts)]
    pool = llama_pool(num_blocks, caching)
    result = kv.serve(requests, model=(config, LLAMA_W), cache=pool, max_num_batched_tokens=9)
    assert pool.seq_ids == () and pool.num_free_blocks == num_blocks  # every request's blocks freed
    assert [len(result.outputs[i]) for i in range(4)] == [8, 4, 4, 2]  # request 0 never meets 17: max_tokens
    for i, prompt in enumerate(prompts):
        np.testing.assert_array_equal(result.outputs[i], kv.generate(config, LLAMA_W, [prompt], 8)[0, len(prompt):])
    stats = result.stats  # nothing computed past an end token: each output but the last fed back once
    assert stats.decode_tokens == sum(len(out) - 1 for out in result.outputs.values())
    assert stats.prefill_tokens == sum(map(len, prompts)) - stats.prefix_hit_tokens + stats.recomputed_tokens
    assert (stats.preemptions > 0) == (not caching)
    ignored = kv.serve(requests, model=(config, LLAMA_W), num_blocks=16, max_num_batched_tokens=9, eos_token_id=[])
    assert all(np.array_equal(ignored.outputs[i], generated(p, 8)) for i, p in enumerate(prompts))  # ignore_eos
    either = kv.serve(requests, model=(config, LLAMA_W), num_blocks=16, max_num_batched_tokens=9, eos_token_id=[34, 41])
    assert [out.tolist() for out in either.outputs.values()] == [[55, 14, 6, 5, 34], [50, 42, 29, 17, 17, 17, 17, 19],
                                                                [50, 42, 29, 17, 17, 17, 17, 19], [41]]


def test_the_end_token_is_checked_before_anything_runs():
    requests, pool = [kv.Request(0, [1, 2, 3], max_tokens=2)], llama_pool()
    for eos, error, message in ((61, ValueError, r"eos_token_id must be an id in \[0, vocab_size=61\), got 61"),
                                ([3, 61], ValueError, r"eos_token_id must be ids in \[0, vocab_size=61\), got \[3, 61\]"),
                                ("2", TypeError, "eos_token_id")):
        with pytest.raises(error, match=message):
            kv.serve(requests, model=(LLAMA, LLAMA_W), cache=pool, max_num_batched_tokens=4, eos_token_id=eos)
    assert pool.seq_ids == () and pool.num_free_blocks == 16
    with pytest.raises(ValueError, match="eos_token_id is for the model=.*with the single head"):
        kv.serve([kv.Request(0, [1, 2, 3])], *model(), num_blocks=4, max_num_batched_tokens=4, eos_token_id=2)


def test_serve_never_writes_into_the_callers_arrays_nor_keeps_them():
    ids = np.array([1, 2, 3, 4, 0, 0, 0, 0], np.int64)
    expected = generated([1, 2, 3, 4], 5)
    shared = kv.serve([kv.Request("a", ids, 4), kv.Request("b", ids, 4)], model=(LLAMA, LLAMA_W), num_blocks=8,
                      max_num_batched_tokens=5)
    assert ids.tolist() == [1, 2, 3, 4, 0, 0, 0, 0]  # it came back [1, 2, 3, 4, 48, 30, 14, 20]
    np.testing.assert_array_equal(shared.outputs["a"], expected)  # two requests of one array: each its own
    np.testing.assert_array_equal(shared.outputs["b"], expected)
    read_only = ids.copy()
    read_only.flags.writeable = False  # it failed half-way: "assignment destination is read-only"
    result = kv.serve([kv.Request("a", read_only, 4)], model=(LLAMA, LLAMA_W), num_blocks=8, max_num_batched_tokens=5)
    np.testing.assert_array_equal(result.outputs["a"], expected)
    gone = weakref.ref(read_only)
    del read_only
    assert gone() is None  # nothing of the serve holds it


@pytest.mark.parametrize("failure", ["a NaN weight", "an exhausted pool", "Ctrl-C at forward 1", "Ctrl-C at forward 4"])
def test_a_serve_that_fails_leaves_the_callers_cache_as_it_was_and_raises_its_error(failure, monkeypatch):
    pool, rng = llama_pool(num_blocks=12), np.random.default_rng(8)
    system = rng.integers(0, 61, 8).tolist()
    kv.serve([kv.Request("warm", system + [5], max_tokens=4)], model=(LLAMA, LLAMA_W), cache=pool,
             max_num_batched_tokens=16)  # leaves two cached blocks of the system prompt, free
    pool.add_sequence("other", system + [7, 7, 7])  # holds those two, and takes a third
    kv.forward(LLAMA, LLAMA_W, [[7, 7, 7]], cache=kv.PagedCacheView(pool, ["other"], [[7, 7, 7]]))
    requests = [kv.Request(i, system + rng.integers(0, 61, 3).tolist(), max_tokens=6, arrival_step=i) for i in range(3)]
    w, error = LLAMA_W, KeyboardInterrupt
    if failure == "a NaN weight":
        name = "model.layers.0.mlp.up_proj.weight"  # layer 1's k is NaN: its cache refuses it, in the first forward
        w = {**LLAMA_W, name: LLAMA_W[name].copy()}
        w[name][0, 0] = np.nan
        error = ValueError
    elif failure == "an exhausted pool":
        pool.add_sequence("hog")
        pool.allocate_slots("hog", 4 * pool.num_free_blocks - 4)  # one block left: a prompt of 11 needs 3 (2 hit)
        error = kv.OutOfBlocksError
    else:
        calls, real = [0], kv.scheduler.forward

        def interrupted(*args, **kwargs):
            calls[0] += 1
            if calls[0] == int(failure[-1]):
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(kv.scheduler, "forward", interrupted)
    before = pool_state(pool)
    with pytest.raises(error):
        kv.serve(requests, model=(LLAMA, w), cache=pool, max_num_batched_tokens=7)
    assert pool_state(pool) == before
    monkeypatch.undo()
    if failure != "an exhausted pool":  # the pool serves them afterwards as if nothing had happened
        result = kv.serve(requests, model=(LLAMA, LLAMA_W), cache=pool, max_num_batched_tokens=7)
        for r in requests:
            np.testing.assert_array_equal(result.outputs[r.request_id], generated(r.token_ids, 6))
        assert result.stats.prefix_hit_tokens == 3 * 8 and pool.seq_ids == ("other",)


def test_a_callers_cache_must_fit_and_stands_for_the_pool_options():
    pool = llama_pool()
    for options, message in (({"num_blocks": 4}, r"num_blocks=4 was given with a cache"),
                             ({"enable_prefix_caching": True}, r"enable_prefix_caching=True was given")):
        with pytest.raises(ValueError, match=message):
            kv.serve([], model=(LLAMA, LLAMA_W), cache=pool, max_num_batched_tokens=4, **options)
    with pytest.raises(TypeError, match=r"cache holds float64 but the computation is float32"):
        kv.serve([], model=(LLAMA, {k: w.astype(np.float32) for k, w in LLAMA_W.items()}), cache=pool,
                 max_num_batched_tokens=4)
    pool.add_sequence("a")
    with pytest.raises(ValueError, match=r"request 'a' \(requests\[0\]\) repeats the request_id of a sequence in"):
        kv.serve([kv.Request("a", [1, 2], max_tokens=1)], model=(LLAMA, LLAMA_W), cache=pool, max_num_batched_tokens=4)
    with pytest.raises(TypeError, match="cache must be a PagedKVCache, got list"):
        kv.serve([], model=(LLAMA, LLAMA_W), cache=[], max_num_batched_tokens=4)
