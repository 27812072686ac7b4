"""Tool events: the predictor's only input (docs/architecture.md#tool-events).

A tool call is ``started`` once, may report ``progress`` (ETA, fraction done, or just
"still running" — a heartbeat), and is ``finished`` once. Times ``t`` are seconds on the
timeline of whoever calls the predictor (Unix seconds in the service, virtual seconds in
replay and the simulator). ``deadline_s`` is relative to the call's start: the tool has
exposed that it returns at most that many seconds after it started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

#: call ids of calls the router inferred from an answer's ``tool_calls`` (services/router/core/tools.py);
#: a session's own runner reports (any other call id) win over them (``Predictor``)
INFERRED_CALL_PREFIX = "tao-router:"


class EventType(StrEnum):
    STARTED = "started"
    PROGRESS = "progress"
    FINISHED = "finished"


class InvalidEventError(ValueError):
    """An event that must be rejected; ``str(err)`` is the reason given back to the runner."""


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """One tool event. ``seq`` is the runner's per-call sequence number (the service dedupes
    on (session_id, call_id, seq); the core ignores it)."""

    t: float
    session_id: str
    call_id: str
    type: EventType
    tool: str = ""
    command: str = ""
    deadline_s: float | None = None
    eta_s: float | None = None
    fraction: float | None = None
    seq: int = 0

    def to_json(self) -> dict[str, Any]:
        """The JSONL object of the tool-event format (absent optional fields are null)."""
        return {
            "t": self.t,
            "session_id": self.session_id,
            "call_id": self.call_id,
            "type": self.type.value,
            "tool": self.tool,
            "command": self.command,
            "deadline_s": self.deadline_s,
            "eta_s": self.eta_s,
            "fraction": self.fraction,
            "seq": self.seq,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolEvent:
        """Parse a JSONL object; ``InvalidEventError`` with a precise reason on bad input."""
        if not isinstance(data, Mapping):
            raise InvalidEventError("event must be a JSON object")
        try:
            etype = EventType(str(data.get("type")))
        except ValueError:
            raise InvalidEventError(f"unknown event type {data.get('type')!r}") from None
        t = _number(data, "t", required=True)
        assert t is not None  # required=True raised otherwise
        return cls(
            t=t,
            session_id=_text(data, "session_id"),
            call_id=_text(data, "call_id"),
            type=etype,
            tool=_text(data, "tool"),
            command=_text(data, "command"),
            deadline_s=_number(data, "deadline_s"),
            eta_s=_number(data, "eta_s"),
            fraction=_number(data, "fraction"),
            seq=int(_number(data, "seq") or 0),
        )


def _text(data: Mapping[str, Any], name: str) -> str:
    value = data.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidEventError(f"{name} must be a string")
    return value


def _number(data: Mapping[str, Any], name: str, required: bool = False) -> float | None:
    value = data.get(name)
    if value is None:
        if required:
            raise InvalidEventError(f"{name} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidEventError(f"{name} must be a number")
    return float(value)


@dataclass(frozen=True, slots=True)
class EventLimits:
    """Bounds that make an event invalid (rejected, never applied)."""

    max_id_chars: int = 256
    max_tool_chars: int = 128
    max_command_chars: int = 16_384
    #: an event stamped further than this into the future of the predictor's clock is rejected
    max_future_s: float = 5.0
    #: deadlines/ETAs beyond this are not plausible tool timings
    max_duration_s: float = 7 * 86_400.0


def validate_event(event: ToolEvent, now_s: float | None, limits: EventLimits) -> None:
    """Raise ``InvalidEventError`` if ``event`` must be rejected.

    Checks what one event can show on its own; inconsistencies with earlier events (a call
    finished before it started) are found by ``Predictor.observe``. (Written flat: it runs
    for every ingested event.)
    """
    if event.type.__class__ is not EventType:
        raise InvalidEventError(f"unknown event type {event.type!r}")
    sid, cid, tool = event.session_id, event.call_id, event.tool
    if not sid:
        raise InvalidEventError("session_id is empty")
    if not cid:
        raise InvalidEventError("call_id is empty")
    max_id = limits.max_id_chars
    if len(sid) > max_id or len(cid) > max_id:
        raise InvalidEventError(f"session_id or call_id longer than {max_id} characters")
    if len(tool) > limits.max_tool_chars:
        raise InvalidEventError(f"tool name longer than {limits.max_tool_chars} characters")
    if len(event.command) > limits.max_command_chars:
        raise InvalidEventError(f"command longer than {limits.max_command_chars} characters")
    if not tool and event.type is EventType.STARTED:
        raise InvalidEventError("started event without a tool name")
    t = event.t
    if not (0.0 <= t < math.inf):
        raise InvalidEventError(f"timestamp t={t} is not a finite non-negative number")
    if now_s is not None and t > now_s + limits.max_future_s:
        raise InvalidEventError(
            f"timestamp t={t:.3f} is {t - now_s:.3f} s in the future (limit {limits.max_future_s} s)"
        )
    d, eta = event.deadline_s, event.eta_s
    if d is not None and not (0.0 <= d <= limits.max_duration_s):
        raise InvalidEventError(f"deadline_s={d} is negative, not finite or above {limits.max_duration_s} s")
    if eta is not None and not (0.0 <= eta <= limits.max_duration_s):
        raise InvalidEventError(f"eta_s={eta} is negative, not finite or above {limits.max_duration_s} s")
    f = event.fraction
    if f is not None and not (0.0 <= f <= 1.0):
        raise InvalidEventError(f"fraction={f} is outside [0, 1]")
    if event.seq < 0:
        raise InvalidEventError(f"seq={event.seq} is negative")
