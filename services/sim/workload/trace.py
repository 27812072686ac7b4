"""The agent-workload trace format (docs/architecture.md#trace-format) and its validator.

A trace is JSONL, one session per line::

    {"session_id": "swe-lite-0000", "tenant": "default", "arrival_s": 0.0,
     "system_prompt_tokens": 120, "shared_prefix_id": "mini-swe-agent/system",
     "turns": [{"append_tokens": 1650, "output_tokens": 210,
                "tool": {"name": "bash", "command": "grep -rn ...", "duration_s": 0.12,
                         "deadline_s": 60.0}},
               ...,
               {"append_tokens": 90, "output_tokens": 140, "tool": null}]}

Semantics (the simulator and the e2e driver both rely on them):
- Turn 0's prompt is the system prompt (``system_prompt_tokens``, content shared by every
  session with the same ``shared_prefix_id``) plus ``append_tokens``.
- Turn i > 0's prompt is turn i-1's prompt + turn i-1's output + turn i's ``append_tokens``
  (the tool observation and the harness's wrapping), so prompts only ever grow.
- After turn i's output, turn i's tool runs ``duration_s``, then turn i+1 is sent.
  The last turn has ``tool: null``; every other turn has a tool.
- Tool hints are what a real runner would expose: ``deadline_s`` (the tool returns at the
  latest this long after it started: a harness timeout, a ``timeout N`` wrapper, a
  requested wait), ``progress`` (events the runner emits while the tool runs, each at
  ``after_s`` seconds after the start, with a fraction done and/or an ETA in seconds), and
  the ``command`` itself (``sleep N`` is parseable). Hints may be loose but are never
  later than the truth: every progress event happens before the tool finishes.

Loading validates every line and raises ``TraceError`` naming the line and field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NonNegInt = Annotated[int, Field(ge=0, strict=True)]
PosInt = Annotated[int, Field(ge=1, strict=True)]


class TraceError(ValueError):
    """A trace line or file that does not follow the format; the message names where."""


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return value


class ProgressEvent(BaseModel):
    """One progress report from a running tool (fraction done and/or an ETA)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after_s: float = Field(ge=0.0, description="seconds after the tool started")
    fraction: float | None = Field(default=None, gt=0.0, le=1.0, description="fraction done")
    eta_s: float | None = Field(default=None, ge=0.0, description="runner's remaining-time estimate")

    @field_validator("after_s", "eta_s")
    @classmethod
    def _check_finite(cls, v: float | None) -> float | None:
        return None if v is None else _finite(v, "value")

    @model_validator(mode="after")
    def _has_signal(self) -> ProgressEvent:
        if self.fraction is None and self.eta_s is None:
            raise ValueError("a progress event needs fraction or eta_s")
        return self


class Tool(BaseModel):
    """The tool call that follows a turn's output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    command: str = Field(max_length=4096)
    duration_s: float = Field(ge=0.0, description="true wall time of the tool")
    deadline_s: float | None = Field(default=None, gt=0.0, description="returns by then (hint)")
    progress: tuple[ProgressEvent, ...] | None = None

    @field_validator("duration_s", "deadline_s")
    @classmethod
    def _check_finite(cls, v: float | None) -> float | None:
        return None if v is None else _finite(v, "value")

    @model_validator(mode="after")
    def _progress_before_end(self) -> Tool:
        if self.progress:
            last = -1.0
            for i, ev in enumerate(self.progress):
                if ev.after_s < last:
                    raise ValueError(f"progress[{i}].after_s goes backwards ({ev.after_s} < {last})")
                if ev.after_s > self.duration_s:
                    raise ValueError(
                        f"progress[{i}].after_s={ev.after_s} is after the tool ends (duration_s={self.duration_s})"
                    )
                last = ev.after_s
        return self


class Turn(BaseModel):
    """One LLM call: new prompt tokens, the output length, then the tool (None on the last turn)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    append_tokens: NonNegInt
    output_tokens: PosInt
    tool: Tool | None


