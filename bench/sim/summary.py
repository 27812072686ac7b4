"""Grid summaries: TAO against the best baseline and every baseline, the oracle gap, ablations."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.table import Table

from bench.sim.grid import ABLATIONS, OTHER_BASELINES, SYSTEM_BASELINES

Metrics = Mapping[str, float]
HEADLINE = ("mean_task_latency_s", "mean_ttft_s", "decode_tok_s_makespan", "decode_tok_s_busy")
"""Both decode figures are headline metrics: output tokens / makespan and per busy engine-second."""
LOWER = {"mean_task_latency_s", "mean_ttft_s", "mean_ttft_after_tool_s", "mean_pause_wait_s", "p90_task_latency_s"}


def gain_pct(key: str, value: float, base: float) -> float:
    """Improvement of ``value`` over ``base`` in % (positive = better), 0 when base is 0."""
    if base == 0:
        return 0.0
    d = 100.0 * (value - base) / base
    return -d if key in LOWER else d


def best_baseline(policies: Mapping[str, Metrics], key: str) -> tuple[str, float] | None:
    present = [(b, float(policies[b][key])) for b in SYSTEM_BASELINES
               if b in policies and policies[b].get(key) is not None]
    if not present:
        return None
    pick = min if key in LOWER else max
    return pick(present, key=lambda kv: kv[1])


def point_summary(policies: Mapping[str, Metrics]) -> dict[str, Any]:
    """TAO vs the best system baseline per headline metric, vs every baseline, vs the oracle."""
    tao = policies["tao"]
    out: dict[str, Any] = {"vs_best": {}, "vs_each": {}}
    wins = 0
    for key in HEADLINE:
        best = best_baseline(policies, key)
        if best is None or tao.get(key) is None:
            continue
        g = gain_pct(key, float(tao[key]), best[1])
        out["vs_best"][key] = {"baseline": best[0], "baseline_value": best[1], "tao": float(tao[key]),
                               "gain_pct": g}
        wins += g > 0
    out["beats_best_on_all_three"] = wins == len(out["vs_best"]) and bool(out["vs_best"])  # all headline metrics
    for b in (*SYSTEM_BASELINES, *OTHER_BASELINES):
        if b in policies:
            out["vs_each"][b] = {k: gain_pct(k, float(tao[k]), float(policies[b][k])) for k in HEADLINE
                                 if tao.get(k) is not None and policies[b].get(k) is not None}
    if "oracle" in policies:
        o = float(policies["oracle"]["mean_task_latency_s"])
        t = float(tao["mean_task_latency_s"])
        out["latency_vs_oracle_pct"] = 100.0 * (t - o) / o if o else 0.0
        out["within_5pct_of_oracle"] = out["latency_vs_oracle_pct"] <= 5.0
    return out


def grid_summary(points: Mapping[str, Mapping[str, Metrics]]) -> dict[str, Any]:
    per = {k: point_summary(p) for k, p in points.items() if "tao" in p}
    wins = [k for k, s in per.items() if s["beats_best_on_all_three"]]
    maxima: dict[str, Any] = {}
    for key in HEADLINE:
        gains = [(s["vs_best"][key]["gain_pct"], k) for k, s in per.items() if key in s["vs_best"]]
        each = [(g[key], k, b) for k, s in per.items() for b, g in s["vs_each"].items() if b in SYSTEM_BASELINES]
        if gains:
            maxima[key] = {
                "max_gain_vs_best_pct": max(gains)[0], "at": max(gains)[1],
                "min_gain_vs_best_pct": min(gains)[0], "min_at": min(gains)[1],
                "max_gain_vs_any_baseline_pct": max(each)[0] if each else None,
            }
    within = [k for k, s in per.items() if s.get("within_5pct_of_oracle")]
    wins_per_metric = {key: sum(1 for s in per.values() if key in s["vs_best"] and s["vs_best"][key]["gain_pct"] > 0)
                       for key in HEADLINE}
    return {
        "configurations": len(per),
        "bounds_geomean": bounds_geomean(points),
        "wins_per_metric": wins_per_metric,
        "tao_beats_best_baseline_on_all_three": len(wins),
        "configurations_won": wins,
        "within_5pct_of_oracle": len(within),
        "maxima": maxima,
        "per_point": per,
    }


def bounds_geomean(points: Mapping[str, Mapping[str, Metrics]]) -> dict[str, dict[str, float]]:
    """Per policy, the geometric mean over configurations of its latency / capacity bound and its
    engine busy / least work (where the run reports them): how far each is from the bound."""
    out: dict[str, dict[str, float]] = {}
    for key in ("latency_over_capacity_bound", "busy_over_work_bound"):
        logs: dict[str, list[float]] = {}
        for p in points.values():
            for name, m in p.items():
                v = m.get(key)
                if v is not None and v > 0:
                    logs.setdefault(name, []).append(math.log(float(v)))
        for name, xs in logs.items():
            out.setdefault(name, {})[key] = math.exp(sum(xs) / len(xs))
    return out


def _pct(v: float) -> str:
    color = "green" if v > 0 else ("red" if v < 0 else "")
    return f"[{color}]{v:+.1f}%[/{color}]" if color else f"{v:+.1f}%"


def headline_table(points: Mapping[str, Mapping[str, Metrics]], summary: Mapping[str, Any]) -> Table:
    t = Table(title="TAO vs the best system baseline per metric (gain: + is better), and vs the oracle")
    for col in ("configuration", "TAO lat s", "best", "gain", "TAO TTFT s", "best", "gain",
                "TAO dec tok/s (makespan)", "best", "gain", "TAO dec tok/s (busy)", "best", "gain",
                "lat vs oracle"):
        t.add_column(col, justify="left" if col in ("configuration", "best") else "right")
    for key in points:
        s = summary["per_point"].get(key)
        if s is None:
            continue
        row = [key]
        for m in HEADLINE:
            vb = s["vs_best"].get(m)
            if vb is None:
                row += ["n/a", "", ""]
                continue
            row += [f"{vb['tao']:.2f}" if not m.startswith("decode") else f"{vb['tao']:.0f}",
                    vb["baseline"], _pct(vb["gain_pct"])]
        row.append(f"{s.get('latency_vs_oracle_pct', float('nan')):+.1f}%")
        t.add_row(*row)
    return t


def each_baseline_table(summary: Mapping[str, Any]) -> Table:
    t = Table(title="TAO vs each baseline (gain %, + is better): latency / TTFT / decode (makespan) / decode (busy)")
    t.add_column("configuration")
    names = (*SYSTEM_BASELINES, *OTHER_BASELINES)
    for b in names:
        t.add_column(b, justify="right")
    for key, s in summary["per_point"].items():
        cells = []
        for b in names:
            g = s["vs_each"].get(b)
            cells.append("—" if g is None else " / ".join(f"{g[m]:+.1f}" if m in g else "n/a" for m in HEADLINE))
        t.add_row(key, *cells)
    return t


def ablation_table(key: str, policies: Mapping[str, Metrics]) -> Table | None:
    rows = [p for p in ("tao", *ABLATIONS, "sjf", "oracle") if p in policies]
    if not any(a in policies for a in ABLATIONS):
        return None
    t = Table(title=f"Ablation at {key} (decode Δ vs full TAO)")
    for col in ("variant", "decode tok/s makespan", "Δ decode", "decode tok/s busy", "hit rate", "pause wait s",
                "TTFT after tool s", "latency s"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    base = float(policies["tao"]["decode_tok_s_makespan"])
    for p in rows:
        m = policies[p]
        d = float(m["decode_tok_s_makespan"])
        busy = m.get("decode_tok_s_busy")
        t.add_row(p, f"{d:.1f}", _pct(100.0 * (d - base) / base if base else 0.0),
                  "n/a" if busy is None else f"{float(busy):.1f}",
                  f"{100 * float(m['prefix_hit_rate']):.2f}%", f"{float(m['mean_pause_wait_s']):.3f}",
                  f"{float(m['mean_ttft_after_tool_s']):.3f}", f"{float(m['mean_task_latency_s']):.1f}")
    return t


def _per_policy_table(points: Mapping[str, Mapping[str, Metrics]], title: str, head: Sequence[str],
                      head_of: Callable[[str], list[str]], cell: Callable[[Metrics], str]) -> Table:
    """One row per configuration: ``head`` columns from ``head_of(key)``, then a ``cell`` per policy."""
    names: list[str] = []
    for p in points.values():
        names += [n for n in p if n not in names]
    t = Table(title=title)
    t.add_column("configuration")
    for h in head:
        t.add_column(h, justify="right")
    for n in names:
        t.add_column(n, justify="right")
    for key, p in points.items():
        t.add_row(key, *head_of(key), *(cell(p[n]) if n in p else "—" for n in names))
    return t


def _ratio(v: float | int | None) -> str:
    return "—" if v is None else f"{float(v):.2f}"


def lower_bound_table(points: Mapping[str, Mapping[str, Metrics]],
                      bounds: Mapping[str, Mapping[str, float | int]]) -> Table:
    """Mean task latency / the no-contention lower bound, every policy in every configuration."""
    return _per_policy_table(
        points, "mean task latency / no-contention lower bound (each session alone, cache never evicted)",
        ["bound s"], lambda k: ["—" if k not in bounds else f"{float(bounds[k]['mean_task_latency_s']):.1f}"],
        lambda m: _ratio(m.get("latency_over_lower_bound")))


def capacity_bound_table(points: Mapping[str, Mapping[str, Metrics]],
                         bounds: Mapping[str, Mapping[str, float | int | str]]) -> Table:
    """Per policy: mean task latency / the capacity bound, then engine-busy seconds / the least
    engine seconds of the trace (``services.sim.cluster.lower_bound.capacity_bound``)."""
    def head(k: str) -> list[str]:
        b = bounds.get(k)
        if b is None:
            return ["—"] * 3
        return [f"{float(b['mean_task_latency_s']):.1f}", f"{float(b['no_contention_s']):.1f}",
                f"{float(b['work_s']):.0f}"]

    return _per_policy_table(
        points, "mean task latency / capacity bound · engine busy / least engine work "
                "(the fleet's least engine-seconds, KV-limited batches; docs/algorithms.md#lower-bounds)",
        ["capacity s", "no-contention s", "least work s"], head,
        lambda m: f"{_ratio(m.get('latency_over_capacity_bound'))} · {_ratio(m.get('busy_over_work_bound'))}")


def ablation_points(points: Mapping[str, Mapping[str, Metrics]]) -> Sequence[str]:
    return [k for k, p in points.items() if any(a in p for a in ABLATIONS)]
