"""Paired timing: two sides alternated burst by burst, judged on the median of the per-pair ratios.

A machine's speed drifts (a 1.64x change between 2 s blocks of one process was
seen on the 2-core VM this suite is measured on), so medians of two sides
taken at different times compare the drift as much as the code. Taken in
turns, both sides of a pair see the same machine, and the drift divides out of
their ratio: duet benchmarking (Bulej et al., ICPE 2020) and randomized
multiple interleaved trials (Abedi & Brecht, ICPE 2017). Measured here
(docs/benchmarking.md, "Paired ratios"): the median of per-pair ratios of two
processes of identical code stayed within 0.17-0.53 % of 1, the ratio of
their unpaired medians within 2-4 %.

The contract shared by every function here:

- a *side* is a callable that takes a number of samples and returns that many
  timings of one call each, in seconds (:func:`local_side` times a callable in
  this process; ``tools/pairs.py`` asks a worker process in a commit's asv
  environment);
- a *pair* is one burst of :data:`BURST` samples of each side, the order
  swapped every pair (ABBA...), so neither side always runs right after the
  other; a side's value in a pair is the median of its burst, and the pair's
  ratio is ``second / first``;
- the estimate is the median of the per-pair ratios, with the distribution-free
  95 % interval of a median from the order statistics of the ratios (the sign
  test's interval: the ratios need only be independent, not normal).

Nothing here imports kv_attention: the suite's ratio benchmarks and the gate's
cross-commit comparison share it.
"""

import math
import statistics
import time

BURST = 3  # samples per side per pair: the probe's burst, short beside the host's drift
LONG_SAMPLE = 0.02  # seconds: a side's sample this long is taken once per pair
EXTENDED = 3  # a verdict left open is measured further, up to this many times the time asked for
CONFIDENCE = 0.95


def local_side(call, number=1, clock=time.perf_counter):
    """A side that times ``call()`` in this process: ``samples(n)`` -> n seconds per call, each of ``number`` calls.

    ``clock`` reads seconds: wall time by default; ``time.thread_time`` counts this thread's CPU time only, not
    the time other processes held the core.
    """

    def samples(n):
        out = []
        for _ in range(n):
            start = clock()
            for _ in range(number):
                call()
            out.append((clock() - start) / number)
        return out

    return samples


def calibrate(call, sample_seconds=2e-3):
    """How many calls of ``call()`` make one sample of at least ``sample_seconds`` (``call`` runs a few times)."""
    call()  # a first call outside the estimate: first-call work (caches, imports)
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, math.ceil(sample_seconds / once))


def alternate(first, second, pairs, burst=BURST, offset=0):
    """``pairs`` per-pair ratios ``second / first`` of two sides (see the module docstring), in order.

    Pair ``i`` starts with ``first`` when ``i + offset`` is even, else with ``second``.
    """
    if pairs < 1 or burst < 1:
        raise ValueError(f"pairs and burst must be >= 1, got pairs={pairs}, burst={burst}")
    ratios = []
    for i in range(offset, offset + pairs):
        if i % 2 == 0:
            a = statistics.median(first(burst))
            b = statistics.median(second(burst))
        else:
            b = statistics.median(second(burst))
            a = statistics.median(first(burst))
        if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
            raise ValueError(f"a side's samples must be positive finite seconds, got first={a!r}, second={b!r}")
        ratios.append(b / a)
    return ratios


def pairs_within(first, second, seconds, min_pairs=8, max_pairs=200, burst=BURST, decided=None):
    """Per-pair ratios ``second / first``, as many pairs as fit in about ``seconds`` (between the two bounds).

    A first pair of one sample a side sizes the rest; a side whose sample takes
    longer than :data:`LONG_SAMPLE` is sampled once per pair rather than
    ``burst`` times (a sample that long already averages over the host's
    short stalls, and ``min_pairs`` bursts of it would cost seconds).

    ``decided(ratios) -> bool``, if given, is asked after those pairs: while it
    says no, up to ``min_pairs`` more pairs are taken, at most ``max_pairs`` in
    all and as many as fit in :data:`EXTENDED` times ``seconds`` at the pace so far
    (a verdict the pairs left open is measured further; one they settled is not).
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
    if not 1 <= min_pairs <= max_pairs or burst < 1:
        raise ValueError(f"need 1 <= min_pairs <= max_pairs and burst >= 1, got min_pairs={min_pairs}, "
                         f"max_pairs={max_pairs}, burst={burst}")
    start = time.perf_counter()
    ratios = alternate(first, second, 1, 1)
    per_sample = max(time.perf_counter() - start, 1e-9) / 2
    burst = burst if per_sample < LONG_SAMPLE else 1
    wanted = min(max_pairs, max(min_pairs, int(seconds / (2 * burst * per_sample))))
    if wanted > 1:
        ratios += alternate(first, second, wanted - 1, burst, offset=1)
    while decided is not None and len(ratios) < max_pairs and not decided(ratios):
        elapsed = time.perf_counter() - start
        pace = elapsed / len(ratios)  # seconds a pair so far
        fit = int((EXTENDED * seconds - elapsed) / pace) if pace > 0 else max_pairs  # pairs the time has left
        more = min(min_pairs, max_pairs - len(ratios), fit)
        if more < 1:
            break
        ratios += alternate(first, second, more, burst, offset=len(ratios))
    return ratios


def median_interval(ratios, confidence=CONFIDENCE):
    """``(median, low, high)`` of ``ratios``: the median and its distribution-free ``confidence`` interval.

    The interval is ``[x_(k), x_(n+1-k)]`` of the sorted ratios, ``k`` the
    largest rank with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``
    (the sign test's interval for a median). Below 6 ratios no 95 % interval
    exists, and it is ``(-inf, inf)``-wide: the smallest and largest ratio
    then are NOT an interval, so none is claimed.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    values = sorted(ratios)
    n = len(values)
    if n == 0:
        raise ValueError("median_interval needs at least one ratio")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"median_interval needs finite ratios, got {[v for v in values if not math.isfinite(v)]}")
    tail = (1 - confidence) / 2
    k, cumulative = 0, 0.0
    while True:  # the largest k with P(B < k) <= tail, B ~ Binomial(n, 1/2)
        cumulative += math.comb(n, k) / 2 ** n  # now P(B <= k) = P(B < k + 1)
        if cumulative > tail:
            break
        k += 1
    median = statistics.median(values)
    if k == 0:
        return median, -math.inf, math.inf
    return median, values[k - 1], values[n - k]
