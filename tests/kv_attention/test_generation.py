"""generate as Hugging Face's: end tokens and padding, sampling (HF's warpers, a seed), a streamer.

The warpers are checked against a plain reimplementation of HF's rules (sort descending, keep a prefix), the draws
against the filtered softmax by a chi-square test over fixed seeds: the statistic must stay below the 0.999
quantile of its distribution (Wilson-Hilferty), a bound a correct sampler misses once in a thousand seed sets and a
wrong filter (one token too many or too few) exceeds by far at these counts.
"""

import numpy as np
import pytest

import kv_attention as kv
from kv_attention.sampling import softmax, warp

from .test_model import CONFIG, caches, weights

W = weights()
PROMPT = np.array([[5, 17, 33, 5, 17]])  # its last bigram came before: a prompt-lookup draft [33, 5, 17]
COPY = np.array([[46, 5, 28, 29, 29, 46, 5]])  # drafts [28, 29, 29], often among W's two likeliest tokens (searched)


def greedy(ids, n, **options):
    return kv.generate(CONFIG, W, ids, n, cache=caches("dynamic", batch=ids.shape[0]), **options)


def chi_square_bound(dof, z=3.090):
    """The 0.999 quantile of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty, z of 0.999)."""
    return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


def assert_frequencies(counts, probs):
    """``counts`` of outcomes drawn with ``probs``: none outside them, chi-square below :func:`chi_square_bound`."""
    assert set(counts) <= {o for o, p in probs.items() if p > 0}, "an outcome the filter removed was drawn"
    n = sum(counts.values())
    expected = {o: n * p for o, p in probs.items() if p > 0}
    stat = sum((counts.get(o, 0) - e) ** 2 / e for o, e in expected.items())
    assert stat < chi_square_bound(len(expected) - 1), (stat, counts, expected)


# End tokens


def test_a_row_stops_at_its_end_token_which_is_kept():
    full = greedy(PROMPT, 12, eos_token_id=[])[0, 5:].tolist()  # [] : no end token
    eos = full[4]
    first = full.index(eos)
    out = greedy(PROMPT, 12, eos_token_id=eos)
    assert out[0, 5:].tolist() == full[: first + 1]
    assert greedy(PROMPT, 12, eos_token_id=[60, eos])[0, 5:].tolist() == full[: first + 1]  # a list too


def test_the_end_token_defaults_to_the_configs():
    import dataclasses

    full = greedy(PROMPT, 12)[0, 5:].tolist()  # CONFIG has none
    config = dataclasses.replace(CONFIG, eos_token_id=full[3])
    out = kv.generate(config, W, PROMPT, 12, cache=caches("dynamic", batch=1))
    assert out[0, 5:].tolist() == full[: full.index(full[3]) + 1]


def test_rows_ended_earlier_are_padded_and_the_call_ends_with_the_last_row():
    ids = np.array([[5, 17, 33, 5, 17], [40, 2, 9, 9, 31]])
    full = greedy(ids, 10, eos_token_id=[])[:, 5:]
    eos = int(full[0, 2])
    ends = [row.tolist().index(eos) if eos in row else None for row in full]
    out = greedy(ids, 10, eos_token_id=eos, pad_token_id=0)[:, 5:]
    stop = max(10 - 1 if e is None else e for e in ends) + 1
    assert out.shape == (2, stop)
    for row, e in zip(range(2), ends):
        expect = full[row, :stop].copy()
        if e is not None:
            expect[e + 1 :] = 0
        assert out[row].tolist() == expect.tolist()


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_after_an_end_token_the_cache_holds_every_token_but_the_last(kind):
    full = greedy(PROMPT, 12, eos_token_id=[])[0, 5:].tolist()
    cache = caches(kind, batch=1)
    out = kv.generate(CONFIG, W, PROMPT, 12, cache=cache, eos_token_id=full[4])
    assert cache.get_seq_length() == out.shape[1] - 1
    np.testing.assert_allclose(kv.forward(CONFIG, W, out[:, -1:], cache=cache)[0, -1],
                               kv.forward(CONFIG, W, out)[0, -1], rtol=0, atol=1e-9)


def test_prompt_lookup_stops_at_an_end_token_inside_an_accepted_draft():
    full = greedy(PROMPT, 12, eos_token_id=[])[0, 5:].tolist()
    for eos in set(full):
        cache = caches("dynamic", batch=1)
        out = kv.generate(CONFIG, W, PROMPT, 12, cache=cache, eos_token_id=eos, prompt_lookup_num_tokens=4)
        assert out[0, 5:].tolist() == full[: full.index(eos) + 1], eos
        assert cache.get_seq_length() == out.shape[1] - 1


@pytest.mark.parametrize("options, message", [
    ({"eos_token_id": CONFIG.vocab_size}, "eos_token_id"), ({"eos_token_id": [1, -1]}, "eos_token_id"),
    ({"pad_token_id": [1]}, "pad_token_id"), ({"temperature": 0.0, "do_sample": True}, "temperature"),
    ({"top_k": -1}, "top_k"), ({"top_p": 1.5}, "top_p"), ({"seed": -3}, "seed"), ({"do_sample": "yes"}, "do_sample"),
    ({"streamer": print}, "streamer"),
])
def test_bad_generation_options_are_named_and_nothing_is_written(options, message):
    cache = caches("static", batch=1)
    kv.forward(CONFIG, W, PROMPT, cache=cache)
    before = cache.k_cache.copy()
    with pytest.raises((TypeError, ValueError), match=message):
        kv.generate(CONFIG, W, PROMPT[:, -1:], 3, cache=cache, **options)
    assert cache.get_seq_length() == 5 and np.array_equal(cache.k_cache, before)


