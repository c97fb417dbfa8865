"""SlidingWindowCache: what it holds, what update() returns, crop(), nbytes and its errors, against a model of the ring.

The cache copies keys and values in and out, and positions are integers: both are compared bit for bit.
"""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kv_attention as kv


def positions(start, stop, lead=(), d=3):
    """Keys whose every entry is the position plus a per-entry offset, [*lead, stop - start, d]: a misplaced position shows."""
    p = np.arange(start, stop, dtype=np.float64)[:, None] + np.arange(d) / 10  # [T_new, d]
    return np.broadcast_to(p, lead + p.shape).copy()


class Ring:
    """A model of what the cache may still hold, written from the ring's definition and not from its slots.

    Writing position p >= n_sink overwrites position p - W when that is not a sink; sinks stay.
    """

    def __init__(self, window, n_sink):
        self.window, self.n_sink, self.length, self.gone = window, n_sink, 0, set()

    def held(self):
        return [p for p in range(self.length) if p not in self.gone]

    def write(self, count):
        for p in range(self.length, self.length + count):
            if p >= self.n_sink and p - self.window >= self.n_sink:
                self.gone.add(p - self.window)
        self.length += count

    def can_crop(self, length):
        """Whether every key position ``length`` attends to (its sinks and its window before it) is still held."""
        needed = set(range(min(self.n_sink, length))) | set(range(max(length - self.window + 1, 0), length))
        return needed <= set(self.held())

    def crop(self, length):
        self.length = length
        self.gone = {p for p in self.gone if p < length}


def test_buffers_hold_sinks_and_window_whatever_the_length():
    cache = kv.SlidingWindowCache((2,), window=4, k_dim=3, v_dim=2, n_sink=1)
    assert cache.k_cache is None and cache.layout == ((2,), 3, 2, None)  # allocated at the first update, in its dtype
    for start in range(0, 50, 7):
        cache.update(positions(start, start + 7, (2,)), positions(start, start + 7, (2,), d=2))
    assert cache.k_cache.shape == (2, 5, 3) and cache.get_seq_length() == 56
    np.testing.assert_array_equal(cache.held_positions(), [0, 52, 53, 54, 55])
    assert cache.window == 4 and cache.n_sink == 1 and isinstance(cache, kv.Cache)


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_update_returns_what_was_held_then_the_whole_chunk(lead):
    cache = kv.SlidingWindowCache(lead, window=3, k_dim=3, v_dim=2, n_sink=2)
    k, v = cache.update(positions(0, 4, lead), positions(0, 4, lead, d=2))  # 0..3: nothing held before
    np.testing.assert_array_equal(k, positions(0, 4, lead))
    np.testing.assert_array_equal(v, positions(0, 4, lead, d=2))
    np.testing.assert_array_equal(cache.held_positions(), [0, 1, 2, 3])  # sinks 0, 1; window 2, 3
    k, v = cache.update(positions(4, 12, lead), positions(4, 12, lead, d=2))  # a chunk of 8, longer than the window
    expected = np.concatenate([positions(0, 4, lead), positions(4, 12, lead)], axis=-2)
    np.testing.assert_array_equal(k, expected)  # every key a query of the chunk needs, none overwritten yet
    np.testing.assert_array_equal(cache.held_positions(), [0, 1, 9, 10, 11])
    k, _ = cache.update(positions(12, 14, lead), positions(12, 14, lead, d=2))
    expected = np.concatenate([positions(p, p + 1, lead) for p in (0, 1, 9, 10, 11, 12, 13)], axis=-2)
    np.testing.assert_array_equal(k, expected)


