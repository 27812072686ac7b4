"""`tao up`'s dashboard panels: Prometheus text in, the dashboard's numbers and PNGs out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from services.common.stats import histogram_quantile
from services.up.panels import Scrape, panels, parse, write_panels

TEXT = """# TYPE tao_router_sessions gauge
tao_router_sessions{{phase="WAITING"}} {waiting}
tao_router_sessions{{phase="RUNNING"}} 2
# TYPE tao_router_hold_seconds histogram
tao_router_hold_seconds_bucket{{le="0.1"}} {b1}
tao_router_hold_seconds_bucket{{le="1.0"}} {b2}
tao_router_hold_seconds_bucket{{le="+Inf"}} {b2}
tao_router_hold_seconds_sum {s}
tao_router_hold_seconds_count {b2}
# TYPE tao_budget_cap_slots gauge
tao_budget_cap_slots{{tenant="A"}} 8
"""


def test_quantile_interpolates_like_histogram_quantile() -> None:
    buckets = {0.1: 5.0, 1.0: 10.0, float("inf"): 10.0}.items()
    assert histogram_quantile(buckets, 50) == pytest.approx(0.1)
    assert histogram_quantile(buckets, 75) == pytest.approx(0.55)
    assert math.isnan(histogram_quantile({1.0: 0.0}.items(), 50))


def test_panels_from_scrapes_and_pngs(tmp_path: Path) -> None:
    scrapes = [Scrape(0.0, parse(TEXT.format(waiting=1, b1=0, b2=0, s=0))),
               Scrape(2.0, parse(TEXT.format(waiting=3, b1=5, b2=10, s=3.0)))]
    by_title = {p.title: p for p in panels(scrapes)}
    sessions = by_title["Sessions: admitted vs held"].lines
    assert sessions["WAITING"] == [(0.0, 1.0), (2.0, 3.0)] and sessions["RUNNING"][-1] == (2.0, 2.0)
    hold = by_title["Hold time (p50 / p99 / mean)"].lines
    assert hold["p50"] == [(2.0, pytest.approx(0.1))] and hold["mean"] == [(2.0, pytest.approx(0.3))]
    assert by_title["Caps and usage per tenant"].lines["cap A"] == [(0.0, 8.0), (2.0, 8.0)]
    pytest.importorskip("matplotlib")
    pngs = write_panels(tmp_path, scrapes, "tao")
    assert len(pngs) == 7 and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
