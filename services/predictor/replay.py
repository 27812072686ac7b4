"""Replay a tool-event log through the predictor core on a virtual clock and score it.

Definitions (the issue's, made exact):

* a call counts when both its ``started`` and ``finished`` events are in the log;
  ``actual_s`` = finished.t − started.t;
* ``predicted_at_start_s`` = Ê of the prediction made at the ``started`` event;
  ``predicted_final_s`` = Ê of the last prediction made before the call finished, i.e. at
  its last ``started``/``progress`` event (predictions are made only when events arrive);
* MAE and "within 0.5 s" (|Ê − actual| ≤ 0.5 s) over those calls;
* readiness at the 1 s horizon: every ``tick_s`` of virtual time, for every running call,
  predicted = the session's readiness at that instant (events up to then applied),
  truth = the call finishes within ``horizon_s``; precision = TP/(TP+FP), recall = TP/(TP+FN).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from services.predictor.core import EventType, InvalidEventError, Predictor, PredictorConfig, ToolEvent


@dataclass(frozen=True, slots=True)
class CallResult:
    call_id: str
    session_id: str
    tool: str
    actual_s: float
    predicted_at_start_s: float
    predicted_final_s: float
    evidence_at_start: str
    evidence_final: str

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "session_id": self.session_id,
            "tool": self.tool,
            "actual_s": round(self.actual_s, 6),
            "predicted_at_start_s": round(self.predicted_at_start_s, 6),
            "predicted_final_s": round(self.predicted_final_s, 6),
            "evidence_at_start": self.evidence_at_start,
            "evidence_final": self.evidence_final,
        }


@dataclass(slots=True)
class ReadyCounts:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, predicted: bool, truth: bool) -> None:
        if predicted and truth:
            self.tp += 1
        elif predicted:
            self.fp += 1
        elif truth:
            self.fn += 1
        else:
            self.tn += 1

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None


@dataclass(slots=True)
class ReplayResult:
    events: int = 0
    invalid_events: int = 0
    calls: list[CallResult] = field(default_factory=list)
    ready: ReadyCounts = field(default_factory=ReadyCounts)
    ready_by_tool: dict[str, ReadyCounts] = field(default_factory=lambda: defaultdict(ReadyCounts))


def accuracy(calls: Iterable[CallResult]) -> dict[str, float | int | None]:
    """MAE and share within 0.5 s, final and at start, over ``calls``."""
    cs = list(calls)
    n = len(cs)
    if n == 0:
        return {"tools": 0, "mae_s": None, "within_0_5s": None, "mae_at_start_s": None, "within_0_5s_at_start": None}
    fin = [abs(c.predicted_final_s - c.actual_s) for c in cs]
    st = [abs(c.predicted_at_start_s - c.actual_s) for c in cs]
    return {
        "tools": n,
        "mae_s": sum(fin) / n,
        "within_0_5s": sum(e <= 0.5 for e in fin) / n,
        "mae_at_start_s": sum(st) / n,
        "within_0_5s_at_start": sum(e <= 0.5 for e in st) / n,
    }


def replay(
    events: Iterable[ToolEvent], config: PredictorConfig | None = None, tick_s: float = 0.25
) -> ReplayResult:
    """Feed ``events`` (sorted by ``t`` here, stable) through a fresh ``Predictor``."""
    cfg = config or PredictorConfig()
    evs = sorted(events, key=lambda e: e.t)
    finish: dict[tuple[str, str], float] = {}
    for e in evs:
        if e.type is EventType.FINISHED:
            finish.setdefault((e.session_id, e.call_id), e.t)
    p = Predictor(cfg)
    res = ReplayResult(events=len(evs))
    running: dict[tuple[str, str], str] = {}  # key -> tool
    at_start: dict[tuple[str, str], tuple[float, float, str]] = {}  # key -> (start t, Ê, evidence)
    last: dict[tuple[str, str], tuple[float, str]] = {}

    def evaluate(now_s: float) -> None:
        for (sid, cid), tool in running.items():
            end = finish.get((sid, cid), math.inf)
            predicted = p.ready(sid, now_s)
            truth = end - now_s <= cfg.horizon_s
            res.ready.add(predicted, truth)
            res.ready_by_tool[tool].add(predicted, truth)

    next_tick: float | None = None
    for e in evs:
        if running and next_tick is not None:
            while next_tick < e.t:
                evaluate(next_tick)
                next_tick += tick_s
        try:
            pred = p.observe(e)
        except InvalidEventError:
            res.invalid_events += 1
            continue
        key = (e.session_id, e.call_id)
        if pred.duplicate:
            continue
        if e.type is EventType.FINISHED:
            running.pop(key, None)
            start = at_start.pop(key, None)
            fin = last.pop(key, None)
            if start is not None and fin is not None:
                res.calls.append(
                    CallResult(e.call_id, e.session_id, pred.tool, e.t - start[0], start[1], fin[0], start[2], fin[1])
                )
            continue
        if e.type is EventType.STARTED:
            at_start[key] = (e.t, pred.expected_s, pred.evidence.value)
            if not running:
                next_tick = math.ceil(e.t / tick_s) * tick_s
            running[key] = pred.tool
        last[key] = (pred.expected_s, pred.evidence.value)
    return res


def summary(res: ReplayResult, include_calls: bool = True) -> dict[str, Any]:
    """The ``--json`` object of ``tao predictor replay``."""
    out: dict[str, Any] = {"events": res.events, "invalid_events": res.invalid_events}
    out.update(accuracy(res.calls))
    out["ready_precision"] = res.ready.precision
    out["ready_recall"] = res.ready.recall
    by_tool: dict[str, list[CallResult]] = defaultdict(list)
    by_ev: dict[str, list[CallResult]] = defaultdict(list)
    by_ev_start: dict[str, list[CallResult]] = defaultdict(list)
    for c in res.calls:
        by_tool[c.tool].append(c)
        by_ev[c.evidence_final].append(c)
        by_ev_start[c.evidence_at_start].append(c)
    per_tool: dict[str, Any] = {}
    for tool in sorted(set(by_tool) | set(res.ready_by_tool)):
        d = accuracy(by_tool.get(tool, []))
        rc = res.ready_by_tool.get(tool, ReadyCounts())
        d["ready_precision"], d["ready_recall"] = rc.precision, rc.recall
        per_tool[tool] = d
    out["per_tool"] = per_tool
    out["by_evidence_final"] = {k: accuracy(v) for k, v in sorted(by_ev.items())}
    out["by_evidence_at_start"] = {k: accuracy(v) for k, v in sorted(by_ev_start.items())}
    if include_calls:
        out["calls"] = [c.to_json() for c in res.calls]
    return out
