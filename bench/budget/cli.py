"""`tao bench budget [--json OUT] [--quick] [--live]`: static vs dynamic tenant budget on the engine model.

Runs the budget-controller study's scenario (the ``seed`` case; B = 96, bursty chat A vs saturating batch B on qwen2.5-3b-h200,
90 s of steady state, static {A:48, B:48} vs dynamic) in virtual time with the budget core
the service runs, then a third-tenant case and an SLO-violating case. Prints ratios against
the static baseline measured in the same run and the study's real-H200 figures for reference
(docs/algorithms.md#published-figures-budget-controller-study).
``--sweep`` adds the controller-parameter sensitivity on that scenario.
``--foresight`` adds, to every case, a reference that knows every burst in advance
(``bench/budget/foresight.py``) at several lending horizons.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.budget.report import (
    SEED_REFERENCE,
    TARGET_GAIN,
    foresight_specs,
    foresight_verdict,
    machine,
    render,
    run_scenario,
)
from bench.budget.workload import SCENARIOS, STATIC_VS_DYNAMIC, Scenario
from services.budget.core import DynamicParams

#: one controller parameter changed from its default at a time (seed case)
SWEEP: tuple[dict[str, Any], ...] = ({"lend_horizon_s": 4.0}, {"lend_horizon_s": 7.0}, {"step_frac": 0.5},
                                     {"burst_reserve_frac": 0.75}, {"lend_frac": 0.5}, {"reserve_z": 0.0},
                                     {"reserve_z": 2.33})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write all results as JSON")
    parser.add_argument("--quick", action="store_true", help="30 s windows, one seed, no extra cases (smoke)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per policy (default 3; --quick: 1)")
    parser.add_argument("--first-seed", type=int, default=101, help="first workload seed")
    parser.add_argument("--cases", default=None,
                        help=f"comma-separated scenarios (default: all; --quick: seed); from {', '.join(SCENARIOS)}")
    parser.add_argument("--live", action="store_true",
                        help="run the seed case on the real stack (services + emulated replica) instead")
    parser.add_argument("--live-seconds", type=float, default=50.0,
                        help="--live: model seconds measured per policy after the 10 s warm-up")
    parser.add_argument("--live-time-scale", type=float, default=1.0,
                        help="--live: model seconds per wall second of the stack")
    parser.add_argument("--sweep", action="store_true",
                        help="also run the seed case with one controller parameter changed at a time")
    parser.add_argument("--foresight", action="store_true",
                        help="also run every case under the foresight reference (it knows when every burst "
                             "starts; bench/budget/foresight.py) at several lending horizons")


def _verdict(result: dict[str, Any]) -> list[str]:
    """The issue-19 targets: seed case >= +14 % throughput with no tenant's p99 worse than
    static; adversarial case no tenant's p99 worse than static by more than 5 %."""
    r = result["ratios_vs_static"]["dynamic"]
    gain = r["total_tokens_per_s"] - 1
    worst = max(r["per_tenant_p99_latency_s"].items(), key=lambda kv: kv[1])
    lines = []
    if result["scenario"] == "seed":
        ref_gain = SEED_REFERENCE["dynamic"]["total_tokens_per_s"] / SEED_REFERENCE["static"]["total_tokens_per_s"] - 1
        ref_p99 = SEED_REFERENCE["dynamic"]["p99_latency_s"] / SEED_REFERENCE["static"]["p99_latency_s"]
        lines.append(f"   budget study (real H200): {SEED_REFERENCE['static']['total_tokens_per_s']:,.0f} -> "
                     f"{SEED_REFERENCE['dynamic']['total_tokens_per_s']:,.0f} tok/s ({100 * ref_gain:+.1f} %), "
                     f"p99 x{ref_p99:.3f}, final caps {SEED_REFERENCE['dynamic']['final_caps']}, "
                     f"moves to A/B 15/19, holds 11")
        ok_gain, ok_p99 = gain >= TARGET_GAIN, worst[1] <= 1.0
        head = f"target (>= +{100 * TARGET_GAIN:.0f} % throughput, no tenant's p99 worse)"
    elif result["scenario"] == "adversarial":
        ok_gain, ok_p99 = True, worst[1] <= 1.05
        head = "target (no tenant's p99 worse than static by more than 5 %)"
    else:
        return lines
    parts = [f"throughput {100 * gain:+.1f} %", f"worst p99 {worst[0]} {100 * (worst[1] - 1):+.1f} %"]
    verdict = "MET" if ok_gain and ok_p99 else "MISSED"
    lines.append(f"   {head}: {verdict} ({'; '.join(parts)})")
    return lines


