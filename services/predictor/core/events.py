"""Tool events: the predictor's only input (DESIGN §5, "Tool events").

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
        """The DESIGN §5 JSONL object (absent optional fields are null)."""
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
            etype = EventType(data.get("type"))
        except ValueError:
            raise InvalidEventError(f"unknown event type {data.get('type')!r}") from None
        event = cls(
            t=_number(data, "t", required=True),  # type: ignore[arg-type]
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
        return event


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
    finished before it started) are found by ``Predictor.observe``.
    """
    if not isinstance(event.type, EventType):
        raise InvalidEventError(f"unknown event type {event.type!r}")
    for name in ("session_id", "call_id"):
        value: str = getattr(event, name)
        if not value:
            raise InvalidEventError(f"{name} is empty")
        if len(value) > limits.max_id_chars:
            raise InvalidEventError(f"{name} longer than {limits.max_id_chars} characters")
    if len(event.tool) > limits.max_tool_chars:
        raise InvalidEventError(f"tool name longer than {limits.max_tool_chars} characters")
    if len(event.command) > limits.max_command_chars:
        raise InvalidEventError(f"command longer than {limits.max_command_chars} characters")
    if event.type is EventType.STARTED and not event.tool:
        raise InvalidEventError("started event without a tool name")
    if not math.isfinite(event.t) or event.t < 0:
        raise InvalidEventError(f"timestamp t={event.t} is not a finite non-negative number")
    if now_s is not None and event.t > now_s + limits.max_future_s:
        raise InvalidEventError(
            f"timestamp t={event.t:.3f} is {event.t - now_s:.3f} s in the future (limit {limits.max_future_s} s)"
        )
    for name in ("deadline_s", "eta_s"):
        v: float | None = getattr(event, name)
        if v is not None:
            if not math.isfinite(v) or v < 0:
                raise InvalidEventError(f"{name}={v} is negative or not finite")
            if v > limits.max_duration_s:
                raise InvalidEventError(f"{name}={v} exceeds {limits.max_duration_s} s")
    if event.fraction is not None and not (0.0 <= event.fraction <= 1.0):
        raise InvalidEventError(f"fraction={event.fraction} is outside [0, 1]")
    if event.seq < 0:
        raise InvalidEventError(f"seq={event.seq} is negative")
