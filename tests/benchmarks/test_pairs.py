"""Paired timing (benchmarks/pairs.py): the order of the pairs, the drift they cancel, the median's interval."""

import itertools
import math
import statistics

import pytest

from benchmarks import pairs


def binomial_tail(n, k):
    """P(Binomial(n, 1/2) < k), summed term by term: the sign test's tail, written here independently."""
    return sum(math.factorial(n) // (math.factorial(i) * math.factorial(n - i)) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n", [6, 7, 10, 20, 31, 60, 200])
def test_the_interval_is_the_sign_tests_order_statistics(n):
    ratios = [1 + i / 1000 for i in range(n)][::-1]  # sorted by the function, not by the caller
    median, low, high = pairs.median_interval(ratios)
    k = max(j for j in range(1, n // 2 + 1) if binomial_tail(n, j) <= 0.025)
    assert median == statistics.median(ratios)
    assert (low, high) == (1 + (k - 1) / 1000, 1 + (n - k) / 1000)
    assert binomial_tail(n, k + 1) > 0.025  # k is the largest rank that keeps the 95 % coverage


def test_the_published_interval_of_twenty_ratios():
    # For n = 20 the 95 % interval of a median is [x_(6), x_(15)] (tables of the sign test).
    assert pairs.median_interval(range(1, 21))[1:] == (6, 15)


def test_fewer_than_six_ratios_claim_no_interval():
    assert pairs.median_interval([1.0, 1.1, 0.9, 1.05, 1.02]) == (1.02, -math.inf, math.inf)
    with pytest.raises(ValueError, match="at least one ratio"):
        pairs.median_interval([])


def test_pairs_alternate_their_order_and_cancel_a_drift_that_unpaired_medians_keep():
    """A machine whose speed halves steadily over the run: a side 5 % slower is 1.05 in every pair, while
    all of one side's samples and then all of the other's compare the drift instead."""
    clock, calls = itertools.count(), []

    def side(name, cost):
        def samples(n):
            calls.append((name, n))
            return [cost * (1 + next(clock) / 100) for _ in range(n)]
        return samples

    a, b = side("a", 1.0), side("b", 1.05)
    ratios = pairs.alternate(a, b, pairs=20, burst=3)
    assert calls[:4] == [("a", 3), ("b", 3), ("b", 3), ("a", 3)]  # ABBA: neither side always goes first
    assert len(ratios) == 20
    median, low, high = pairs.median_interval(ratios)
    assert low <= 1.05 <= high and median == pytest.approx(1.05, rel=0.02)
    first = statistics.median(a(60))
    unpaired = statistics.median(b(60)) / first
    assert unpaired > 1.25  # B's samples came after A's, on a slower machine


def test_a_local_side_times_each_call():
    calls = []
    samples = pairs.local_side(lambda: calls.append(1), number=4)(5)
    assert len(samples) == 5 and len(calls) == 20 and all(s >= 0 for s in samples)


@pytest.mark.parametrize("bad", [{"pairs": 0}, {"burst": 0}])
def test_no_pairs_or_an_empty_burst_is_refused(bad):
    side = pairs.local_side(lambda: None)
    with pytest.raises(ValueError, match="must be >= 1"):
        pairs.alternate(side, side, **{"pairs": 4, **bad})


def test_pairs_within_a_time_budget_take_bursts_of_short_samples_and_single_long_ones(monkeypatch):
    """A fake clock: each sample of A costs ``cost`` seconds, B 10 % more. The first pair (one sample a side)
    sizes the rest; the order keeps alternating across it; slow samples come one per pair."""
    now = [0.0]
    monkeypatch.setattr(pairs.time, "perf_counter", lambda: now[0])

    def run(cost, seconds, **bounds):
        calls = []

        def side(name, c):
            def samples(n):
                calls.append((name, n))
                now[0] += c * n
                return [c] * n
            return samples

        ratios = pairs.pairs_within(side("a", cost), side("b", 1.1 * cost), seconds, **bounds)
        return ratios, calls

    ratios, calls = run(0.001, 1.0, min_pairs=8, max_pairs=200)
    assert calls[:6] == [("a", 1), ("b", 1), ("b", 3), ("a", 3), ("a", 3), ("b", 3)]
    assert len(ratios) == int(1.0 / (2 * 3 * 0.00105))  # pairs of bursts of 3, ~1.05 ms a sample on average
    assert all(r == pytest.approx(1.1) for r in ratios)
    ratios, calls = run(0.5, 1.0, min_pairs=8, max_pairs=200)  # 0.5 s a sample: the minimum, one sample each
    assert len(ratios) == 8 and {n for _, n in calls} == {1}
    assert len(run(0.0001, 10.0, min_pairs=8, max_pairs=50)[0]) == 50


def test_an_open_verdict_is_measured_further_up_to_the_pair_and_time_bounds(monkeypatch):
    """``decided`` is asked after the pairs the time asked for: while it says no, ``min_pairs`` more are taken,
    the ABBA order going on, until it says yes, ``max_pairs`` are reached or EXTENDED x ``seconds`` have passed."""
    now = [0.0]
    monkeypatch.setattr(pairs.time, "perf_counter", lambda: now[0])
    order = []

    def side(name, cost):
        def samples(n):
            order.append(name)
            now[0] += cost * n
            return [cost] * n
        return samples

    def run(decided, max_pairs=200, cost=1 / 32):  # a long sample (one a side per pair); binary: exact sums
        order.clear()
        return pairs.pairs_within(side("a", cost), side("b", cost), 1.0, 8, max_pairs, decided=decided)

    assert len(run(lambda ratios: True)) == 16  # 1.0 s of 1/16 s pairs
    asked = []
    assert len(run(lambda ratios: asked.append(len(ratios)) or len(ratios) >= 32)) == 32
    assert asked == [16, 24, 32]
    assert order[:4] == ["a", "b", "b", "a"] and order[32:36] == ["a", "b", "b", "a"]  # pair 16 starts with a
    assert len(run(lambda ratios: False, max_pairs=40)) == 40  # never decided: the pair bound
    assert len(run(lambda ratios: False)) == 48  # never decided: EXTENDED x 1.0 s of 1/16 s pairs
    assert pairs.EXTENDED == 3


def test_the_extension_stops_before_it_would_pass_its_time(monkeypatch):
    """0.24 s a sample, 1.5 s asked for: the 9 pairs of the minimum take 4.32 s, and one more would pass 4.5 s."""
    now = [0.0]
    monkeypatch.setattr(pairs.time, "perf_counter", lambda: now[0])

    def side(samples_taken):
        now[0] += 0.24 * samples_taken
        return [0.24] * samples_taken

    ratios = pairs.pairs_within(side, side, 1.5, 9, 60, decided=lambda ratios: False)
    assert len(ratios) == 9 and now[0] <= pairs.EXTENDED * 1.5


@pytest.mark.parametrize("bad, message", [
    ({"seconds": math.nan}, "seconds must be a finite number >= 0, got nan"),
    ({"seconds": -1.0}, "seconds must be a finite number >= 0"),
    ({"min_pairs": 0}, "need 1 <= min_pairs <= max_pairs"),
    ({"min_pairs": 10, "max_pairs": 5}, "need 1 <= min_pairs <= max_pairs and burst >= 1, got min_pairs=10, max_pairs=5"),
    ({"burst": 0}, "burst >= 1"),
])
def test_pairs_within_refuses_bounds_that_mean_nothing(bad, message):
    side = pairs.local_side(lambda: None)
    with pytest.raises(ValueError, match=message):
        pairs.pairs_within(side, side, **{"seconds": 0.01, "min_pairs": 2, "max_pairs": 4, **bad})


@pytest.mark.parametrize("sample", [0.0, -1e-3, math.nan, math.inf])
def test_a_sample_that_is_no_time_is_refused_not_turned_into_a_ratio(sample):
    good, bad = (lambda n: [1e-3] * n), (lambda n: [sample] * n)
    with pytest.raises(ValueError, match="positive finite seconds"):
        pairs.alternate(good, bad, 2)


@pytest.mark.parametrize("confidence", [math.nan, -1, 0, 1, 1.5])
def test_median_interval_refuses_a_confidence_outside_0_to_1(confidence):
    with pytest.raises(ValueError, match="confidence must be between 0 and 1"):
        pairs.median_interval([1.0] * 10, confidence)


def test_median_interval_refuses_ratios_that_are_not_finite():
    with pytest.raises(ValueError, match=r"finite ratios, got \[nan\]"):
        pairs.median_interval([1.0, math.nan, 2.0, 0.5, 3.0, 1.1, 0.9, 1.2, 1.3])
