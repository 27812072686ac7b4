"""The predictor core: tool events in, per-call predictions and per-session readiness out.

Pure and clock-free: every method takes the time it needs (event ``t``, ``now_s``). The
service, ``tao predictor replay`` and the discrete-event simulator run this same class.

Event handling is idempotent and tolerant of reordering:

* a second ``started`` for a known call, or any event for a finished call, changes nothing
  (``Prediction.duplicate``), except that a ``started`` arriving after its ``finished``
  supplies the missing start time and the duration is learned then;
* a ``progress`` before its ``started`` opens the call with a provisional start;
* contradictions (finished or progress before the call started) raise
  ``InvalidEventError`` and change nothing.

State (sessions, calls, history) round-trips through plain dicts (``to_state`` /
``from_state``, per-session ``session_state`` / ``load_session``), and ``drain_dirty`` lists
what changed since the last drain, so an adapter can persist it incrementally.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.predictor.core.config import PredictorConfig
from services.predictor.core.estimate import CallState, Estimator
from services.predictor.core.events import (
    INFERRED_CALL_PREFIX,
    EventType,
    InvalidEventError,
    ToolEvent,
    validate_event,
)
from services.predictor.core.history import HistoryStore
from services.predictor.core.model import READY_REASONS, Evidence, Prediction, ReadyReason, SessionPrediction
from services.predictor.core.readiness import Explorer, call_next_change_s, call_readiness, just_after
from services.predictor.core.state import call_from_dict, call_to_dict

STATE_VERSION = 1


@dataclass(slots=True)
class _Done:
    finished_at_s: float
    started_at_s: float | None  # None: its started event has not been seen
    tool: str
    command: str
    deadline_s: float | None


@dataclass(slots=True)
class _Session:
    last_event_s: float
    calls: dict[str, CallState] = field(default_factory=dict)
    done: OrderedDict[str, _Done] = field(default_factory=OrderedDict)
    completed_at_s: float | None = None
    last_done: str = ""


@dataclass(frozen=True, slots=True)
class DirtyState:
    """What changed since the last ``drain_dirty``: session id -> state (None = deleted),
    history key -> state, and history keys evicted by the LRU bound."""

    sessions: dict[str, dict[str, Any] | None]
    history: dict[str, dict[str, Any]]
    history_evicted: frozenset[str]


class Predictor:
    """See the module docstring. Not thread-safe: one owner drives it."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.cfg = config or PredictorConfig()
        self.history = HistoryStore(self.cfg.history_window, self.cfg.history_decay, self.cfg.max_history_keys)
        self.estimator = Estimator(self.cfg, self.history)
        self.explorer = Explorer(self.cfg.exploration)
        self._sessions: dict[str, _Session] = {}
        self._dirty: set[str] = set()
        self._touched: set[str] = set()
        self._wake: list[tuple[float, str]] = []
        self._wake_at: dict[str, float] = {}
        self._published: dict[str, tuple[bool, ReadyReason]] = {}

    # ------------------------------------------------------------------ events
    def observe(self, event: ToolEvent, now_s: float | None = None) -> Prediction:
        """Apply one event; return the call's prediction as of ``event.t``. With ``now_s``,
        events stamped more than ``limits.max_future_s`` after it are rejected too."""
        target, duplicate = self._apply(event, now_s)
        if isinstance(target, CallState):
            return self._prediction(event.session_id, target, event.t, duplicate)
        return self._done_prediction(event.session_id, event.call_id, target, duplicate)

    def apply(self, event: ToolEvent, now_s: float | None = None) -> bool:
        """``observe`` without building the prediction (the ingestion hot path); True when the
        event changed something, False for a duplicate."""
        return not self._apply(event, now_s)[1]

    def _apply(self, event: ToolEvent, now_s: float | None) -> tuple[CallState | _Done, bool]:
        validate_event(event, now_s, self.cfg.limits)
        sid = event.session_id
        s = self._sessions.get(sid)
        new = s is None
        if s is None:
            s = _Session(last_event_s=event.t)
        if s.calls or s.done:
            ignored = self._defer_to_runner(s, event)
            if ignored is not None:
                return ignored, True
        if event.type is EventType.STARTED:
            target, duplicate = self._started(s, event)
        elif event.type is EventType.PROGRESS:
            target, duplicate = self._progress(s, event)
        else:
            target, duplicate = self._finished(s, event)
        if new:
            self._sessions[sid] = s
        if not duplicate:
            if event.t > s.last_event_s:
                s.last_event_s = event.t
            self._dirty.add(sid)
            self._touched.add(sid)
        return target, duplicate

    @staticmethod
    def _defer_to_runner(s: _Session, ev: ToolEvent) -> _Done | None:
        """A runner's own reports win over calls the router inferred from answers
        (``INFERRED_CALL_PREFIX``): an inferred event of a session whose runner reports is
        ignored (answered as a duplicate), and a runner's call that starts drops the inferred
        calls still open, unlearned. None: apply the event."""
        if ev.call_id.startswith(INFERRED_CALL_PREFIX):
            runner = any(not c.startswith(INFERRED_CALL_PREFIX) for c in s.calls) or any(
                not c.startswith(INFERRED_CALL_PREFIX) for c in s.done)
            return _Done(ev.t, ev.t, ev.tool, ev.command, ev.deadline_s) if runner else None
        if ev.type is EventType.STARTED:
            for cid in [c for c in s.calls if c.startswith(INFERRED_CALL_PREFIX)]:
                del s.calls[cid]
        return None

    def _started(self, s: _Session, ev: ToolEvent) -> tuple[CallState | _Done, bool]:
        done = s.done.get(ev.call_id)
        if done is not None:
            if done.started_at_s is not None:
                return done, True
            if ev.t > done.finished_at_s:
                raise InvalidEventError("started after the call finished (negative duration)")
            done.started_at_s, done.tool, done.command = ev.t, ev.tool, ev.command
            done.deadline_s = ev.deadline_s if ev.deadline_s is not None else done.deadline_s
            late = CallState(ev.call_id, ev.tool, ev.command, ev.t, True, ev.t, done.deadline_s)
            self.estimator.learn(ev.session_id, late, self.estimator.info_of(late), done.finished_at_s - ev.t)
            return done, False
        call = s.calls.get(ev.call_id)
        if call is not None and call.start_known:
            return call, True
        if call is None:
            call = CallState(ev.call_id, ev.tool, ev.command, ev.t, True, ev.t, ev.deadline_s)
            s.calls[ev.call_id] = call
        else:  # opened by an earlier-delivered progress event
            if ev.t > call.started_at_s:
                raise InvalidEventError("started after the call reported progress")
            call.started_at_s, call.start_known = ev.t, True
            call.tool, call.command, call.info = ev.tool, ev.command, None
            if ev.deadline_s is not None:
                call.deadline_s = ev.deadline_s
        self._record_direct(call, ev)
        self._refresh(ev.session_id, call, ev.t, refresh=False)
        return call, False

    def _progress(self, s: _Session, ev: ToolEvent) -> tuple[CallState | _Done, bool]:
        done = s.done.get(ev.call_id)
        if done is not None:
            return done, True
        call = s.calls.get(ev.call_id)
        if call is None:
            call = CallState(ev.call_id, ev.tool, ev.command, ev.t, False, ev.t, ev.deadline_s)
            s.calls[ev.call_id] = call
        elif ev.t < call.started_at_s:
            if call.start_known:
                raise InvalidEventError("progress before the call started")
            call.started_at_s = ev.t
        if ev.deadline_s is not None:
            call.deadline_s = ev.deadline_s
        self._record_direct(call, ev)
        self._refresh(ev.session_id, call, ev.t, refresh=True)
        return call, False

    def _finished(self, s: _Session, ev: ToolEvent) -> tuple[CallState | _Done, bool]:
        done = s.done.get(ev.call_id)
        if done is not None:
            return done, True
        running = s.calls.get(ev.call_id)
        if running is not None and ev.t < running.started_at_s:
            raise InvalidEventError("finished before the call started (negative duration)")
        if running is not None:
            call = running
            del s.calls[ev.call_id]
            started = call.started_at_s if call.start_known else None
            done = _Done(ev.t, started, call.tool, call.command, call.deadline_s)
            if started is not None:
                self.estimator.learn(ev.session_id, call, self.estimator.info_of(call), ev.t - started)
        else:
            done = _Done(ev.t, None, ev.tool, ev.command, ev.deadline_s)
        s.done[ev.call_id] = done
        while len(s.done) > self.cfg.tombstones_per_session:
            s.done.popitem(last=False)
        if s.completed_at_s is None or ev.t >= s.completed_at_s:
            s.completed_at_s, s.last_done = ev.t, ev.call_id
        return done, False

    @staticmethod
    def _record_direct(call: CallState, ev: ToolEvent) -> None:
        call.made_at_s = max(call.made_at_s, ev.t)
        if ev.eta_s is not None and (call.eta is None or ev.t >= call.eta[0]):
            call.eta = (ev.t, ev.eta_s)
        f = ev.fraction
        if f is not None and f > 0.0:
            if call.frac_first is None or ev.t < call.frac_first[0]:
                call.frac_first = (ev.t, f)
            if call.frac_last is None or ev.t >= call.frac_last[0]:
                call.frac_last = (ev.t, f)

    def _refresh(self, sid: str, call: CallState, now_s: float, refresh: bool) -> None:
        info = self.estimator.info_of(call)
        call.expected_s, call.evidence = self.estimator.estimate(sid, call, info, now_s, refresh)

    def _prediction(self, sid: str, call: CallState, now_s: float, duplicate: bool) -> Prediction:
        info = self.estimator.info_of(call)
        elapsed = max(0.0, now_s - call.started_at_s)
        d = call.effective_deadline_s(info)
        return Prediction(
            session_id=sid,
            call_id=call.call_id,
            tool=call.tool,
            made_at_s=call.made_at_s,
            started_at_s=call.started_at_s,
            elapsed_s=elapsed,
            expected_s=call.expected_s,
            remaining_s=max(0.0, call.expected_s - elapsed),
            evidence=call.evidence,
            deadline_at_s=None if d is None else call.started_at_s + d,
            duplicate=duplicate,
        )

    @staticmethod
    def _done_prediction(sid: str, call_id: str, done: _Done, duplicate: bool) -> Prediction:
        start = done.finished_at_s if done.started_at_s is None else done.started_at_s
        duration = done.finished_at_s - start
        return Prediction(
            session_id=sid,
            call_id=call_id,
            tool=done.tool,
            made_at_s=done.finished_at_s,
            started_at_s=start,
            elapsed_s=duration,
            expected_s=duration,
            remaining_s=0.0,
            evidence=Evidence.COMPLETED,
            completed=True,
            duplicate=duplicate,
        )

    # ------------------------------------------------------------------ readiness
    def predict(self, session_id: str, now_s: float) -> SessionPrediction:
        """Readiness of ``session_id`` at ``now_s`` (see readiness.py for the rules)."""
        s = self._sessions.get(session_id)
        if s is None:
            return SessionPrediction(session_id, now_s, False, ReadyReason.UNKNOWN)
        if not s.calls:
            if s.completed_at_s is None:
                return SessionPrediction(session_id, now_s, False, ReadyReason.UNKNOWN)
            done = s.done.get(s.last_done)
            fresh = now_s - s.completed_at_s <= self.cfg.stale_after_s
            reason = ReadyReason.COMPLETED if fresh else ReadyReason.STALE
            start = done.started_at_s if done is not None else None
            return SessionPrediction(
                session_id, now_s, fresh, reason,
                remaining_s=0.0 if fresh else None,
                expected_s=None if start is None else s.completed_at_s - start,
                evidence=Evidence.COMPLETED, call_id=s.last_done, tool=done.tool if done else "",
                made_at_s=s.completed_at_s, started_at_s=start,
            )  # fmt: skip
        judged: list[tuple[ReadyReason, CallState, float | None]] = []
        for call in s.calls.values():
            reason, d_at = call_readiness(call, self.estimator.info_of(call), now_s, self.cfg)
            judged.append((reason, call, d_at))
        if len(judged) == 1:
            reason, call, d_at = judged[0]
            if reason is ReadyReason.OVERDUE and self.explorer.granted(session_id, call.call_id, now_s):
                reason = ReadyReason.EXPLORATION
            ready = reason in READY_REASONS
        else:
            reason, call, d_at, ready = self._combine(session_id, judged, now_s)
        counts = reason is not ReadyReason.STALE
        elapsed = max(0.0, now_s - call.started_at_s)
        return SessionPrediction(
            session_id, now_s, ready, reason,
            remaining_s=max(0.0, call.expected_s - elapsed) if counts else None,
            expected_s=call.expected_s, elapsed_s=elapsed, evidence=call.evidence,
            call_id=call.call_id, tool=call.tool, running_calls=len(judged),
            made_at_s=call.made_at_s, started_at_s=call.started_at_s, deadline_at_s=d_at,
        )  # fmt: skip

    def _combine(
        self, session_id: str, judged: list[tuple[ReadyReason, CallState, float | None]], now_s: float
    ) -> tuple[ReadyReason, CallState, float | None, bool]:
        """Parallel calls: ready only when all are; describe the binding call."""
        overdue = [j for j in judged if j[0] is ReadyReason.OVERDUE]
        others_ready = all(j[0] in READY_REASONS for j in judged if j[0] is not ReadyReason.OVERDUE)
        if overdue and others_ready and self.explorer.granted(session_id, overdue[0][1].call_id, now_s):
            judged = [(ReadyReason.EXPLORATION if r is ReadyReason.OVERDUE else r, c, d) for r, c, d in judged]
        ready = all(r in READY_REASONS for r, _, _ in judged)
        pool = judged if ready else [j for j in judged if j[0] not in READY_REASONS]
        reason, call, d_at = max(pool, key=lambda j: j[1].started_at_s + j[1].expected_s)
        if ready and any(r is ReadyReason.EXPLORATION for r, _, _ in judged):
            reason = ReadyReason.EXPLORATION
        return reason, call, d_at, ready

    def ready(self, session_id: str, now_s: float) -> bool:
        return self.predict(session_id, now_s).ready

    def call_prediction(self, session_id: str, call_id: str) -> Prediction | None:
        """The latest prediction of a call (None if unknown)."""
        s = self._sessions.get(session_id)
        if s is None:
            return None
        call = s.calls.get(call_id)
        if call is not None:
            return self._prediction(session_id, call, call.made_at_s, duplicate=False)
        done = s.done.get(call_id)
        return None if done is None else self._done_prediction(session_id, call_id, done, False)

    def _next_change_s(self, s: _Session, now_s: float) -> float:
        if not s.calls:
            t = (s.completed_at_s or -math.inf) + self.cfg.stale_after_s
            return just_after(t) if t > now_s else math.inf
        nxt = math.inf
        for call in s.calls.values():
            info = self.estimator.info_of(call)
            nxt = min(nxt, call_next_change_s(call, info, now_s, self.cfg))
            if self.cfg.exploration.probability > 0 and call_readiness(call, info, now_s, self.cfg)[0] is ReadyReason.OVERDUE:
                nxt = min(nxt, self.explorer.next_window_s(now_s))
        return nxt

    def advance(self, now_s: float) -> list[SessionPrediction]:
        """Sessions whose (ready, reason) changed since last reported, as of ``now_s``.

        Looks only at sessions touched by events and those whose scheduled change time
        has come, so the cost is proportional to changes, not to sessions.
        """
        return self.advance_all(now_s)[0]

    def advance_all(self, now_s: float) -> tuple[list[SessionPrediction], list[SessionPrediction]]:
        """Like ``advance``; also returns the re-evaluated sessions whose readiness did not
        change (sessions touched by events), as (changed, unchanged)."""
        due = self._touched
        self._touched = set()
        while self._wake and self._wake[0][0] <= now_s:
            t, sid = heapq.heappop(self._wake)
            if self._wake_at.get(sid) == t:
                del self._wake_at[sid]
                due.add(sid)
        changes: list[SessionPrediction] = []
        unchanged: list[SessionPrediction] = []
        for sid in sorted(due):
            s = self._sessions.get(sid)
            if s is None:
                self._published.pop(sid, None)
                continue
            sp = self.predict(sid, now_s)
            key = (sp.ready, sp.reason)
            if self._published.get(sid) != key:
                self._published[sid] = key
                changes.append(sp)
            else:
                unchanged.append(sp)
            nxt = self._next_change_s(s, now_s)
            if nxt < math.inf and self._wake_at.get(sid) != nxt:
                self._wake_at[sid] = nxt
                heapq.heappush(self._wake, (nxt, sid))
        return changes, unchanged

    def next_wakeup_s(self) -> float | None:
        """When ``advance`` next has work (None: nothing scheduled; -inf: events pending)."""
        if self._touched:
            return -math.inf
        while self._wake and self._wake_at.get(self._wake[0][1]) != self._wake[0][0]:
            heapq.heappop(self._wake)
        return self._wake[0][0] if self._wake else None

    # ------------------------------------------------------------------ lifecycle
    def sessions(self) -> list[str]:
        return list(self._sessions)

    def end_session(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is not None:
            self._dirty.add(session_id)
        self.explorer.forget(session_id)
        self._published.pop(session_id, None)
        self._wake_at.pop(session_id, None)

    def gc(self, now_s: float) -> list[str]:
        """Drop calls silent for ``call_ttl_s`` and sessions idle for ``session_ttl_s``."""
        removed: list[str] = []
        for sid, s in list(self._sessions.items()):
            for cid, call in list(s.calls.items()):
                if now_s - call.made_at_s > self.cfg.call_ttl_s:
                    del s.calls[cid]
                    self._dirty.add(sid)
            if not s.calls and now_s - s.last_event_s > self.cfg.session_ttl_s:
                self.end_session(sid)
                removed.append(sid)
        return removed

    # ------------------------------------------------------------------ persistence
    def session_state(self, session_id: str) -> dict[str, Any] | None:
        s = self._sessions.get(session_id)
        if s is None:
            return None
        return {
            "last_event_s": s.last_event_s,
            "completed_at_s": s.completed_at_s,
            "last_done": s.last_done,
            "calls": [call_to_dict(c) for c in s.calls.values()],
            # the command of a finished call is kept only while its start is unknown (to learn later)
            "done": [
                [cid, d.finished_at_s, d.started_at_s, d.tool]
                if d.started_at_s is not None
                else [cid, d.finished_at_s, None, d.tool, d.command, d.deadline_s]
                for cid, d in s.done.items()
            ],
        }

    def load_session(self, session_id: str, state: Mapping[str, Any]) -> None:
        """Install a session from ``session_state`` output (ValueError on malformed input)."""
        try:
            s = _Session(last_event_s=float(state["last_event_s"]))
            c = state.get("completed_at_s")
            s.completed_at_s = None if c is None else float(c)
            s.last_done = str(state.get("last_done", ""))
            for raw in state.get("calls", []):
                call = call_from_dict(raw)
                s.calls[call.call_id] = call
            for row in state.get("done", []):
                cid, fin, st, tool = row[:4]
                command, dl = (row[4], row[5]) if len(row) >= 6 else ("", None)
                s.done[str(cid)] = _Done(
                    float(fin), None if st is None else float(st), str(tool), str(command),
                    None if dl is None else float(dl),
                )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed state of session {session_id!r}: {exc}") from exc
        self._sessions[session_id] = s
        self._touched.add(session_id)

    def drain_dirty(self) -> DirtyState:
        sessions = {sid: self.session_state(sid) for sid in self._dirty}
        self._dirty.clear()
        history, evicted = self.history.drain_dirty()
        return DirtyState(sessions, history, frozenset(evicted))

    def to_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "sessions": {sid: self.session_state(sid) for sid in self._sessions},
            "history": self.history.to_dict(),
        }

    @classmethod
    def from_state(cls, config: PredictorConfig | None, state: Mapping[str, Any]) -> Predictor:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported predictor state version {state.get('version')!r}")
        p = cls(config)
        p.history.load(state.get("history", {}))
        for sid, sstate in state.get("sessions", {}).items():
            p.load_session(sid, sstate)
        return p
