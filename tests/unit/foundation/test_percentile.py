"""The one percentile function (services.common.stats) is numpy's, bit for bit ("linear" and
"higher"); the one histogram quantile is PromQL's; nothing else computes either."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.stats import histogram_quantile, percentile

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite | st.integers(-1000, 1000), min_size=1, max_size=60),
       st.sampled_from([0.0, 1.0, 50.0, 90.0, 99.0, 100.0]) | st.floats(0.0, 100.0))
def test_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == float(np.percentile(values, q))


@settings(max_examples=300, deadline=None)
@given(st.lists(finite | st.integers(-1000, 1000), min_size=1, max_size=60),
       st.sampled_from([0.0, 1.0, 50.0, 90.0, 99.0, 100.0]) | st.floats(0.0, 100.0))
def test_higher_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q, method="higher") == float(np.percentile(values, q, method="higher"))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=2500))
def test_higher_p99_is_the_routers_demand_p99(values: list[float]) -> None:
    """The router's demand p99 (services/router/store.py) and bench/budget's ``router_p99`` are
    ``method="higher"``: the sample at ``min(n - 1, int(0.99 n))`` of the sorted values."""
    from collections import deque

    from bench.budget.sim import router_p99

    ordered = sorted(values)
    sample = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    assert percentile(values, 99, method="higher") == sample == router_p99(deque(values))


def test_histogram_quantile_like_promql() -> None:
    buckets = [(0.1, 5.0), (1.0, 10.0), (float("inf"), 10.0)]
    assert histogram_quantile(buckets, 50) == pytest.approx(0.1)
    assert histogram_quantile(buckets, 75) == pytest.approx(0.55)
    assert histogram_quantile(reversed(buckets), 75) == pytest.approx(0.55)  # any order
    assert histogram_quantile([(0.1, 0.0), (float("inf"), 4.0)], 50) == 0.1  # in +Inf: the lower edge
    assert math.isnan(histogram_quantile([(1.0, 0.0), (float("inf"), 0.0)], 50))
    assert histogram_quantile([], 50, empty=-1.0) == -1.0
    with pytest.raises(ValueError):
        histogram_quantile(buckets, 101)


def test_empty_and_bounds() -> None:
    assert percentile([], 50) == 0.0
    assert math.isnan(percentile([], 99, empty=float("nan")))
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0 and percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile(iter([1, 2, 3, 4]), 50) == 2.5
    for q in (-1.0, 100.5, float("nan")):
        with pytest.raises(ValueError):
            percentile([1.0], q)
    with pytest.raises(ValueError):
        percentile([1.0], 50, method="nearest")  # type: ignore[arg-type]


def test_no_other_percentile_implementations() -> None:
    """services/sim/ and bench/ reuse this one; string formatters named _pct are not percentiles."""
    from bench.router import bench
    from services.sim.cluster import metrics
    from services.sim.workload import stats
    from services.up import panels

    assert metrics.percentile is percentile
    assert stats.percentile is percentile
    assert bench.histogram_quantile is histogram_quantile and bench.percentile is percentile
    assert panels.histogram_quantile is histogram_quantile and not hasattr(panels, "quantile")
