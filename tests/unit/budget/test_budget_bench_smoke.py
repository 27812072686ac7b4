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
