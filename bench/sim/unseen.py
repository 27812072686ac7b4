"""``python -m bench.sim.unseen``: policies compared on many fresh traces, paired, with confidence
intervals (docs/benchmarks.md#fresh-traces-paired).

The grid (``python -m bench.sim``) runs one trace per configuration, so a policy's margin there is
one draw: on one trace the seed of the predictor's exploration alone moves ``tao``'s mean task
latency by ±2.5 % (three seeds, docs/benchmarks.md#fresh-traces-paired), and the trace itself
by more, as much as most margins the grid reports. Users judge TAO on their own workloads, not
on ours, so this benchmark draws traces the policies were never tuned on (generator seeds from
``FIRST_SEED``, far from the grid's 0–2), runs every policy on each of them, and reports per
metric the geometric mean over traces of each policy's ratio to the reference policy (the first
one, ``tao`` by default), its 95 % confidence interval (Student's t over the per-trace log
ratios: the traces are independent, the policies on one trace are paired), and on how many
traces the policy was better than the reference.

Scenarios (``SCENARIOS``): the issue-13 "new user" setup (160 sessions of one workload kind on 4
replicas of ``qwen3-32b-h100x2`` at concurrency 128) for the three agent kinds, and the tight-KV
terminal-bench setup (12 sessions on 2 replicas with 6,000 KV blocks each) where holding KV is
most at odds with vLLM's own preemption.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.sim.grid import GridPoint
from bench.sim.run import Task, execute, load_checkpoint
from services.sim.engine.profiles import QWEN3_32B_H100X2

FIRST_SEED = 1000
"""Generator seeds of the traces start here: the grid uses 0–2 and the docs' studies 1–12 and 77–115."""

SCENARIOS: dict[str, GridPoint] = {
    p.key: p for p in (
        GridPoint("qwen-4xTP2/swe-lite/n160", "qwen-4xTP2", QWEN3_32B_H100X2, 4, "swe-lite", 160, 128),
        GridPoint("qwen-4xTP2/swe-verified/n160", "qwen-4xTP2", QWEN3_32B_H100X2, 4, "swe-verified", 160, 128),
        GridPoint("qwen-4xTP2/terminal-bench/n160", "qwen-4xTP2", QWEN3_32B_H100X2, 4, "terminal-bench", 160, 128),
        GridPoint("tight-kv/terminal-bench/n12", "tight-kv", QWEN3_32B_H100X2, 2, "terminal-bench", 12, 12,
                  num_gpu_blocks=6000),
    )
}
DEFAULT_POLICIES: tuple[str, ...] = ("tao", "thunderagent", "sjf", "continuum")
"""``tao`` and the gating peers issue 13 measures it against."""
EXTRA_POLICIES: dict[str, tuple[str, ...]] = {"tight-kv/terminal-bench/n12": ("least_loaded",)}
"""Added to the default policies per scenario: the per-request routers are far behind (and slow to
simulate: vLLM preempts them) everywhere but on tight-KV terminal-bench, where least-loaded beat
``tao`` on the twelve traces of docs/benchmarks.md#twelve-tight-kv-traces-time-slicing-and-least-attained-first-2026-12-03-later."""

METRICS: tuple[tuple[str, str, int], ...] = (
    ("mean_task_latency_s", "latency", -1),
    ("mean_ttft_s", "TTFT", -1),
    ("decode_tok_s_makespan", "decode/makespan", 1),
    ("decode_tok_s_busy", "decode/busy", 1),
)
"""(metric, label, sign): sign −1 when lower is better."""

#: two-sided 95 % quantiles of Student's t for 1–30 degrees of freedom (beyond: 1.96)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


@dataclass(frozen=True, slots=True)
class Paired:
    """One policy against the reference on one metric, over the traces both completed."""

    ratio: float
    """geometric mean of policy / reference"""
    low: float
    high: float
    """95 % confidence interval of that ratio (equal to ``ratio`` with one trace)"""
    better: int
    """traces on which the policy was better than the reference"""
    traces: int


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def paired(values: Sequence[float], reference: Sequence[float], sign: int) -> Paired:
    """Paired comparison of per-trace ``values`` with the ``reference``'s on the same traces;
    ``sign`` −1 when lower is better. Log ratios, so 0.9 and 1.1 weigh alike."""
    if len(values) != len(reference) or not values:
        raise ValueError("paired needs equally many values and reference values, at least one")
    if min(*values, *reference) <= 0:
        raise ValueError("paired needs positive values")
    logs = [math.log(v / r) for v, r in zip(values, reference, strict=True)]
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    better = sum(1 for x in logs if sign * x > 0)
    return Paired(math.exp(mean), math.exp(mean - half), math.exp(mean + half), better, len(logs))


def seeds_of(traces: int, first_seed: int = FIRST_SEED) -> list[int]:
    return list(range(first_seed, first_seed + traces))


def seed_key(r: dict[str, Any]) -> tuple[str, str, int]:
    """This benchmark's checkpoint key: (scenario, policy, trace seed)."""
    return r["point"], r["policy"], r["seed"]


