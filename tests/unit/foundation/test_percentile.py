"""The one percentile function (services.common.stats) is numpy's linear interpolation, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.stats import percentile

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite | st.integers(-1000, 1000), min_size=1, max_size=60),
       st.sampled_from([0.0, 1.0, 50.0, 90.0, 99.0, 100.0]) | st.floats(0.0, 100.0))
def test_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == float(np.percentile(values, q))


def test_empty_and_bounds() -> None:
    assert percentile([], 50) == 0.0
    assert math.isnan(percentile([], 99, empty=float("nan")))
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0 and percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile(iter([1, 2, 3, 4]), 50) == 2.5
    for q in (-1.0, 100.5, float("nan")):
        with pytest.raises(ValueError):
            percentile([1.0], q)


def test_no_other_percentile_implementations() -> None:
    """sim/ and bench/ reuse this one; string formatters named _pct are not percentiles."""
    import sim.cluster.metrics
    import sim.workload.stats

    assert sim.cluster.metrics.percentile is percentile
    assert sim.workload.stats.percentile is percentile
