"""`tao sim run --trace F --replicas N --profile P --policies a,b,… [--concurrency C] [--seed S]
[--json OUT] [--plots DIR]` — the discrete-event comparison of placement policies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from services.common.extras import require
from services.planner.core.registry import POLICIES
from services.sim.cluster import oracle as _oracle  # noqa: F401  (registers "oracle")
from services.sim.cluster.metrics import time_series
from services.sim.cluster.report import print_report
from services.sim.cluster.runner import PolicyOutcome, compare
from services.sim.cluster.simulator import SimConfig, SimulationError
from services.sim.engine import PROFILES
from services.sim.workload.trace import TraceError, load_trace

DEFAULT_POLICIES = "tao,thunderagent,cache_aware,least_loaded,round_robin"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="workload trace (JSONL, docs/architecture.md#trace-format)")
    parser.add_argument("--replicas", type=int, default=4, help="number of engine replicas (default 4)")
    parser.add_argument("--profile", default="qwen3-32b-h100x2",
                        help=f"engine profile, one of: {', '.join(sorted(PROFILES))}")
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"comma-separated policy names (default {DEFAULT_POLICIES})")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="closed loop: at most this many sessions active at once (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the predictor's exploration (default 0)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the results JSON here")
    parser.add_argument("--plots", default=None, help="write latency/throughput/hit-rate PNGs into this folder")
    parser.add_argument("--tick-s", type=float, default=1.0, help="planner periodic tick (default 1 s)")
    parser.add_argument("--debounce-s", type=float, default=0.05, help="planner debounce on pool changes")
    parser.add_argument("--plan-latency-s", type=float, default=0.01, help="plan publish-to-apply delay")
    parser.add_argument("--num-gpu-blocks", type=int, default=None, help="override KV blocks per replica")
    parser.add_argument("--utilisation-target", type=float, default=0.95, help="admissible share of KV (0.95)")
    parser.add_argument("--no-pause-revalidation", action="store_true",
                        help="apply every pause a plan asks for, as the router core does today (see simulator.py)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def _fail(msg: str) -> int:
    print(f"tao sim run: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        return _fail("--policies is empty")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        return _fail(f"unknown policies {', '.join(unknown)}; registered: {', '.join(sorted(POLICIES))}")
    if len(set(policies)) != len(policies):
        return _fail("--policies lists a policy twice")
    if args.profile not in PROFILES:
        return _fail(f"unknown profile {args.profile!r}; known: {', '.join(sorted(PROFILES))}")
    try:
        cfg = SimConfig(
            replicas=args.replicas, profile=args.profile, concurrency=args.concurrency, seed=args.seed,
            utilisation_target=args.utilisation_target, tick_s=args.tick_s, debounce_s=args.debounce_s,
            plan_latency_s=args.plan_latency_s, num_gpu_blocks=args.num_gpu_blocks,
            pause_revalidation=not args.no_pause_revalidation,
        )
    except ValueError as exc:
        return _fail(str(exc))
    try:
        sessions = load_trace(args.trace)
    except TraceError as exc:
        return _fail(str(exc))
    require("report", "the result tables and --plots")
    from rich.console import Console

    console = Console(stderr=True)

    def progress(o: PolicyOutcome) -> None:
        if not args.quiet:
            m = o.metrics
            console.print(
                f"[bold]{o.name}[/bold]: {m['completed_sessions']}/{len(sessions)} sessions, "
                f"simulated {o.run.sim_end_s:.0f} s in {o.wall_s:.1f} s wall ({o.cpu_s:.1f} s CPU), "
                f"{o.run.plans} plans"
                + (f", {len(o.run.failed)} ended by vLLM's 400 (past max_model_len)" if o.run.failed else "")
                + ("  [red]INCOMPLETE[/red]" if o.run.incomplete else "")
            )

    try:
        doc, outcomes = compare(sessions, policies, cfg, trace_name=str(args.trace), progress=progress)
    except SimulationError as exc:
        return _fail(str(exc))
    print_report(doc["policies"], Console(width=max(Console().width, 160)), lower_bound=doc.get("lower_bound"),
                 capacity_bound=doc.get("capacity_bound"))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    if args.plots:
        from services.sim.cluster.plots import write_plots

        paths = write_plots(
            args.plots,
            {o.name: o.run.sessions for o in outcomes},
            {o.name: time_series(o.run.requests) for o in outcomes},
            title=f"({Path(args.trace).name}, {args.replicas}x {args.profile})",
        )
        if not args.quiet:
            console.print("plots: " + ", ".join(str(p) for p in paths))
    return 0 if all(not o.run.incomplete for o in outcomes) else 1
