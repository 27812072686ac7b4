"""Outputs of the predictor core (frozen) and the names of evidence and readiness reasons."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Evidence(StrEnum):
    """What produced an expected duration Ê, strongest first
    (docs/algorithms.md#predictor-evidence-hierarchy)."""

    COMPLETED = "completed"  # the call finished: Ê is its measured duration
    ETA = "eta"  # the tool reported seconds remaining
    FRACTION = "fraction"  # the tool reported fraction done; extrapolated from elapsed time
    DEADLINE = "deadline"  # an exposed return deadline (event deadline_s or `timeout N`)
    SLEEP = "sleep"  # a sleep parsed from the command, plus the learned residual
    SESSION_COMMAND_HISTORY = "session_command_history"  # same session + tool + command
    COMMAND_HISTORY = "command_history"  # same tool + same normalised command
    SHAPE_HISTORY = "shape_history"  # same tool + command with numbers masked
    TARGET_HISTORY = "target_history"  # same tool + test runner + what it runs (paths, -k), any flags
    PLACE_HISTORY = "place_history"  # same tool + test runner + kind of target + its directories
    SCOPE_HISTORY = "scope_history"  # same tool + test runner + kind of target (a test, a file, all)
    PROGRAM_HISTORY = "program_history"  # same tool + same program (pytest, make, grep)
    TOOL_HISTORY = "tool_history"  # same tool name
    GLOBAL_HISTORY = "global_history"  # every tool
    DEFAULT = "default"  # nothing known: the configured default (5 s)

    @property
    def kind(self) -> str:
        """The coarse name stored in ``PredictionRecord.evidence``."""
        return _KIND[self]

    @property
    def is_history(self) -> bool:
        return self in _HISTORY


_HISTORY = frozenset(
    {
        Evidence.SESSION_COMMAND_HISTORY,
        Evidence.COMMAND_HISTORY,
        Evidence.SHAPE_HISTORY,
        Evidence.TARGET_HISTORY,
        Evidence.PLACE_HISTORY,
        Evidence.SCOPE_HISTORY,
        Evidence.PROGRAM_HISTORY,
        Evidence.TOOL_HISTORY,
        Evidence.GLOBAL_HISTORY,
    }
)
_KIND = {
    Evidence.COMPLETED: "completed",
    Evidence.ETA: "direct_timing",
    Evidence.FRACTION: "direct_timing",
    Evidence.DEADLINE: "deadline",
    Evidence.SLEEP: "parsed_sleep",
    Evidence.SESSION_COMMAND_HISTORY: "tool_history",
    Evidence.COMMAND_HISTORY: "tool_history",
    Evidence.SHAPE_HISTORY: "tool_history",
    Evidence.TARGET_HISTORY: "tool_history",
    Evidence.PLACE_HISTORY: "tool_history",
    Evidence.SCOPE_HISTORY: "tool_history",
    Evidence.PROGRAM_HISTORY: "tool_history",
    Evidence.TOOL_HISTORY: "tool_history",
    Evidence.GLOBAL_HISTORY: "global_history",
    Evidence.DEFAULT: "default",
}


class ReadyReason(StrEnum):
    """Why a session is (not) ready. The first four mean ready."""

    COMPLETED = "completed"  # its tool calls finished (a request is about to come)
    PREDICTED = "predicted"  # predicted completion within the horizon
    DEADLINE = "deadline"  # exposed deadline within the horizon
    EXPLORATION = "exploration"  # overdue, granted a bounded exploration window
    PENDING = "pending"  # predicted completion later than the horizon
    OVERDUE = "overdue"  # past its predicted completion, no exploration granted
    STALE = "stale"  # nothing refreshed within stale_after_s: the prediction does not count
    UNKNOWN = "unknown"  # no event seen for this session

    @property
    def ready(self) -> bool:
        return self in READY_REASONS


READY_REASONS = frozenset({ReadyReason.COMPLETED, ReadyReason.PREDICTED, ReadyReason.DEADLINE, ReadyReason.EXPLORATION})


@dataclass(frozen=True, slots=True)
class Prediction:
    """The prediction made for one call when one of its events was observed.

    Invariants: ``remaining_s == max(0, expected_s - elapsed_s)``; ``completed`` iff
    ``evidence is Evidence.COMPLETED``; times are on the events' timeline.
    """

    session_id: str
    call_id: str
    tool: str
    made_at_s: float
    started_at_s: float
    elapsed_s: float
    expected_s: float
    remaining_s: float
    evidence: Evidence
    deadline_at_s: float | None = None
    completed: bool = False
    #: the event repeated one already applied (or arrived after the call finished): no change
    duplicate: bool = False

    @property
    def predicted_return_s(self) -> float:
        return self.started_at_s + self.expected_s


@dataclass(frozen=True, slots=True)
class SessionPrediction:
    """A session's readiness at ``now_s`` (docs/algorithms.md#readiness).

    ``ready`` iff ``reason.ready``. With several calls running in parallel the session is
    ready only when all are; the fields describe the *binding* call (the one that returns
    last, or the first that is not ready). ``remaining_s`` is None when nothing counts
    (unknown or stale).
    """

    session_id: str
    now_s: float
    ready: bool
    reason: ReadyReason
    remaining_s: float | None = None
    expected_s: float | None = None
    elapsed_s: float | None = None
    evidence: Evidence | None = None
    call_id: str = ""
    tool: str = ""
    running_calls: int = 0
    made_at_s: float | None = None
    started_at_s: float | None = None
    deadline_at_s: float | None = None
