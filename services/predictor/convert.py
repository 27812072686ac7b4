"""The one place proto / JSON records and predictor-core types meet (thin-servicer pattern).

``PredictionRecord`` JSON is built as a plain dict on the hot path (pydantic is too slow for
tens of thousands of records a second); ``tests/unit/predictor`` checks every produced
dict validates as ``services.common.records.PredictionRecord``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from services.predictor.core import (
    EventType,
    Evidence,
    InvalidEventError,
    ReadyReason,
    SessionPrediction,
    ToolEvent,
)
from tao.predictor.v1 import predictor_pb2 as pb

_encode_str = json.encoder.encode_basestring_ascii

_TYPES = {
    pb.TOOL_EVENT_TYPE_STARTED: EventType.STARTED,
    pb.TOOL_EVENT_TYPE_PROGRESS: EventType.PROGRESS,
    pb.TOOL_EVENT_TYPE_FINISHED: EventType.FINISHED,
}
_TYPES_BACK = {v: k for k, v in _TYPES.items()}
_EVIDENCE = {
    "completed": pb.EVIDENCE_COMPLETED,
    "direct_timing": pb.EVIDENCE_DIRECT_TIMING,
    "deadline": pb.EVIDENCE_DEADLINE,
    "parsed_sleep": pb.EVIDENCE_PARSED_SLEEP,
    "tool_history": pb.EVIDENCE_TOOL_HISTORY,
    "global_history": pb.EVIDENCE_GLOBAL_HISTORY,
    "default": pb.EVIDENCE_DEFAULT,
}
#: ReadyReason -> the proto's ready_reason vocabulary
READY_REASON = {
    ReadyReason.COMPLETED: "completed",
    ReadyReason.PREDICTED: "due",
    ReadyReason.DEADLINE: "deadline",
    ReadyReason.EXPLORATION: "exploration",
    ReadyReason.PENDING: "not_due",
    ReadyReason.OVERDUE: "overdue",
    ReadyReason.STALE: "stale",
    ReadyReason.UNKNOWN: "unknown",
}


def event_from_proto(e: pb.ToolEvent, session_id: str | None = None, call_id: str | None = None) -> ToolEvent:
    """Core event from a proto event (``session_id``/``call_id`` when already read);
    ``InvalidEventError`` when its type is unset. Range checks (including non-finite
    numbers) happen in ``validate_event``."""
    etype = _TYPES.get(e.type)
    if etype is None:
        raise InvalidEventError(f"unknown event type {e.type}")
    has = e.HasField
    return ToolEvent(
        e.t_unix_s,
        e.session_id if session_id is None else session_id,
        e.call_id if call_id is None else call_id,
        etype, e.tool, e.command,
        e.deadline_s if has("deadline_s") else None,
        e.eta_s if has("eta_s") else None,
        e.fraction if has("fraction") else None,
        e.sequence,
    )  # fmt: skip


def event_to_proto(e: ToolEvent) -> pb.ToolEvent:
    out = pb.ToolEvent(
        session_id=e.session_id, call_id=e.call_id, sequence=e.seq, type=_TYPES_BACK[e.type],
        tool=e.tool, command=e.command, t_unix_s=e.t,
    )  # fmt: skip
    if e.deadline_s is not None:
        out.deadline_s = e.deadline_s
    if e.eta_s is not None:
        out.eta_s = e.eta_s
    if e.fraction is not None:
        out.fraction = e.fraction
    return out


def event_to_log(e: pb.ToolEvent) -> str:
    """An accepted event as stored in the durable event log (``store.py``): its proto bytes,
    base64 (the Redis client speaks text)."""
    return base64.b64encode(e.SerializeToString()).decode("ascii")


def event_from_log(raw: str) -> ToolEvent:
    return event_from_proto(pb.ToolEvent.FromString(base64.b64decode(raw)))


def record_dict(sp: SessionPrediction, epoch: str, rev: int) -> dict[str, Any]:
    """``PredictionRecord`` fields for a session prediction (times are Unix seconds)."""
    now = sp.now_s
    started = sp.started_at_s if sp.started_at_s is not None else now
    expected = sp.expected_s or 0.0
    return {
        "epoch": epoch,
        "rev": rev,
        "session_id": sp.session_id,
        "call_id": sp.call_id,
        "tool": sp.tool,
        "ready": sp.ready,
        "ready_reason": READY_REASON[sp.reason],
        "expected_duration_s": max(0.0, expected),
        "remaining_s": sp.remaining_s or 0.0,
        "elapsed_s": sp.elapsed_s or 0.0,
        "evidence": sp.evidence.kind if sp.evidence is not None else Evidence.DEFAULT.kind,
        "completed": sp.reason is ReadyReason.COMPLETED,
        "started_at_unix_s": started,
        "refreshed_at_unix_s": sp.made_at_s if sp.made_at_s is not None else now,
        "predicted_return_unix_s": started + expected,
        "deadline_unix_s": sp.deadline_at_s,
    }


def _js(text: str) -> str:
    return _encode_str(text)


def _jn(x: float | None) -> str:
    return "null" if x is None else repr(float(x))


def record_json(sp: SessionPrediction, epoch: str, rev: int) -> str:
    """``json.dumps(record_dict(...))`` written out by hand: this runs for every session
    touched by every ingested batch (tests check both agree)."""
    now = sp.now_s
    started = sp.started_at_s if sp.started_at_s is not None else now
    expected = max(0.0, sp.expected_s or 0.0)
    return (
        f'{{"epoch":{_js(epoch)},"rev":{rev},"session_id":{_js(sp.session_id)},"call_id":{_js(sp.call_id)},'
        f'"tool":{_js(sp.tool)},"ready":{"true" if sp.ready else "false"},'
        f'"ready_reason":"{READY_REASON[sp.reason]}","expected_duration_s":{_jn(expected)},'
        f'"remaining_s":{_jn(sp.remaining_s or 0.0)},"elapsed_s":{_jn(sp.elapsed_s or 0.0)},'
        f'"evidence":"{sp.evidence.kind if sp.evidence is not None else Evidence.DEFAULT.kind}",'
        f'"completed":{"true" if sp.reason is ReadyReason.COMPLETED else "false"},'
        f'"started_at_unix_s":{_jn(started)},'
        f'"refreshed_at_unix_s":{_jn(sp.made_at_s if sp.made_at_s is not None else now)},'
        f'"predicted_return_unix_s":{_jn(started + expected)},"deadline_unix_s":{_jn(sp.deadline_at_s)}}}'
    )


def prediction_to_proto(sp: SessionPrediction) -> pb.Prediction:
    return pb.Prediction(
        session_id=sp.session_id,
        call_id=sp.call_id,
        tool=sp.tool,
        ready=sp.ready,
        ready_reason=READY_REASON[sp.reason],
        expected_duration_s=sp.expected_s or 0.0,
        remaining_s=sp.remaining_s or 0.0,
        elapsed_s=sp.elapsed_s or 0.0,
        evidence=_EVIDENCE[sp.evidence.kind] if sp.evidence is not None else pb.EVIDENCE_UNSPECIFIED,
        refreshed_at_unix_s=sp.made_at_s if sp.made_at_s is not None else 0.0,
        stale=sp.reason is ReadyReason.STALE,
        completed=sp.reason is ReadyReason.COMPLETED,
    )


def ack(e: pb.ToolEvent, status: int, reason: str = "") -> pb.EventAck:
    return pb.EventAck(session_id=e.session_id, call_id=e.call_id, sequence=e.sequence, status=status, reason=reason)  # type: ignore[arg-type]