# Sampling


def hf_warp(logits, temperature, top_k, top_p):
    """HF's three warpers as their docs state them, one row: the kept tokens' scores, the rest -inf."""
    scores = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-scores, kind="stable")
    keep = np.zeros(scores.shape, bool)
    kth = scores[order[min(top_k, len(scores)) - 1]] if top_k else -np.inf
    keep[scores >= kth] = True  # top_k, ties kept
    probs = softmax(np.where(keep, scores, -np.inf))
    mass = 0.0
    for i in order:  # descending: the smallest set of mass >= top_p
        if not keep[i]:
            continue
        if mass >= top_p and mass > 0:  # the largest is always kept
            keep[i] = False
        mass += probs[i]
    return np.where(keep, scores, -np.inf)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 50, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 20, 0.6),
                                                       (1.0, 1, 1.0), (1.0, 0, 0.0)])
def test_the_warpers_are_huggingfaces(temperature, top_k, top_p):
    logits = np.random.default_rng(3).standard_normal((4, 61)) * 2
    got = warp(logits, temperature, top_k, top_p)
    for row, out in zip(logits, got):
        np.testing.assert_array_equal(np.isinf(out), np.isinf(hf_warp(row, temperature, top_k, top_p)))
        np.testing.assert_allclose(out[np.isfinite(out)], row[np.isfinite(out)] / temperature, rtol=1e-15)


def test_greedy_is_the_default_and_a_seed_repeats_its_tokens():
    assert np.array_equal(greedy(PROMPT, 8), greedy(PROMPT, 8, do_sample=False))
    a, b, c = (greedy(PROMPT, 8, do_sample=True, seed=s, temperature=1.5, top_k=0) for s in (7, 7, 8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("options", [{"top_k": 1}, {"temperature": 1e-4}, {"top_p": 0.0}])
def test_top_k_1_a_temperature_near_0_and_top_p_0_give_greedys_tokens(options):
    for seed in range(5):
        assert np.array_equal(greedy(PROMPT, 8, do_sample=True, seed=seed, **options), greedy(PROMPT, 8))


def test_greedy_warns_at_the_callers_line_where_a_sampling_option_is_set():
    with pytest.warns(UserWarning, match="do_sample is False, so temperature, top_p .* has no effect") as caught:
        out = kv.generate(CONFIG, W, PROMPT, 3, temperature=0.5, top_p=0.9)
    assert caught[0].filename == __file__ and np.array_equal(out, greedy(PROMPT, 3))


@pytest.mark.parametrize("options", [{"temperature": 0.8, "top_k": 6}, {"temperature": 1.5, "top_k": 0, "top_p": 0.7}])
def test_the_first_tokens_frequencies_over_seeds_are_the_filtered_softmax(options):
    logits = kv.forward(CONFIG, W, PROMPT)[0, -1]
    probs = dict(enumerate(softmax(hf_warp(logits, options["temperature"], options["top_k"], options.get("top_p", 1)))))
    counts = {}
    for seed in range(3000):
        token = int(greedy(PROMPT, 1, do_sample=True, seed=seed, **options)[0, -1])
        counts[token] = counts.get(token, 0) + 1
    assert_frequencies(counts, probs)


def test_prompt_lookup_with_sampling_is_exact_in_distribution():
    """The first three tokens' joint distribution, computed from the model's logits at each prefix, against draws
    with drafts verified by HF's rule (a draft token kept while equal to the token drawn there)."""
    options = {"do_sample": True, "temperature": 2.0, "top_k": 2}
    probs = {}
    p1 = softmax(warp(kv.forward(CONFIG, W, COPY)[0, -1], 2.0, 2))
    for a in np.flatnonzero(p1):
        p2 = softmax(warp(kv.forward(CONFIG, W, np.append(COPY, a)[None])[0, -1], 2.0, 2))
        for b in np.flatnonzero(p2):
            p3 = softmax(warp(kv.forward(CONFIG, W, np.append(COPY, [a, b])[None])[0, -1], 2.0, 2))
            for c in np.flatnonzero(p3):
                probs[(a, b, c)] = p1[a] * p2[b] * p3[c]
    counts, accepted = {}, 0
    for seed in range(2000):
        out, stats = kv.prompt_lookup_generate(CONFIG, W, COPY, 3, cache=caches("dynamic", batch=1),
                                               prompt_lookup_num_tokens=3, seed=seed, **options)
        key = tuple(out[0, 7:].tolist())
        counts[key] = counts.get(key, 0) + 1
        accepted += stats.num_accepted_tokens
    assert accepted > 500  # drafts were kept: the rule was exercised
    assert_frequencies(counts, probs)


def test_a_streamer_gets_the_prompt_then_each_forwards_tokens_then_end():
    class Streamer:
        def __init__(self):
            self.puts, self.ended = [], 0

        def put(self, value):
            self.puts.append(np.array(value))

        def end(self):
            self.ended += 1

    s = Streamer()
    out, stats = kv.prompt_lookup_generate(CONFIG, W, COPY, 9, cache=caches("dynamic", batch=1), streamer=s,
                                           prompt_lookup_num_tokens=3, do_sample=True, top_k=2, seed=0)
    assert np.array_equal(s.puts[0], COPY) and s.ended == 1
    assert np.array_equal(np.concatenate(s.puts, axis=1), out)
    assert len(s.puts) == 1 + stats.num_forwards < 1 + 9  # a put per forward, some of several tokens
