"""Robust duration history: weighted median, outliers, drift, conditioning, bounds, state."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.predictor.core import DurationHistory, HistoryStore


def _hist(samples: list[float], window: int = 16) -> DurationHistory:
    h = DurationHistory()
    for s in samples:
        h.add(s, window)
    return h


def test_single_outlier_does_not_move_the_estimate() -> None:
    base = [2.0, 2.1, 1.9, 2.0, 2.05]
    before = _hist(base).estimate(0.9)
    after = _hist([*base, 500.0]).estimate(0.9)
    assert before == pytest.approx(2.0)
    assert after <= 2.1  # a mean would jump to ~85 s


def test_minority_of_outliers_is_ignored_majority_is_followed() -> None:
    assert _hist([3.0] * 10 + [60.0] * 4).estimate(0.9) == 3.0
    # a drifting tool: after enough new observations the estimate follows
    assert _hist([3.0] * 10 + [6.0] * 6).estimate(0.9) == 6.0


def test_recency_weight_breaks_ties_towards_new_samples() -> None:
    assert _hist([1.0, 1.0, 5.0, 5.0]).estimate(0.5) == 5.0
    assert _hist([5.0, 5.0, 1.0, 1.0]).estimate(0.5) == 1.0


def test_window_bounds_memory() -> None:
    h = _hist([float(i) for i in range(100)], window=8)
    assert len(h) == 8 and h.count == 100
    assert min(h.samples) == 92.0


def test_estimate_above_conditions_on_elapsed_time() -> None:
    h = _hist([1.0, 1.2, 1.1, 10.0, 12.0, 11.0])
    assert h.estimate_above(5.0, 1.0) == 11.0
    assert h.estimate_above(20.0, 1.0) is None


def test_store_lru_eviction_and_dirty_tracking() -> None:
    store = HistoryStore(window=4, decay=0.9, max_keys=2)
    store.add("a", 1.0)
    store.add("b", 2.0)
    changed, evicted = store.drain_dirty()
    assert set(changed) == {"a", "b"} and not evicted
    store.add("a", 1.5)  # a becomes most recent
    store.add("c", 3.0)  # evicts b
    changed, evicted = store.drain_dirty()
    assert set(changed) == {"a", "c"} and evicted == {"b"}
    assert store.get("b") is None and store.estimate("c", 1) == 3.0
    assert store.estimate("c", 2) is None  # not enough samples


def test_state_round_trips_through_json() -> None:
    store = HistoryStore(window=4, decay=0.9, max_keys=10)
    for i in range(7):
        store.add("k", 1.0 + i)
    data = json.loads(json.dumps(store.to_dict()))
    other = HistoryStore(window=4, decay=0.9, max_keys=10)
    other.load(data)
    assert other.estimate("k", 1) == store.estimate("k", 1)
    assert other.get("k") is not None and other.get("k").count == 7  # type: ignore[union-attr]


def test_malformed_state_is_rejected() -> None:
    with pytest.raises(ValueError):
        DurationHistory.from_dict({"d": [1.0, float("inf")]})
    with pytest.raises(ValueError):
        DurationHistory.from_dict({"d": [float("nan")]})
    with pytest.raises((ValueError, TypeError)):
        DurationHistory.from_dict({"d": ["x"]})


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=40))
def test_weighted_median_is_one_of_the_samples_and_within_range(samples: list[float]) -> None:
    h = _hist(samples)
    est = h.estimate(0.9)
    assert est in h.samples
    assert min(h.samples) <= est <= max(h.samples)
