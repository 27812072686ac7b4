"""Accuracy of the predictor core on the synthetic SWE-agent-like mix, per tool class,
against baselines measured in the same run.

Baselines (simple predictors a team might ship first):
* ``default`` — every call takes the 5 s default;
* ``global-median`` — the median of all durations seen so far (one number for everything);
* ``tool-median`` — the median of the tool name's past durations (global before that).
They see the same events and are scored with the same "final prediction" rule.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from services.predictor.core import EventType, ToolEvent, parse_command
from services.predictor.replay import CallResult, accuracy, replay, summary
from services.predictor.synthetic import CLASSES, SyntheticLog, generate

TARGET_MAE_S = 0.41  # the TAO paper: 10,967 tools, final predictions
TARGET_WITHIN = 0.829


class _Median:
    def __init__(self) -> None:
        self.xs: list[float] = []

    def add(self, x: float) -> None:
        bisect.insort(self.xs, x)

    def get(self, default: float) -> float:
        return self.xs[len(self.xs) // 2] if self.xs else default


def baseline_calls(events: Sequence[ToolEvent], kind: str) -> list[CallResult]:
    """Score a baseline: its prediction is fixed at start (it has no other evidence)."""
    glob: _Median = _Median()
    per_tool: defaultdict[str, _Median] = defaultdict(_Median)
    started: dict[tuple[str, str], tuple[float, str, float]] = {}
    out = []
    for e in sorted(events, key=lambda e: e.t):
        key = (e.session_id, e.call_id)
        if e.type is EventType.STARTED and key not in started:
            if kind == "default":
                guess = 5.0
            elif kind == "global-median":
                guess = glob.get(5.0)
            else:
                guess = per_tool[e.tool].get(glob.get(5.0)) if per_tool[e.tool].xs else glob.get(5.0)
            started[key] = (e.t, e.tool, guess)
        elif e.type is EventType.FINISHED and key in started:
            t0, tool, guess = started.pop(key)
            d = e.t - t0
            glob.add(d)
            per_tool[tool].add(d)
            out.append(CallResult(e.call_id, e.session_id, tool, d, guess, guess, kind, kind))
    return out


def by_class(log: SyntheticLog, calls: Sequence[CallResult]) -> dict[str, dict[str, Any]]:
    """Accuracy per tool class, then test runs per runner (``(test: pytest)``) and outliers."""
    cls = {c.call_id: c for c in log.calls}
    groups: dict[str, list[CallResult]] = defaultdict(list)
    for c in calls:
        plan = cls[c.call_id]
        groups[plan.tool_class].append(c)
        if plan.tool_class == "test":
            groups[f"(test: {parse_command(plan.command).program})"].append(c)
        if plan.outlier:
            groups["(outliers, inside their classes)"].append(c)
    runners = sorted(k for k in groups if k.startswith("(test: "))
    return {k: accuracy(groups[k]) for k in [*CLASSES, *runners, "(outliers, inside their classes)"] if k in groups}


def run(sessions: int, seeds: Sequence[int], group_size: int = 4) -> dict[str, Any]:
    results: dict[str, Any] = {"sessions": sessions, "group_size": group_size, "runs": []}
    for seed in seeds:
        log = generate(sessions, seed=seed, group_size=group_size)
        res = replay(log.events)
        s = summary(res, include_calls=False)
        run_out: dict[str, Any] = {
            "seed": seed,
            "events": len(log.events),
            "overall": accuracy(res.calls),
            "ready_precision": s["ready_precision"],
            "ready_recall": s["ready_recall"],
            "per_class": by_class(log, res.calls),
            "by_evidence_final": s["by_evidence_final"],
            "by_evidence_at_start": s["by_evidence_at_start"],
            "baselines": {k: accuracy(baseline_calls(log.events, k)) for k in ("default", "global-median", "tool-median")},
        }
        run_out["meets_targets"] = all(
            d["mae_s"] <= TARGET_MAE_S and d["within_0_5s"] >= TARGET_WITHIN
            for name, d in [("overall", run_out["overall"]), *run_out["per_class"].items()]
            if not name.startswith("(")
        )
        results["runs"].append(run_out)
    return results


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:5.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:6.3f}"


def render(results: dict[str, Any]) -> str:
    lines = []
    for r in results["runs"]:
        lines.append(f"seed {r['seed']}: {r['overall']['tools']} calls, {r['events']} events, "
                     f"{results['sessions']} sessions, group size {results['group_size']}")  # fmt: skip
        lines.append(f"  {'class':<34}{'calls':>7}{'MAE s':>8}{'≤0.5 s':>8}{'MAE@start':>11}{'≤0.5@start':>11}")
        rows = [("overall", r["overall"]), *r["per_class"].items()]
        for name, d in rows:
            lines.append(f"  {name:<34}{d['tools']:>7}{_num(d['mae_s']):>8}{_pct(d['within_0_5s']):>8}"
                         f"{_num(d['mae_at_start_s']):>11}{_pct(d['within_0_5s_at_start']):>11}")  # fmt: skip
        lines.append(f"  readiness at 1 s: precision {_pct(r['ready_precision'])}, recall {_pct(r['ready_recall'])}")
        mae = r["overall"]["mae_s"]
        for name, b in r["baselines"].items():
            lines.append(f"  baseline {name:<14} MAE {_num(b['mae_s'])} s, ≤0.5 s {_pct(b['within_0_5s'])}"
                         f"  -> predictor MAE is {mae / b['mae_s']:.3f}x the baseline's")  # fmt: skip
        n = r["overall"]["tools"]
        lines.append(f"  {'final prediction by evidence':<34}{'share':>7}{'MAE s':>8}{'≤0.5 s':>8}")
        for ev, d in r["by_evidence_final"].items():
            lines.append(f"    {ev:<32}{_pct(d['tools'] / n):>7}{_num(d['mae_s']):>8}{_pct(d['within_0_5s']):>8}")
        lines.append(f"  targets (MAE ≤ {TARGET_MAE_S} s, ≥ {100 * TARGET_WITHIN:.1f}% within 0.5 s, overall and "
                     f"every class): {'MET' if r['meets_targets'] else 'NOT MET'}")  # fmt: skip
        lines.append("")
    return "\n".join(lines)