def run(points: Sequence[GridPoint], policies_of: Callable[[GridPoint], Sequence[str]], seeds: Sequence[int],
        jobs: int, checkpoint: Path | None = None) -> tuple[list[dict[str, Any]], float]:
    """Every (scenario, trace seed, policy) simulation: results (as ``bench.sim.run.run_task``
    returns them) and the wall time. With ``checkpoint`` (JSONL) results are appended
    as they arrive and reused on the next run."""
    done = load_checkpoint(checkpoint, seed_key)
    wanted = {(p.key, pol, seed) for p in points for seed in seeds for pol in policies_of(p)}
    tasks = [Task(p, pol, seed, None) for p in points for seed in seeds for pol in policies_of(p)
             if (p.key, pol, seed) not in done]
    results = [r for key, r in done.items() if key in wanted]
    t0 = time.perf_counter()
    execute(tasks, jobs, results.append, checkpoint)
    return results, time.perf_counter() - t0


def summarize(results: Sequence[dict[str, Any]], point: str, policies: Sequence[str]) -> dict[str, Any]:
    """Per policy and metric: the mean over traces and, against ``policies[0]``, the ``paired``
    comparison over the traces on which both completed every session."""
    by = {(r["policy"], r["seed"]): r for r in results if r["point"] == point and not r.get("incomplete")}
    ref = policies[0]
    out: dict[str, Any] = {}
    for pol in policies:
        seeds = sorted(s for (p, s) in by if p == pol and (ref, s) in by)
        row: dict[str, Any] = {"traces": len(seeds)}
        for metric, _, sign in METRICS:
            vals = [float(by[(pol, s)]["metrics"][metric]) for s in seeds]
            row[metric] = {"mean": statistics.fmean(vals) if vals else None}
            if pol != ref and seeds:
                c = paired(vals, [float(by[(ref, s)]["metrics"][metric]) for s in seeds], sign)
                row[metric].update(ratio=c.ratio, low=c.low, high=c.high, better=c.better)
        out[pol] = row
    return out


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}"


def _cell(m: dict[str, Any], traces: int) -> str:
    if m.get("mean") is None:
        return "—"
    if "ratio" not in m:
        return f"{m['mean']:,.2f}"
    return f"{m['mean']:,.2f}  {_pct(m['ratio'])} % [{_pct(m['low'])}, {_pct(m['high'])}]  {m['better']}/{traces}"


def table(point: str, summary: dict[str, Any], policies: Sequence[str]) -> Table:
    t = Table(title=f"{point}: mean over traces; vs {policies[0]}: geometric mean of the ratio "
                    f"[95 % CI], traces on which the policy is better than {policies[0]}")
    t.add_column("policy")
    for _, label, sign in METRICS:
        t.add_column(f"{label} ({'lower' if sign < 0 else 'higher'} is better)", justify="right")
    for pol in policies:
        row = summary[pol]
        t.add_row(pol, *(_cell(row[m], row["traces"]) for m, _, _ in METRICS))
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim.unseen", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help="comma-separated; the first is the reference (the default adds EXTRA_POLICIES per scenario)")
    p.add_argument("--traces", type=int, default=8, help="fresh traces per scenario (default 8)")
    p.add_argument("--first-seed", type=int, default=FIRST_SEED)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", type=Path, help="write the per-trace results and the summaries here")
    p.add_argument("--checkpoint", type=Path, help="JSONL of finished simulations, appended and reused")
    args = p.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    policies = [s for s in args.policies.split(",") if s]
    extras = EXTRA_POLICIES if args.policies == ",".join(DEFAULT_POLICIES) else {}

    def policies_of(point: GridPoint) -> list[str]:
        return policies + [x for x in extras.get(point.key, ()) if x not in policies]

    if len(policies) < 2 or args.traces < 1:
        p.error("need at least two policies and one trace")
    from services.planner.core.registry import POLICIES
    from services.sim.cluster import oracle as _oracle  # noqa: F401  (registers "oracle")
    missing = [pol for pt in SCENARIOS.values() for pol in policies_of(pt) if pol not in POLICIES]
    if missing:
        p.error(f"unknown policy {', '.join(missing)}; registered: {', '.join(sorted(POLICIES))}")
    seeds = seeds_of(args.traces, args.first_seed)
    points = [SCENARIOS[s] for s in names]
    results, wall = run(points, policies_of, seeds, args.jobs, args.checkpoint)
    console = Console(width=200)
    summaries = {}
    for pt in points:
        summaries[pt.key] = summarize(results, pt.key, policies_of(pt))
        console.print(table(pt.key, summaries[pt.key], policies_of(pt)))
    incomplete = sorted({(r["point"], r["policy"], r["seed"]) for r in results if r.get("incomplete")})
    if incomplete:
        console.print(f"left out (sessions did not complete): {incomplete}")
    cpu = sum(float(r["cpu_s"]) for r in results)
    console.print(f"traces: seeds {seeds[0]}–{seeds[-1]}; {len(results)} simulations, {cpu:,.0f} s CPU in all "
                  f"(checkpointed ones included), {wall:,.0f} s wall for this run with --jobs {args.jobs}")
    if args.json:
        args.json.write_text(json.dumps({"seeds": seeds, "policies": {pt.key: policies_of(pt) for pt in points},
                                         "results": results,
                                         "summaries": summaries, "wall_s": wall}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