def test_a_decode_step_writes_first_and_returns_the_buffers_own_views():
    # Position 9 overwrites position 6, which it does not attend (window 3: 7, 8, 9); sinks 0, 1 stay.
    cache = kv.SlidingWindowCache((), window=3, k_dim=3, v_dim=2, n_sink=2)
    cache.update(positions(0, 9), positions(0, 9, d=2))
    order = cache.key_positions(1)
    k, v = cache.update(positions(9, 10), positions(9, 10, d=2))
    assert np.shares_memory(k, cache.k_cache) and np.shares_memory(v, cache.v_cache)  # no copy
    assert sorted(order.tolist()) == [0, 1, 7, 8, 9]
    np.testing.assert_array_equal(k, np.concatenate([positions(p, p + 1) for p in order]))
    np.testing.assert_array_equal(v, np.concatenate([positions(p, p + 1, d=2) for p in order]))


def test_an_empty_update_returns_what_is_held_and_changes_nothing():
    cache = kv.SlidingWindowCache((), window=2, k_dim=3, v_dim=2)
    cache.update(positions(0, 5), positions(0, 5, d=2))
    k, v = cache.update(np.zeros((0, 3)), np.zeros((0, 2)))
    np.testing.assert_array_equal(k, positions(3, 5))
    assert cache.get_seq_length() == 5


def test_slots_that_hold_no_position_are_zero():
    cache = kv.SlidingWindowCache((), window=4, k_dim=3, v_dim=2, n_sink=2)
    cache.update(positions(0, 3), positions(0, 3, d=2))
    np.testing.assert_array_equal(cache.k_cache[3:], 0)  # slots of positions 3, 4, 5 not written yet
    assert cache.k_cache[:3].any(axis=-1).all()  # every written slot holds its key


def test_nbytes_grows_then_stays_flat():
    cache = kv.SlidingWindowCache((), window=4, k_dim=64, v_dim=64, n_sink=2)
    per_position = 2 * 64 * 8
    sizes = []
    for t in range(12):
        cache.update(np.ones((1, 64)), np.ones((1, 64)))
        sizes.append(cache.nbytes)
    assert sizes == [per_position * min(t + 1, 6) for t in range(12)]


def test_crop_before_the_ring_wraps_drops_any_number_of_positions():
    cache = kv.SlidingWindowCache((), window=5, k_dim=3, v_dim=2, n_sink=1)
    cache.update(positions(0, 6), positions(0, 6, d=2))  # 0..5: the ring holds 1..5, nothing overwritten
    cache.crop(2)
    np.testing.assert_array_equal(cache.held_positions(), [0, 1])
    np.testing.assert_array_equal(cache.k_cache[2:], 0)
    k, _ = cache.update(positions(20, 21), positions(20, 21, d=2))  # position 2 again, with other values
    np.testing.assert_array_equal(k, np.concatenate([positions(0, 2), positions(20, 21)]))


def test_crop_after_the_ring_wraps_drops_one_position_and_refuses_more():
    cache = kv.SlidingWindowCache((), window=3, k_dim=3, v_dim=2, n_sink=1)
    cache.update(positions(0, 10), positions(0, 10, d=2))  # holds 0 and 7, 8, 9
    before = cache.k_cache.copy(), cache.v_cache.copy()
    with pytest.raises(ValueError, match=r"from 10 to 8 positions.*crop to a length in \[9, 10\] or in \[0, 1\]"):
        cache.crop(8)  # position 8 attends to 6, 7: 6 is overwritten
    np.testing.assert_array_equal(cache.k_cache, before[0])
    np.testing.assert_array_equal(cache.v_cache, before[1])
    assert cache.get_seq_length() == 10
    cache.crop(9)  # position 9 attends to 7, 8 (and the sink): still held
    np.testing.assert_array_equal(cache.held_positions(), [0, 7, 8])
    with pytest.raises(ValueError, match="crop to a length in"):
        cache.crop(8)
    cache.crop(1)  # down to the sinks is always possible
    np.testing.assert_array_equal(cache.held_positions(), [0])
    np.testing.assert_array_equal(cache.k_cache[1:], 0)
    cache.crop(0)
    assert cache.get_seq_length() == 0 and cache.nbytes == 0 and not cache.k_cache.any()


