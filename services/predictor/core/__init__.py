"""Pure predictor core: tool events -> expected durations and readiness
(docs/algorithms.md#predictor-evidence-hierarchy).

No I/O, no clock reads: times come in with events and queries. Public API::

    p = Predictor(PredictorConfig())
    pred: Prediction = p.observe(ToolEvent(t, session_id, call_id, EventType.STARTED, tool, command))
    p.apply(event, now_s) -> bool                  # observe() without building the Prediction
    sp: SessionPrediction = p.predict(session_id, now_s)
    p.ready(session_id, now_s) -> bool
    p.advance(now_s) -> list[SessionPrediction]   # readiness changes since last call
    p.next_wakeup_s() -> float | None              # when advance() next has work
    p.to_state() / Predictor.from_state(config, state); p.drain_dirty()
"""

from services.predictor.core.command import ParsedCommand, parse_command, parse_duration_s
from services.predictor.core.config import ExplorationConfig, PredictorConfig
from services.predictor.core.events import (
    EventLimits,
    EventType,
    InvalidEventError,
    ToolEvent,
    validate_event,
)
from services.predictor.core.history import DurationHistory, HistoryStore
from services.predictor.core.model import Evidence, Prediction, ReadyReason, SessionPrediction
from services.predictor.core.predictor import DirtyState, Predictor

__all__ = [
    "DirtyState",
    "DurationHistory",
    "EventLimits",
    "EventType",
    "Evidence",
    "ExplorationConfig",
    "HistoryStore",
    "InvalidEventError",
    "ParsedCommand",
    "Prediction",
    "Predictor",
    "PredictorConfig",
    "ReadyReason",
    "SessionPrediction",
    "ToolEvent",
    "parse_command",
    "parse_duration_s",
    "validate_event",
]
