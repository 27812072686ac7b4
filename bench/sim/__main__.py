"""`python -m bench.sim [--quick] [--json OUT] [--jobs N]` — the paper's grid on the engine model.

Prints, per configuration, TAO against the best system baseline on mean task latency, mean
TTFT and decode throughput (and against every baseline), TAO's latency gap to the oracle,
the ablation tables, the targets (the TAO paper's maxima, docs/algorithms.md#published-figures-tao-paper)
with what was measured, the runtime and the
machine. ``--quick`` is a smoke run (three tiny points, four policies) in about a minute;
``--fast`` the 12 configurations scaled down for iteration (rule in bench/sim/grid.py, ≤ 10 min
wall with ``--jobs 2``); ``--agreement FULL.json FAST.json`` compares two grids' policy rankings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.sim.agreement import agreement_table, grid_agreement, load_grid
from bench.sim.grid import (
    FAST_POLICIES,
    GRID,
    QUICK_ABLATIONS,
    QUICK_MAX_TURNS,
    QUICK_POLICIES,
    GridPoint,
    fast_grid,
    quick_grid,
)
from bench.sim.run import point_capacity_bound, point_lower_bound, run_grid
from bench.sim.summary import (
    ablation_points,
    ablation_table,
    capacity_bound_table,
    each_baseline_table,
    grid_summary,
    headline_table,
    lower_bound_table,
)

SEED_TARGETS = {
    "wins_needed": 10,
    "max_latency_gain_pct": 26.8,
    "max_ttft_gain_pct": 36.3,
    "max_decode_gain_pct": 29.5,
    "oracle_within_5pct_on_at_least": 6,
}


def parse_scales(text: str, setups: set[str]) -> dict[str, float]:
    """``"0.5"`` (every setup) or ``"setup=0.5,other=0.25"`` -> {setup: factor}."""
    def factor(v: str) -> float:
        f = float(v)
        if not f > 0:
            raise ValueError(f"factor must be > 0, got {v}")
        return f

    text = text.strip()
    if "=" not in text:
        f = factor(text)
        return {s: f for s in setups}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in setups:
            raise ValueError(f"unknown setup {name!r}; known: {', '.join(sorted(setups))}")
        out[name] = factor(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smoke run: three tiny configurations")
    mode.add_argument("--fast", action="store_true",
                      help="the 12 configurations scaled down for iteration (<= 10 min with --jobs 2)")
    mode.add_argument("--agreement", nargs=2, metavar=("FULL_JSON", "FAST_JSON"), default=None,
                      help="compare the per-configuration policy rankings of two --json outputs and exit")
    ap.add_argument("--json", dest="json_out", default=None, help="write all results here")
    ap.add_argument("--jobs", type=int, default=1, help="simulations in parallel (processes)")
    ap.add_argument("--seed", type=int, default=0, help="workload and predictor seed")
    ap.add_argument("--checkpoint", default=None,
                    help="append each result to this JSONL as it arrives and reuse results already in it (resume)")
    ap.add_argument("--only", default=None, help="run only configurations whose key contains this")
    ap.add_argument("--policies", default=None,
                    help="comma-separated registry names: run exactly these policies instead of the "
                         "mode's list (the summary compares tao with the baselines that ran)")
    ap.add_argument("--kv-events-credit", action="store_true",
                    help="the router's cache credit from the engines' KV events (SimConfig.kv_events_credit) "
                         "instead of usage-derived, decayed credit")
    ap.add_argument("--sessions-scale", default="1.0",
                    help="multiply configurations' session counts (at least their concurrency); <1 is faster. "
                         "One factor for all, or per setup: 'glm-1xTP8=0.5,2node-2xTP4=0.5' (others stay 1)")
    args = ap.parse_args(argv)
    console = Console(width=max(Console().width, 150))
    if args.agreement:
        result = grid_agreement(load_grid(args.agreement[0]), load_grid(args.agreement[1]))
        for t in agreement_table(result):
            console.print(t)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2))
        return 0

    points: tuple[GridPoint, ...] = quick_grid() if args.quick else fast_grid() if args.fast else GRID
    max_turns = QUICK_MAX_TURNS if args.quick else None
    try:
        scales = parse_scales(args.sessions_scale, {p.setup for p in points})
    except ValueError as exc:
        print(f"--sessions-scale: {exc}", file=sys.stderr)
        return 2
    points = tuple(p if (f := scales.get(p.setup, 1.0)) == 1.0
                   else replace(p, sessions=max(p.concurrency, round(p.sessions * f))) for p in points)
    if args.only:
        points = tuple(p for p in points if args.only in p.key)
        if not points:
            print(f"no configuration matches {args.only!r}", file=sys.stderr)
            return 2

    def policies_of(p: GridPoint) -> tuple[str, ...]:
        if args.quick:
            chosen = QUICK_POLICIES + (QUICK_ABLATIONS if p.ablation else ())
        elif args.fast:
            chosen = FAST_POLICIES
        else:
            chosen = p.policies
        if args.policies:
            chosen = tuple(name for name in args.policies.split(",") if name)
        return chosen

    def on_result(r: dict[str, Any]) -> None:
        m = r["metrics"]
        console.print(f"  {r['point']:<34} {r['policy']:<17} lat {m['mean_task_latency_s']:9.1f} s  "
                      f"ttft {m['mean_ttft_s']:7.2f} s  decode {m['decode_tok_s_makespan']:8.1f} tok/s  "
                      f"[{r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU]" + ("  INCOMPLETE" if r["incomplete"] else ""))

    console.print(f"[bold]bench.sim[/bold]: {len(points)} configurations, "
                  f"{sum(len(policies_of(p)) for p in points)} simulations, jobs={args.jobs}")
    if any(f != 1.0 for f in scales.values()):
        console.print("sessions per configuration (scaled): "
                      + ", ".join(f"{p.key} {p.sessions}" for p in points))
    if args.fast:
        console.print("fast grid (sessions / concurrency / KV blocks per replica, full-length sessions): "
                      + ", ".join(f"{p.key} {p.sessions}/{p.concurrency}/{p.num_gpu_blocks}" for p in points))
    results, wall = run_grid(points, policies_of, args.seed, max_turns,
                             args.jobs, on_result, Path(args.checkpoint) if args.checkpoint else None,
                             kv_events_credit=args.kv_events_credit)
    by_point: dict[str, dict[str, Any]] = {p.key: {} for p in points}
    for r in results:
        by_point[r["point"]][r["policy"]] = r["metrics"]
    bounds: dict[str, dict[str, float | int]] = {}
    capacity: dict[str, dict[str, float | int | str]] = {}
    for p in points:  # cheap (an O(turns) pass per trace), so recomputed rather than checkpointed
        bounds[p.key] = point_lower_bound(p, args.seed, max_turns).to_json()
        capacity[p.key] = point_capacity_bound(p, args.seed, max_turns).to_json()
        lb = float(bounds[p.key]["mean_task_latency_s"])
        for m in by_point[p.key].values():
            m["latency_over_lower_bound"] = float(m["mean_task_latency_s"]) / lb if lb > 0 else 0.0
    summary = grid_summary(by_point)

    console.print(headline_table(by_point, summary))
    console.print(lower_bound_table(by_point, bounds))
    console.print(capacity_bound_table(by_point, capacity))
    console.print(each_baseline_table(summary))
    for key in ablation_points(by_point):
        ablation = ablation_table(key, by_point[key])
        if ablation is not None:
            console.print(ablation)
    mx = summary["maxima"]
    console.print(
        f"TAO beats the best system baseline on all four headline metrics in "
        f"{summary['tao_beats_best_baseline_on_all_three']}/{summary['configurations']} configurations "
        f"(target >= {SEED_TARGETS['wins_needed']} of 12)."
    )
    wpm = summary["wins_per_metric"]
    console.print("  wins per metric: " + ", ".join(f"{k} {v}/{summary['configurations']}" for k, v in wpm.items())
                  + " (issue targets: latency and TTFT >= 10 of 12, each decode figure >= 8 of 12)")
    for key, label, target in (("mean_task_latency_s", "latency", "max_latency_gain_pct"),
                               ("mean_ttft_s", "TTFT", "max_ttft_gain_pct"),
                               ("decode_tok_s_makespan", "decode throughput (makespan)", "max_decode_gain_pct"),
                               ("decode_tok_s_busy", "decode throughput (busy)", "max_decode_gain_pct")):
        if key in mx:
            console.print(f"  {label}: best gain vs best baseline {mx[key]['max_gain_vs_best_pct']:+.1f}% "
                          f"at {mx[key]['at']} (paper max {SEED_TARGETS[target]}%); worst "
                          f"{mx[key]['min_gain_vs_best_pct']:+.1f}% at {mx[key]['min_at']}")
    console.print(f"TAO latency within 5% of the oracle in {summary['within_5pct_of_oracle']}/"
                  f"{summary['configurations']} configurations (target >= half).")
    gm = summary["bounds_geomean"]
    if gm:
        console.print("Headroom, geometric mean over the configurations (latency / capacity bound · engine busy / "
                      "least work): " + ", ".join(
                          f"{name} {g.get('latency_over_capacity_bound', float('nan')):.2f} · "
                          f"{g.get('busy_over_work_bound', float('nan')):.2f}" for name, g in gm.items()))
    sim_wall = sum(r["wall_s"] for r in results)
    sim_cpu = sum(r["cpu_s"] for r in results)
    machine = {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    console.print(f"runtime: {wall:.0f} s wall for the grid ({sim_wall:.0f} s wall / {sim_cpu:.0f} s CPU of "
                  f"simulation summed over {len(results)} runs, jobs={args.jobs}); machine: {machine}")
    if args.json_out:
        doc = {
            "quick": args.quick, "fast": args.fast, "max_turns": max_turns, "seed": args.seed, "jobs": args.jobs, "sessions_scale": scales, "kv_events_credit": args.kv_events_credit,
            "runtime_s": wall,
            "simulation_s_summed": sim_wall, "simulation_cpu_s_summed": sim_cpu, "machine": machine, "targets": SEED_TARGETS,
            "configurations": [
                {"key": p.key, "setup": p.setup, "profile": p.profile.name, "replicas": p.replicas,
                 "workload": p.kind, "sessions": p.sessions, "concurrency": p.concurrency,
                 "num_gpu_blocks": p.num_gpu_blocks,
                 "lower_bound": bounds[p.key],
                 "capacity_bound": capacity[p.key],
                 "policies": by_point[p.key],
                 "runs": {r["policy"]: {k: r[k] for k in ("wall_s", "cpu_s", "sim_end_s", "plans", "counters",
                                                          "incomplete")}
                          for r in results if r["point"] == p.key}}
                for p in points
            ],
            "summary": summary,
        }
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    return 0 if all(not r["incomplete"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