def test_crop_refuses_lengths_outside_what_was_seen():
    cache = kv.SlidingWindowCache((), window=3, k_dim=3, v_dim=2)
    cache.update(positions(0, 2), positions(0, 2, d=2))
    with pytest.raises(ValueError, match=r"crop length must be in \[0, 2\]"):
        cache.crop(3)
    with pytest.raises(TypeError, match="crop length must be an integer"):
        cache.crop(1.0)


def test_constructor_checks_its_arguments():
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        kv.SlidingWindowCache((), 0, 3, 2)
    with pytest.raises(TypeError, match="window must be an integer, got None"):
        kv.SlidingWindowCache((), None, 3, 2)
    with pytest.raises(ValueError, match="n_sink must be >= 0, got -1"):
        kv.SlidingWindowCache((), 4, 3, 2, n_sink=-1)
    with pytest.raises(TypeError, match="n_sink must be an integer"):
        kv.SlidingWindowCache((), 4, 3, 2, n_sink=1.5)
    with pytest.raises(TypeError, match="float32, float64, bfloat16 or float16, got int8"):
        kv.SlidingWindowCache((), 4, 3, 2, dtype=np.int8)
    with pytest.raises(TypeError, match="batch_shape must be a tuple"):
        kv.SlidingWindowCache(2, 4, 3, 2)
    cache = kv.SlidingWindowCache([2], 4, 3, 2, n_sink=1, dtype=np.float32)
    assert cache.k_cache.shape == (2, 5, 3) and cache.k_cache.dtype == np.float32


def test_update_refuses_what_does_not_fit_and_changes_nothing():
    cache = kv.SlidingWindowCache((), window=3, k_dim=3, v_dim=2, dtype=np.float32)
    cache.update(positions(0, 4).astype(np.float32), positions(0, 4, d=2).astype(np.float32))
    before = cache.k_cache.copy(), cache.held_positions()
    with pytest.raises(ValueError, match="do not fit the cache"):
        cache.update(np.zeros((1, 4), np.float32), np.zeros((1, 2), np.float32))
    with pytest.raises(TypeError, match="cannot hold without loss"):
        cache.update(np.zeros((1, 3)), np.zeros((1, 2)))
    with pytest.raises(TypeError, match="numpy arrays"):
        cache.update([[0.0, 0.0, 0.0]], [[0.0, 0.0]])
    np.testing.assert_array_equal(cache.k_cache, before[0])
    np.testing.assert_array_equal(cache.held_positions(), before[1])


class RingMachine(RuleBasedStateMachine):
    """Random updates and crops: the cache holds and returns exactly the model's positions, with their keys."""

    def __init__(self):
        super().__init__()
        self.cache = self.model = None

    @precondition(lambda self: self.cache is None)
    @rule(window=st.integers(1, 5), n_sink=st.integers(0, 3))
    def make(self, window, n_sink):
        self.cache = kv.SlidingWindowCache((2,), window, 3, 2, n_sink=n_sink)
        self.model = Ring(window, n_sink)

    @precondition(lambda self: self.cache is not None)
    @rule(count=st.integers(0, 9))
    def update(self, count):
        start, held = self.model.length, self.model.held()
        order = self.cache.key_positions(count).tolist()
        k, v = self.cache.update(positions(start, start + count, (2,)), positions(start, start + count, (2,), d=2))
        if count == 1:  # a decode step: exactly the keys position `start` attends to, in any order
            window, n_sink = self.model.window, self.model.n_sink
            assert sorted(order) == [s for s in range(start + 1) if s < n_sink or start - s < window]
        else:  # what was held, then the chunk
            assert order == held + list(range(start, start + count))
        expected = np.zeros((2, 0, 3)) if not order else np.concatenate([positions(p, p + 1, (2,)) for p in order], -2)
        np.testing.assert_array_equal(k, expected)
        assert v.shape == (2, len(order), 2)
        self.model.write(count)

    @precondition(lambda self: self.cache is not None)
    @rule(back=st.integers(0, 12))
    def crop(self, back):
        length = max(self.model.length - back, 0)
        if self.model.can_crop(length):
            self.cache.crop(length)
            self.model.crop(length)
        else:
            with pytest.raises(ValueError, match="cannot crop the sliding-window cache"):
                self.cache.crop(length)

    @invariant()
    def holds_what_the_model_holds(self):
        if self.cache is None:
            return
        held = self.model.held()
        assert self.cache.get_seq_length() == self.model.length
        np.testing.assert_array_equal(self.cache.held_positions(), held)
        assert self.cache.nbytes == len(held) * 2 * (3 + 2) * 8
        assert len(held) <= self.model.n_sink + self.model.window


