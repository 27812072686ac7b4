"""`python -m bench.agreement` — the same trace through the simulator and the live stack.

For each policy: `tao sim run` in process (the engine model, the same policy code), then a
fresh live stack (embedded Redis, emulated vLLM replicas at ``--time-scale``, the four
services with that policy) driven by the `tao bench e2e` driver with real tool events to the
predictor. Prints both results, the per-metric gap (e2e − sim) / sim, each world's ranking of
the policies with Kendall's tau, and every pair the two worlds order differently with how
far apart that pair is in each. ``--json OUT`` writes all of it.

The oracle is simulator-only (it reads the future) and is not accepted here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.agreement.compare import COMPARED, agree, mean_metrics, spread_pct, to_json
from services.driver.driver import DriverConfig, TraceDriver
from services.driver.reporter_adapter import ReporterToolEvents
from services.driver.results import measure
from services.planner.core.registry import POLICIES
from services.sim.cluster.oracle import SIM_ONLY
from services.sim.cluster.runner import compare as sim_compare
from services.sim.cluster.simulator import SimConfig
from services.sim.engine import PROFILES
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.params import KINDS
from services.sim.workload.trace import TraceSession, write_trace
from services.up.stack import Stack, StackConfig

DEFAULT_POLICIES = "tao,thunderagent,cache_aware,least_loaded,round_robin"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", default="swe-lite", choices=sorted(KINDS), help="workload kind (default swe-lite)")
    ap.add_argument("--sessions", type=int, default=24, help="sessions in the trace (default 24)")
    ap.add_argument("--seed", type=int, default=0, help="workload and predictor seed")
    ap.add_argument("--concurrency", type=int, default=16, help="closed loop: sessions active at once")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--profile", default="qwen3-32b-h100x2", help="engine profile of every replica")
    ap.add_argument("--num-gpu-blocks", type=int, default=8000,
                    help="KV blocks per replica (default 8000: a cache the trace contends for)")
    ap.add_argument("--time-scale", type=float, default=10.0,
                    help="live stack: model seconds per wall second (lower = less CPU noise, slower)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated (default {DEFAULT_POLICIES})")
    ap.add_argument("--repeat", type=int, default=1,
                    help="live runs per policy (rounds over all policies); metrics are averaged and their "
                         "spread marks discordant pairs that are within live noise")
    ap.add_argument("--json", dest="json_out", type=Path, default=None, help="write everything here")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep the live stacks' logs here")
    args = ap.parse_args(argv)
    args.policy_list = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in args.policy_list if p not in POLICIES or p in SIM_ONLY]
    if bad:
        ap.error(f"not runnable live: {', '.join(bad)} (registered: {', '.join(sorted(POLICIES))}; "
                 f"{', '.join(SIM_ONLY)} are sim-only)")
    if len(args.policy_list) < 2 or len(set(args.policy_list)) != len(args.policy_list):
        ap.error("--policies needs at least two distinct policies")
    if args.profile not in PROFILES:
        ap.error(f"unknown profile {args.profile!r}; known: {', '.join(sorted(PROFILES))}")
    for name in ("sessions", "concurrency", "replicas", "num_gpu_blocks", "repeat"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if args.time_scale <= 0:
        ap.error("--time-scale must be > 0")
    return args


async def _drive(stack_addrs: Any, sessions: list[TraceSession], args: argparse.Namespace) -> dict[str, Any]:
    tools = ReporterToolEvents(stack_addrs.predictor, time_scale=args.time_scale)
    config = DriverConfig(base_url=stack_addrs.router_url, time_scale=args.time_scale,
                          concurrency=args.concurrency, tenant_header="x-tao-tenant")
    return await measure(TraceDriver(config, tools), sessions, stack_addrs.replicas)


def _busy(m: dict[str, Any]) -> str:
    v = m.get("decode_tok_s_busy")
    return "n/a" if v is None else f"{float(v):7.1f} tok/s"


def run_live(sessions: list[TraceSession], policy: str, args: argparse.Namespace, log_dir: Path,
             console: Console) -> dict[str, Any]:
    tenants = tuple(sorted({s.tenant for s in sessions}))
    cfg = StackConfig(replicas=args.replicas, profile=args.profile, policy=policy, time_scale=args.time_scale,
                      num_gpu_blocks=args.num_gpu_blocks, total_budget=max(64, 2 * args.concurrency),
                      tenants=tenants, log_dir=log_dir)
    stack = Stack(cfg)
    try:
        t0 = time.monotonic()
        addrs = stack.start()
        metrics = asyncio.run(_drive(addrs, sessions, args))
        console.print(f"  live {policy:<14} lat {metrics['mean_task_latency_s']:8.1f} s  "
                      f"ttft {metrics['mean_ttft_s']:6.2f} s  decode {metrics['decode_tok_s_makespan']:7.1f} tok/s makespan, "
                      f"{_busy(metrics)} busy  "
                      f"errors {metrics['errors']}  [{time.monotonic() - t0:.0f} s wall]")
        dead = stack.failed()
        if dead:
            raise RuntimeError(f"a process died during the {policy} run: {dead}")
        return metrics
    finally:
        stack.stop()


def _fmt(metric: str, v: float | None) -> str:
    if v is None:
        return "—"
    if metric == "prefix_hit_rate":
        return f"{100 * v:.1f}%"
    return f"{v:.4g}"


def tables(sim: dict[str, Any], live: dict[str, Any], agreement: list[Any]) -> list[Table]:
    policies = list(sim)
    t = Table(title="simulator vs live stack (model seconds; gap = (live − sim) / sim)")
    t.add_column("metric")
    for p in policies:
        t.add_column(f"{p} sim", justify="right")
        t.add_column(f"{p} live", justify="right")
        t.add_column("gap", justify="right")
    for a in agreement:
        row = [a.metric]
        for p in policies:
            g = a.gaps_pct[p]
            row += [_fmt(a.metric, sim[p][a.metric]), _fmt(a.metric, live[p][a.metric]),
                    "—" if g is None else f"{g:+.1f}%"]
        t.add_row(*row)
    o = Table(title="policy ranking, best first (Kendall tau: 1 = same order)")
    for col in ("metric", "simulator", "live stack", "tau", "same winner", "discordant pairs (sim gap / live gap)"):
        o.add_column(col)
    for a in agreement:
        disc = "; ".join(f"{d.first}>{d.second} ({d.sim_gap_pct:+.1f}% / {d.e2e_gap_pct:+.1f}%"
                         f"{', within live noise' if d.within_noise else ''})"
                         for d in a.discords) or "none"
        o.add_row(a.metric, " > ".join(a.sim_order), " > ".join(a.e2e_order), f"{a.tau:+.2f}",
                  "yes" if a.same_winner else "NO", disc)
    return [t, o]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(width=max(Console().width, 160))
    sessions = generate(GenerateOptions(kind=args.kind, sessions=args.sessions, seed=args.seed))
    log_root = args.log_dir or Path(tempfile.mkdtemp(prefix="tao-agreement-"))
    log_root.mkdir(parents=True, exist_ok=True)
    write_trace(sessions, log_root / "trace.jsonl")
    console.print(f"[bold]bench.agreement[/]: {args.kind}, {len(sessions)} sessions (concurrency "
                  f"{args.concurrency}), {args.replicas} × {args.profile}, {args.num_gpu_blocks} KV blocks each, "
                  f"live at time scale {args.time_scale}; logs and trace in {log_root}")
    cfg = SimConfig(replicas=args.replicas, profile=args.profile, concurrency=args.concurrency, seed=args.seed,
                    num_gpu_blocks=args.num_gpu_blocks)
    t0 = time.monotonic()
    sim_doc, outcomes = sim_compare(sessions, args.policy_list, cfg, trace_name=str(log_root / "trace.jsonl"))
    for o in outcomes:
        m = o.metrics
        console.print(f"  sim  {o.name:<14} lat {m['mean_task_latency_s']:8.1f} s  ttft {m['mean_ttft_s']:6.2f} s  "
                      f"decode {m['decode_tok_s_makespan']:7.1f} tok/s makespan, {_busy(m)} busy  [{o.wall_s:.1f} s wall]")
    sim_wall = time.monotonic() - t0
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policy_list}
    t1 = time.monotonic()
    try:
        for k in range(args.repeat):  # rounds over all policies: slow drift hits every policy alike
            for policy in args.policy_list:
                log_dir = log_root / (policy if args.repeat == 1 else f"{policy}-{k + 1}")
                runs[policy].append(run_live(sessions, policy, args, log_dir, console))
    except (RuntimeError, OSError) as exc:
        print(f"bench.agreement: {exc}", file=sys.stderr)
        return 1
    live_wall = time.monotonic() - t1
    live = {p: mean_metrics(r) for p, r in runs.items()}
    noise = {p: {m: spread_pct(r, m) for m in COMPARED} for p, r in runs.items()} if args.repeat > 1 else None
    sim = sim_doc["policies"]
    result = agree(sim, live, COMPARED, noise)
    for table in tables(sim, live, result):
        console.print(table)
    if noise is not None:
        console.print("live run-to-run spread (max − min) / mean over "
                      f"{args.repeat} runs: " + "; ".join(
                          f"{p} " + "/".join(f"{noise[p][m]:.1f}%" for m in COMPARED[:3]) for p in noise)
                      + "  (latency/TTFT/decode)")
        console.print("discordant pairs outside live noise: "
                      + ", ".join(f"{a.metric} {len(a.resolved_discords)}" for a in result))
    headline = [a for a in result if a.metric in COMPARED[:3]]
    console.print("ranking agreement on the headline metrics: "
                  + ", ".join(f"{a.metric} tau {a.tau:+.2f} ({'same' if a.same_order else 'different'} order)"
                              for a in headline))
    errors = sum(int(m["errors"]) for m in live.values())
    console.print(f"simulator {sim_wall:.0f} s wall, live stack {live_wall:.0f} s wall; live errors {errors}")
    if args.json_out:
        doc = {"config": {k: v for k, v in vars(args).items() if k not in ("json_out", "log_dir", "policy_list")}
               | {"policies": args.policy_list, "log_dir": str(log_root)},
               "sim": sim_doc, "live": live, "live_runs": runs, "live_spread_pct": noise,
               "agreement": to_json(result),
               "wall_s": {"sim": round(sim_wall, 1), "live": round(live_wall, 1)}}
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