class TraceSession(BaseModel):
    """One agent task: an arrival, a system prompt and a sequence of turns. (Not a serving
    session: the router's is ``services/router/core/model.py`` ``Session``.)"""

    #: the trace format's JSON schema keeps its published title (``tao workload generate --schema``)
    model_config = ConfigDict(extra="forbid", frozen=True, title="Session")

    session_id: str = Field(min_length=1, max_length=256)
    tenant: str = Field(min_length=1, max_length=128)
    arrival_s: float = Field(ge=0.0)
    system_prompt_tokens: NonNegInt
    shared_prefix_id: str | None = Field(default=None, min_length=1, max_length=256)
    turns: tuple[Turn, ...] = Field(min_length=1)

    @field_validator("arrival_s")
    @classmethod
    def _check_finite(cls, v: float) -> float:
        return _finite(v, "arrival_s")

    @model_validator(mode="after")
    def _tools_between_turns(self) -> TraceSession:
        last = len(self.turns) - 1
        for i, turn in enumerate(self.turns):
            if i < last and turn.tool is None:
                raise ValueError(f"turns[{i}].tool is null but only the last turn ({last}) may have no tool")
            if i == last and turn.tool is not None:
                raise ValueError(f"turns[{i}] is the last turn and must have tool: null")
        if self.system_prompt_tokens + self.turns[0].append_tokens < 1:
            raise ValueError("turn 0 has an empty prompt (system_prompt_tokens + append_tokens == 0)")
        return self

    # ---- derived quantities (exact integers) ----
    def prompt_tokens(self, turn: int) -> int:
        """Prompt length of ``turn`` (system prompt + all earlier appends and outputs + this append)."""
        total = self.system_prompt_tokens
        for i in range(turn + 1):
            total += self.turns[i].append_tokens
            if i < turn:
                total += self.turns[i].output_tokens
        return total

    def total_output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    def total_tool_s(self) -> float:
        return sum(t.tool.duration_s for t in self.turns if t.tool is not None)


def _format_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(".[", "[")
        parts.append(f"{loc or '<session>'}: {err['msg']}")
    return "; ".join(parts)


def parse_session(obj: Any, where: str = "<session>") -> TraceSession:
    """Validate one decoded JSON object; raise ``TraceError`` prefixed with ``where``."""
    try:
        return TraceSession.model_validate(obj)
    except ValidationError as exc:
        raise TraceError(f"{where}: {_format_error(exc)}") from None


def parse_lines(lines: Iterable[str], source: str = "<trace>") -> list[TraceSession]:
    """Parse JSONL text; blank lines are skipped; session ids must be unique."""
    sessions: list[TraceSession] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        session = parse_session(obj, where)
        if session.session_id in seen:
            raise TraceError(
                f"{where}: duplicate session_id {session.session_id!r} (first on line {seen[session.session_id]})"
            )
        seen[session.session_id] = lineno
        sessions.append(session)
    if not sessions:
        raise TraceError(f"{source}: the trace has no sessions")
    return sessions


def load_trace(path: str | Path) -> list[TraceSession]:
    """Read and validate a JSONL trace file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{p}: cannot read trace ({exc.strerror})") from None
    return parse_lines(text.splitlines(), source=str(p))


def session_to_json(session: TraceSession) -> dict[str, Any]:
    """The JSON object of one trace line (optional fields left out when absent)."""
    return session.model_dump(mode="json", exclude_none=True, exclude={"turns"}) | {
        "turns": [
            {
                "append_tokens": t.append_tokens,
                "output_tokens": t.output_tokens,
                "tool": None if t.tool is None else t.tool.model_dump(mode="json", exclude_none=True),
            }
            for t in session.turns
        ]
    }


def dump_lines(sessions: Iterable[TraceSession]) -> Iterator[str]:
    for s in sessions:
        yield json.dumps(session_to_json(s), separators=(",", ":"), sort_keys=False)


def write_trace(sessions: Iterable[TraceSession], path: str | Path) -> int:
    """Write sessions as JSONL; return the number written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for line in dump_lines(sessions):
            fh.write(line + "\n")
            n += 1
    return n


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of one trace line."""
    return TraceSession.model_json_schema()