TestRing = RingMachine.TestCase
TestRing.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_repr_gives_the_layout_and_the_positions_seen():
    cache = kv.SlidingWindowCache((2, 4), 8, 16, 8, n_sink=2, dtype=np.float32)
    cache.update(np.ones((2, 4, 13, 16), np.float32), np.ones((2, 4, 13, 8), np.float32))  # more than the 10 slots
    assert repr(cache) == ("SlidingWindowCache(batch_shape=(2, 4), window=8, k_dim=16, v_dim=8, n_sink=2, "
                           "dtype=float32, seq_length=13)")


@pytest.mark.parametrize(
    "t_new, error, message",
    [(-5, ValueError, "t_new must be >= 0, got -5"), (1.5, TypeError, "t_new must be an integer, got 1.5"),
     ("a", TypeError, "t_new must be an integer, got 'a'"), (True, TypeError, "t_new must be an integer, got True")],
)
def test_key_positions_refuses_a_t_new_that_is_not_an_integer_from_0(t_new, error, message):
    cache = kv.SlidingWindowCache((), window=3, k_dim=3, v_dim=2, n_sink=1)
    cache.update(positions(0, 5), positions(0, 5, d=2))
    with pytest.raises(error, match=f"^{message}$"):
        cache.key_positions(t_new)
    np.testing.assert_array_equal(cache.key_positions(np.int64(2)), [0, 2, 3, 4, 5, 6])  # the sink, the ring 2-4, new 5-6


def test_update_refuses_nan_and_changes_nothing():
    cache = kv.SlidingWindowCache((), window=2, k_dim=3, v_dim=2)
    cache.update(positions(0, 3), positions(0, 3, d=2))
    before = cache.k_cache.copy(), cache.v_cache.copy(), cache.held_positions()
    v = positions(3, 4, d=2)
    v[0, 1] = np.nan
    with pytest.raises(ValueError, match="^v contains NaN or inf$"):
        cache.update(positions(3, 4), v)  # one position: the path that writes before it returns
    assert cache.get_seq_length() == 3
    np.testing.assert_array_equal(cache.k_cache, before[0])
    np.testing.assert_array_equal(cache.v_cache, before[1])
    np.testing.assert_array_equal(cache.held_positions(), before[2])


@pytest.mark.parametrize("held, t_new", [(3, 2), (9, 1), (9, 4), (9, 20)])
def test_a_snapshot_keeps_only_the_slots_a_call_writes_and_restores_a_wrapped_ring_bit_for_bit(held, t_new):
    cache = kv.SlidingWindowCache((2,), 4, 3, 3, n_sink=1)  # 5 slots
    cache.update(positions(0, held, (2,)), positions(0, held, (2,)))
    before = [cache.k_cache.copy(), cache.v_cache.copy(), cache.get_seq_length(), list(cache.held_positions())]
    snapshot = cache.snapshot(t_new)
    assert len(snapshot[1][0][2]) == min(t_new, 5)  # the slots kept: those t_new positions write, at most all 5
    for p in range(held, held + t_new):  # a call writing one position at a time, wrapping the ring
        cache.update(positions(p, p + 1, (2,)) + 100, positions(p, p + 1, (2,)) + 100)
    cache.restore(snapshot)
    np.testing.assert_array_equal(cache.k_cache, before[0])
    np.testing.assert_array_equal(cache.v_cache, before[1])
    assert [cache.get_seq_length(), list(cache.held_positions())] == before[2:]
