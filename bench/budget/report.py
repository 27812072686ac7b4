"""Run scenarios over several seeds, aggregate, and render the comparison (text and JSON)."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from bench.budget.foresight import ForesightPolicy
from bench.budget.sim import PolicyRun, run_policy
from bench.budget.workload import PolicySpec, Scenario
from services.budget.core import BudgetPolicy, DynamicParams, make_policy

FORESIGHT = "foresight"
"""``PolicySpec.registry`` of the foresight reference (not in the service's registry)."""
FORESIGHT_HORIZONS_S = (0.0, 2.0, 3.0, 4.0, 6.0)
"""``--foresight``: lending horizons, from lending up to the burst to past the borrowers' ~5.4 s slot hold."""

#: the budget-controller study, real H200: static vs dynamic (tokens/s, completed requests over 90 s, p99 s)
SEED_REFERENCE: dict[str, dict[str, Any]] = {
    "static": {"total_tokens_per_s": 9894.0, "per_tenant_tokens_per_s": {"B": 6557.0},
               "completed_requests": 9063, "requests_per_s": 96.7, "p99_latency_s": 4.15,
               "final_caps": {"A": 48, "B": 48}},
    "dynamic": {"total_tokens_per_s": 11274.0, "per_tenant_tokens_per_s": {"B": 7736.0},
                "completed_requests": 9811, "requests_per_s": 104.0, "p99_latency_s": 4.08,
                "final_caps": {"A": 4, "B": 92}, "moves_to": {"A": 15, "B": 19}, "holds": 11},
}
TARGET_GAIN = 0.14

_SCALARS = ("total_tokens_per_s", "completed_requests", "requests_per_s", "p99_latency_s", "mean_kv_usage",
            "engine_busy_frac", "holds", "ticks", "preemptions", "max_in_flight")
_MAPS = ("per_tenant_tokens_per_s", "per_tenant_completed", "per_tenant_p99_latency_s", "per_tenant_mean_latency_s",
         "per_tenant_mean_wait_s", "moves_to", "mean_caps")


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def aggregate(runs: Sequence[PolicyRun]) -> dict[str, Any]:
    """Means over seeds; final caps and the caps timeline of the first seed, all seeds' raw runs."""
    out: dict[str, Any] = {k: _mean([float(getattr(r, k)) for r in runs]) for k in _SCALARS}
    for k in _MAPS:
        keys = sorted({n for r in runs for n in getattr(r, k)})
        out[k] = {n: _mean([float(getattr(r, k).get(n, math.nan)) for r in runs]) for n in keys}
    out["final_caps"] = runs[0].final_caps
    out["final_caps_by_seed"] = [r.final_caps for r in runs]
    out["caps_timeline"] = runs[0].caps_timeline
    out["sim_wall_s"] = sum(r.wall_s for r in runs)
    out["runs"] = [{k: v for k, v in asdict(r).items() if k not in ("caps_timeline", "trace")} for r in runs]
    return out


def _policy(spec: PolicySpec, params: DynamicParams, tick_s: float) -> BudgetPolicy | ForesightPolicy:
    """A fresh policy for one run: a registered one with the spec's parameter overrides, or the
    foresight reference (``bench/budget/foresight.py``; its overrides are its own arguments)."""
    if spec.registry == FORESIGHT:
        return ForesightPolicy(tick_s=tick_s, **dict(spec.overrides))
    return make_policy(spec.registry, replace(params, **dict(spec.overrides)))


def foresight_specs(horizons: Sequence[float] = FORESIGHT_HORIZONS_S) -> tuple[PolicySpec, ...]:
    """The foresight reference at each lending horizon, and at the borrowers' reported slot hold
    (``--foresight``)."""
    return (tuple(PolicySpec(f"foresight {h:g} s", FORESIGHT, (("horizon_s", float(h)),)) for h in horizons)
            + (PolicySpec("foresight hold", FORESIGHT, (("horizon_s", None),)),))


def foresight_verdict(result: dict[str, Any]) -> list[str]:
    """The foresight rows against the issue-19 rule: the highest throughput among the horizons
    whose every tenant's p99 is no worse than static's, and the highest at any horizon."""
    rows = {label: r for label, r in result["ratios_vs_static"].items() if label.startswith("foresight")}
    if not rows:
        return []

    def gain(label: str) -> float:
        return float(rows[label]["total_tokens_per_s"]) - 1

    def worst(label: str) -> tuple[str, float]:
        name, ratio = max(rows[label]["per_tenant_p99_latency_s"].items(), key=lambda kv: kv[1])
        return name, float(ratio) - 1

    def describe(label: str) -> str:
        name, w = worst(label)
        return f"{label}: throughput {100 * gain(label):+.1f} %, worst p99 {name} {100 * w:+.1f} %"

    top = max(rows, key=gain)
    kept = [label for label in rows if worst(label)[1] <= 0.0]
    best = max(kept, key=gain) if kept else None
    return [f"   foresight (knows every burst; a reference, not a policy): highest throughput {describe(top)}; "
            + (f"highest with no tenant's p99 worse than static {describe(best)}" if best is not None
               else "no horizon keeps every tenant's p99 at or below static")]


def run_scenario(scenario: Scenario, seeds: Sequence[int], params: DynamicParams,
                 progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for spec in scenario.policies:
        runs = []
        for seed in seeds:
            runs.append(run_policy(scenario, spec.label, _policy(spec, params, scenario.tick_s), seed))
            progress(f"{scenario.name}/{spec.label} seed {seed}: {runs[-1].total_tokens_per_s:,.0f} tok/s")
        policies[spec.label] = aggregate(runs)
    base = policies["static"]
    ratios = {
        label: {"total_tokens_per_s": agg["total_tokens_per_s"] / base["total_tokens_per_s"],
                "p99_latency_s": agg["p99_latency_s"] / base["p99_latency_s"],
                "per_tenant_p99_latency_s": {n: v / base["per_tenant_p99_latency_s"][n]
                                             for n, v in agg["per_tenant_p99_latency_s"].items()}}
        for label, agg in policies.items() if label != "static"
    }
    return {
        "scenario": scenario.name, "description": scenario.description,
        "workload": [t.describe() for t in scenario.tenants],
        "total_slots": scenario.total_slots, "profile": scenario.profile, "tick_s": scenario.tick_s,
        "warmup_s": scenario.warmup_s, "measure_s": scenario.measure_s, "seeds": list(seeds),
        "policies": policies, "ratios_vs_static": ratios,
    }


def machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def _fmt_map(values: dict[str, float], digits: int = 0) -> str:
    return " ".join(f"{k}:{v:,.{digits}f}" for k, v in values.items())


def render(result: dict[str, Any]) -> list[str]:
    lines = [f"== {result['scenario']}: {result['description']}",
             f"   B = {result['total_slots']}, profile {result['profile']}, tick {result['tick_s']:g} s, "
             f"{result['measure_s']:g} s measured after {result['warmup_s']:g} s warm-up, seeds {result['seeds']}"]
    lines += [f"   {w}" for w in result["workload"]]
    head = (f"   {'policy':18} {'tok/s':>8} {'per tenant tok/s':>26} {'done':>6} {'req/s':>6} {'p99 s':>6} "
            f"{'p99 per tenant s':>22} {'mean wait per tenant s':>24} {'KV %':>5} {'max in':>6} {'mean caps':>18} "
            f"{'final caps':>18} {'moves to':>12} {'holds':>5}")
    lines.append(head)
    for label, agg in result["policies"].items():
        caps = ",".join(f"{k}:{v}" for k, v in agg["final_caps"].items())
        moves = ",".join(f"{k}:{v:.0f}" for k, v in agg["moves_to"].items())
        mean_caps = ",".join(f"{k}:{v:.0f}" for k, v in agg["mean_caps"].items())
        lines.append(
            f"   {label:18} {agg['total_tokens_per_s']:8,.0f} {_fmt_map(agg['per_tenant_tokens_per_s']):>26} "
            f"{agg['completed_requests']:6.0f} {agg['requests_per_s']:6.1f} {agg['p99_latency_s']:6.2f} "
            f"{_fmt_map(agg['per_tenant_p99_latency_s'], 2):>22} {_fmt_map(agg['per_tenant_mean_wait_s'], 2):>24} "
            f"{100 * agg['mean_kv_usage']:5.1f} "
            f"{agg['max_in_flight']:6.0f} {mean_caps:>18} {caps:>18} {moves:>12} {agg['holds']:5.0f}")
    for label, r in result["ratios_vs_static"].items():
        per = ", ".join(f"{n} {100 * (v - 1):+.1f} %" for n, v in r["per_tenant_p99_latency_s"].items())
        lines.append(f"   {label} / static: throughput x{r['total_tokens_per_s']:.3f} "
                     f"({100 * (r['total_tokens_per_s'] - 1):+.1f} %), p99 x{r['p99_latency_s']:.3f} "
                     f"({100 * (r['p99_latency_s'] - 1):+.1f} %); p99 per tenant {per}")
    return lines
