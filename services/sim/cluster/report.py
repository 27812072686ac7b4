"""Tables of `tao sim run` results: metrics per policy and % deltas against every baseline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from services.common.extras import require
from services.sim.cluster.metrics import BETTER, METRIC_KEYS

if TYPE_CHECKING:  # rich comes with the 'report' extra; the table functions import it
    from rich.console import Console
    from rich.table import Table

BASELINES: tuple[str, ...] = ("round_robin", "least_loaded", "cache_aware", "thunderagent", "sjf")
"""Policies that are comparison points (not TAO or its ablations / the oracle)."""

Metrics = Mapping[str, float | int | None]

SHORT: dict[str, str] = {
    "mean_task_latency_s": "latency s",
    "p90_task_latency_s": "p90 lat s",
    "mean_ttft_s": "TTFT s",
    "mean_ttft_after_tool_s": "TTFT tool s",
    "decode_tok_s_makespan": "decode tok/s makespan",
    "decode_tok_s_busy": "decode tok/s busy",
    "prefix_hit_rate": "hit rate",
    "mean_pause_wait_s": "pause wait s",
    "preemptions": "preempt",
    "planner_time_share": "planner",
    "completed_sessions": "done",
    "latency_over_lower_bound": "lat / LB",
    "latency_over_capacity_bound": "lat / CB",
    "busy_over_work_bound": "busy / work",
}

TABLE_KEYS: tuple[str, ...] = (*METRIC_KEYS, "latency_over_lower_bound", "latency_over_capacity_bound",
                               "busy_over_work_bound")
"""Columns of the per-policy table: the metrics, then mean latency / the no-contention lower
bound, mean latency / the capacity bound and engine-busy seconds / the least engine work (when
the results carry them; ``services.sim.cluster.lower_bound``)."""

_DELTA_KEYS = ("mean_task_latency_s", "p90_task_latency_s", "mean_ttft_s", "mean_ttft_after_tool_s",
               "decode_tok_s_makespan", "decode_tok_s_busy", "prefix_hit_rate")


def pct_delta(value: float, base: float) -> float | None:
    """(value - base) / base in %, None when base is 0."""
    if base == 0:
        return None
    return 100.0 * (value - base) / base


def improvement_pct(key: str, value: float, base: float) -> float | None:
    """Signed improvement in %: positive is better (lower latency, higher throughput)."""
    d = pct_delta(value, base)
    if d is None:
        return None
    return -d if BETTER.get(key) == "lower" else d


def _fmt(key: str, v: float | int | None) -> str:
    if v is None:
        return "n/a"
    if key in ("preemptions", "completed_sessions"):
        return f"{int(v)}"
    if key == "prefix_hit_rate":
        return f"{100 * float(v):.2f}%"
    if key == "planner_time_share":
        return f"{100 * float(v):.3f}%"
    if key in ("decode_tok_s_makespan", "decode_tok_s_busy"):
        return f"{float(v):.1f}"
    if key in ("latency_over_lower_bound", "latency_over_capacity_bound", "busy_over_work_bound"):
        return f"{float(v):.2f}x"
    return f"{float(v):.3f}"


def metrics_table(policies: Mapping[str, Metrics], title: str = "per-policy metrics") -> Table:
    require("report", "result tables")
    from rich.table import Table

    t = Table(title=title)
    t.add_column("policy")
    keys = [k for k in TABLE_KEYS if any(k in m for m in policies.values())]
    for key in keys:
        t.add_column(SHORT[key], justify="right")
    for name, m in policies.items():
        t.add_row(name, *(_fmt(k, m.get(k)) for k in keys))
    return t


def delta_pairs(names: list[str]) -> list[tuple[str, str]]:
    """(policy, baseline) pairs to compare: every non-baseline against every baseline present;
    when no baseline was run, every policy against the first one."""
    baselines = [n for n in names if n in BASELINES]
    others = [n for n in names if n not in BASELINES]
    if baselines and others:
        return [(p, b) for p in others for b in baselines]
    return [(p, names[0]) for p in names[1:]]


def delta_table(policies: Mapping[str, Metrics]) -> Table | None:
    pairs = delta_pairs(list(policies))
    if not pairs:
        return None
    require("report", "result tables")
    from rich.table import Table

    t = Table(title="change vs baseline (latency, TTFT: negative is better; decode, hit rate: positive)")
    t.add_column("policy")
    t.add_column("vs")
    for key in _DELTA_KEYS:
        t.add_column(SHORT[key], justify="right")
    for p, b in pairs:
        cells = []
        for key in _DELTA_KEYS:
            raw, raw_base = policies[p].get(key), policies[b].get(key)
            if raw is None or raw_base is None:
                cells.append("n/a")
                continue
            v, base = float(raw), float(raw_base)
            if key == "prefix_hit_rate":
                cells.append(f"{100 * (v - base):+.2f}pp")
                continue
            d = pct_delta(v, base)
            if d is None:
                cells.append("n/a")
            else:
                better = (d < 0) if BETTER[key] == "lower" else (d > 0)
                style = "green" if better else ("red" if abs(d) > 1e-9 else "")
                cells.append(f"[{style}]{d:+.1f}%[/{style}]" if style else f"{d:+.1f}%")
        t.add_row(p, b, *cells)
    return t


def print_report(policies: Mapping[str, Metrics], console: Console | None = None,
                 lower_bound: Mapping[str, float | int] | None = None,
                 capacity_bound: Mapping[str, float | int | str] | None = None) -> None:
    require("report", "result tables")
    from rich.console import Console

    console = console or Console()
    console.print(metrics_table(policies))
    if lower_bound:
        console.print(
            f"no-contention lower bound (each session alone on one replica, cache never evicted, tools at "
            f"trace duration): mean {float(lower_bound['mean_task_latency_s']):.1f} s, "
            f"p90 {float(lower_bound['p90_task_latency_s']):.1f} s "
            f"(LLM {float(lower_bound['mean_llm_s']):.1f} s + tools {float(lower_bound['mean_tool_s']):.1f} s); "
            "lat / LB = mean latency / mean lower bound")
    if capacity_bound:
        console.print(
            f"capacity bound (the fleet's least engine-seconds with KV-limited batches, the closed loop's start "
            f"order; docs/algorithms.md#lower-bounds): mean {float(capacity_bound['mean_task_latency_s']):.1f} s "
            f"({capacity_bound['binding']} binds); least engine work {float(capacity_bound['work_s']):.0f} s; "
            "lat / CB = mean latency / capacity bound, busy / work = engine-busy seconds / least work")
    dt = delta_table(policies)
    if dt is not None:
        console.print(dt)