def run(args: argparse.Namespace) -> int:
    seeds_n = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    if seeds_n < 1:
        print("tao bench budget: --seeds must be >= 1", file=sys.stderr)
        return 2
    names = args.cases.split(",") if args.cases else (["seed"] if args.quick else list(SCENARIOS))
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or "seed" not in names:
        print(f"tao bench budget: cases must include 'seed' and come from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    seeds = list(range(args.first_seed, args.first_seed + seeds_n))
    if args.live:
        return _run_live(args, seeds[0])
    params = DynamicParams()
    info = machine()
    print(f"machine: cpus={info['cpu_count']} python={info['python']} platform={info['platform']}")
    print(f"dynamic controller: {asdict(params)}")
    started = time.perf_counter()

    def scenario(name: str, foresight: bool = args.foresight) -> Scenario:
        sc = SCENARIOS[name]
        if foresight:
            sc = replace(sc, policies=sc.policies + foresight_specs())
        return sc.quick() if args.quick else sc

    results: dict[str, Any] = {}
    for name in names:
        res = run_scenario(scenario(name), seeds, params)
        results[name] = res
        for line in render(res) + _verdict(res) + foresight_verdict(res):
            print(line)
        print()
    sweep: list[dict[str, Any]] = []
    if args.sweep:
        print("== sensitivity (seed case: the study's scenario): one parameter changed from the defaults")
        for change in SWEEP:
            p = replace(params, **change)
            res = run_scenario(replace(scenario("seed", foresight=False),
                                       policies=(STATIC_VS_DYNAMIC[0], STATIC_VS_DYNAMIC[2])), seeds, p)
            r = res["ratios_vs_static"]["dynamic"]
            dyn = res["policies"]["dynamic"]
            sweep.append({"change": change, "ratios_vs_static": r,
                          "p99_A_s": dyn["per_tenant_p99_latency_s"]["A"], "p99_B_s": dyn["per_tenant_p99_latency_s"]["B"]})
            label = ", ".join(f"{k} {v:g}" for k, v in change.items())
            per = ", ".join(f"{n} {100 * (v - 1):+.1f} %" for n, v in r["per_tenant_p99_latency_s"].items())
            print(f"   {label:24}: throughput {100 * (r['total_tokens_per_s'] - 1):+5.1f} %, p99 per tenant {per} "
                  f"(A {dyn['per_tenant_p99_latency_s']['A']:.2f} s, B {dyn['per_tenant_p99_latency_s']['B']:.2f} s)")
    elapsed = time.perf_counter() - started
    print(f"wall time {elapsed:.1f} s")
    seed_res = results["seed"]
    doc = {
        "benchmark": "budget", "machine": info, "quick": bool(args.quick), "seeds": seeds,
        "dynamic_params": asdict(params), "wall_s": elapsed,
        "scenario": seed_res["scenario"], "description": seed_res["description"], "workload": seed_res["workload"],
        "policies": seed_res["policies"], "ratios_vs_static": seed_res["ratios_vs_static"],
        "seed_reference": SEED_REFERENCE, "target": {"throughput_gain_min": TARGET_GAIN, "per_tenant_p99_no_worse": True,
                   "adversarial_per_tenant_p99_max_ratio": 1.05},
        "cases": {k: v for k, v in results.items() if k != "seed"}, "sweep": sweep,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False))
        print(f"wrote {args.json}")
    return 0


def _run_live(args: argparse.Namespace, seed: int) -> int:
    from bench.budget.live import render_live, run_live

    res = run_live(SCENARIOS["seed"], args.live_seconds, args.live_time_scale, seed)
    for line in render_live(res):
        print(line)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_clean({"benchmark": "budget-live", "machine": machine(), **res}), indent=2,
                                        allow_nan=False))
        print(f"wrote {args.json}")
    return 1 if res.get("failed_children") else 0


def _clean(value: Any) -> Any:
    """NaN (no sample) becomes null; tuples become lists."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
