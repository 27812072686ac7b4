"""Smoke test of `tao bench budget` on tiny windows: it runs end to end through the CLI, the
JSON has the documented shape, and the simulation (the router's core and the budget core on
the engine model) keeps the budget invariants at every tick."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.budget import cli
from bench.budget.sim import run_policy
from bench.budget.workload import SEED, Scenario


def test_bench_cli_quick_writes_the_documented_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Scenario, "quick", lambda self: replace(self, warmup_s=2.0, measure_s=8.0))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "budget.json"
    assert cli.run(parser.parse_args(["--quick", "--json", str(out)])) == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"static", "dynamic-v0", "dynamic"}
    for agg in doc["policies"].values():
        for key in ("total_tokens_per_s", "per_tenant_tokens_per_s", "completed_requests", "p99_latency_s",
                    "final_caps", "requests_per_s", "mean_kv_usage", "moves_to", "holds", "per_tenant_mean_wait_s"):
            assert key in agg, key
        assert sum(agg["final_caps"].values()) == SEED.total_slots
        assert agg["total_tokens_per_s"] > 0 and agg["completed_requests"] > 0
    assert doc["policies"]["static"]["final_caps"] == {"A": 48, "B": 48}
    assert doc["machine"]["cpu_count"] >= 1 and doc["seed_reference"]["dynamic"]["final_caps"] == {"A": 4, "B": 92}
    assert doc["ratios_vs_static"]["dynamic"]["total_tokens_per_s"] > 0
    assert doc["policies"]["dynamic"]["max_in_flight"] <= SEED.total_slots, "the budget was exceeded"


def test_sim_drives_the_router_core_and_keeps_invariants_every_tick() -> None:
    from services.budget.core import Allocation, DynamicParams, make_policy
    from services.router.core.state import RouterCore

    scenario = replace(SEED, warmup_s=2.0, measure_s=20.0)
    seen: list[int] = []

    def check(alloc: Allocation, core: RouterCore) -> None:
        assert sum(alloc.caps.values()) == sum(alloc.limits.values()) == scenario.total_slots
        assert core.caps == dict(alloc.caps) and core.limits == dict(alloc.limits)
        assert sum(core.tenant_in_flight.values()) <= scenario.total_slots
        seen.append(alloc.revision)

    run = run_policy(scenario, "dynamic", make_policy("dynamic", DynamicParams()), 7, check=check)
    assert seen == list(range(1, len(seen) + 1)) and len(seen) == 11
    assert run.max_in_flight <= scenario.total_slots and run.completed_requests > 0
    assert run.trace[0].at_s == 0.0 and run.trace[-1].caps == run.final_caps


def test_the_foresight_reference_lends_only_where_a_whole_horizon_is_left_before_the_next_burst() -> None:
    """``bench/budget/foresight.py``: told the ON windows the workload drew, it lends the bursty
    tenant's slots at a tick only outside its windows, with nothing of it held or in flight, and
    with one tick plus the horizon left before its next window; Σ caps = B at every tick."""
    from bench.budget.foresight import ForesightPolicy
    from services.budget.core import Allocation
    from services.router.core.state import RouterCore

    scenario = replace(SEED, warmup_s=2.0, measure_s=60.0)
    policy = ForesightPolicy(horizon_s=4.0, tick_s=scenario.tick_s)
    lent_at: list[float] = []

    def check(alloc: Allocation, core: RouterCore) -> None:
        assert sum(alloc.caps.values()) == sum(alloc.limits.values()) == scenario.total_slots
        if alloc.targets["A"] < 48:
            now = alloc.computed_at_s
            windows = policy.windows["A"]
            assert not any(a <= now < b for a, b in windows)
            assert min(a for a, _ in windows if a > now) >= now + scenario.tick_s + 4.0
            assert alloc.targets == {"A": 4, "B": 92}
            lent_at.append(now)

    run = run_policy(scenario, "foresight", policy, 101, check=check)
    assert policy.windows["A"] and lent_at, "no gap was lent in a minute of 8 s bursts and 12 s gaps"
    assert run.max_in_flight <= scenario.total_slots
    assert ForesightPolicy(0.0).lends("A", 0.0, 0, 0.0) is False  # nothing foreseen: nothing lent
    policy_b = ForesightPolicy(horizon_s=4.0, tick_s=2.0)
    policy_b.foresee({"A": [(10.0, 18.0), (30.0, 38.0)]})
    # t + 2 + 4 <= the next start; 38: the last window has ended and none follows
    assert [t for t in range(0, 40, 2) if policy_b.lends("A", float(t), 0, 4.0)] == [0, 2, 4, 18, 20, 22, 24, 38]
    assert not policy_b.lends("A", 20.0, 1, 4.0)
    # horizon None: the borrowers' reported hold; a 17 s hold never fits a 12 s gap
    long_hold = replace(SEED, tenants=(SEED.tenants[0], replace(SEED.tenants[1], output_tokens=2048)),
                        warmup_s=2.0, measure_s=60.0)
    never: list[int] = []
    run_policy(long_hold, "foresight", ForesightPolicy(None), 101,
               check=lambda alloc, core: never.append(alloc.targets["A"]) if alloc.computed_at_s > 30 else None)
    assert never and set(never) == {48}


def test_the_workload_schedule_draws_the_arrivals_inside_its_on_windows() -> None:
    import random

    from bench.budget.workload import CHAT_A

    arrivals, windows = CHAT_A.schedule(100.0, random.Random(5))
    assert arrivals == CHAT_A.arrivals(100.0, random.Random(5))
    assert all(any(a <= t < b for a, b in windows) for t in arrivals)
    assert windows[-1][0] >= 100.0 and all(b - a == CHAT_A.on_s for a, b in windows)
