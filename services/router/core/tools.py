"""Tool calls read from a replica's answers (pure: no I/O).

An answer that calls tools (``message.tool_calls``, or streamed ``delta.tool_calls``
fragments, with ``finish_reason`` ``"tool_calls"``) ends an LLM step whose session now runs
those tools. The router reports them to the predictor as tool events, so sessions whose
harness uses no ``ToolReporter`` still build per-tool duration history
(``services/router/tool_events.py``): ``started`` when the answer ends, ``finished`` when the
session's next request arrives (the tool's result comes with it).

What is reported is what a ``ToolReporter`` would report for the same call: the tool's
``name``, and as ``command`` the shell command of its arguments (``{"command": ...}`` or
``{"cmd": ...}``, a string or an argv list, as ``bash``/``execute``/``shell`` tools take it;
"" otherwise). The predictor parses that command itself (``services/predictor/core/command.py``,
``parse_command``) into its history keys, so the keys are the ones a ``ToolReporter`` reporting
``(name, command)`` gives. Call ids are ``INFERRED_CALL_PREFIX`` + the request id + the call's
index: the predictor lets a runner's own reports win over these (``core/predictor.py``).

A stream is looked at only when its request offered ``tools`` (``ParsedRequest.has_tools``;
without them no answer calls one), and then parsed only in the events whose bytes contain
``"tool_calls"`` (JSON escapes quotes inside strings, so those bytes only occur as a key or as
the finish reason): one substring search per relayed block, about as much as the usage check
the relay already makes (0.6 µs on a 200-byte event on the shared test machine).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from services.predictor.core.events import INFERRED_CALL_PREFIX

COMMAND_KEYS = ("command", "cmd")
MAX_CALLS = 64  # per answer; more is not a plausible agent step
MAX_ARGUMENT_CHARS = 65_536
MAX_COMMAND_CHARS = 16_384  # the predictor's EventLimits.max_command_chars
MAX_NAME_CHARS = 128  # the predictor's EventLimits.max_tool_chars


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an answer: the predictor's call id, the tool's name, its shell command."""

    call_id: str
    name: str
    command: str


def command_of(arguments: str) -> str:
    """The shell command in a tool call's JSON ``arguments`` ("" when there is none)."""
    try:
        args = json.loads(arguments) if arguments else None
    except ValueError:
        return ""
    if not isinstance(args, dict):
        return ""
    for key in COMMAND_KEYS:
        value = args.get(key)
        if isinstance(value, str):
            return value[:MAX_COMMAND_CHARS]
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return shlex.join(value)[:MAX_COMMAND_CHARS]
    return ""


def _call(request_id: str, index: int, name: str, arguments: str) -> ToolCall | None:
    if not name:
        return None
    return ToolCall(f"{INFERRED_CALL_PREFIX}{request_id}:{index}", name[:MAX_NAME_CHARS], command_of(arguments))


def calls_of_answer(request_id: str, answer: Any) -> tuple[ToolCall, ...]:
    """The tool calls of a non-streamed chat completion (the first choice's ``message``)."""
    if not isinstance(answer, dict):
        return ()
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ()
    message = choices[0].get("message")
    raw = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(raw, list) or not raw:
        return ()
    out = []
    for i, tc in enumerate(raw[:MAX_CALLS]):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            continue
        name, args = fn.get("name"), fn.get("arguments")
        call = _call(request_id, i, name if isinstance(name, str) else "",
                     args[:MAX_ARGUMENT_CHARS] if isinstance(args, str) else "")
        if call is not None:
            out.append(call)
    return tuple(out)


class StreamedCalls:
    """Tool calls assembled from a stream's ``delta.tool_calls`` fragments: each fragment
    names its call by ``index``; the first carries ``function.name``, later ones append to
    ``function.arguments`` (the OpenAI streaming format vLLM's tool parsers follow)."""

    __slots__ = ("_args", "_names", "finish_reason")

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._args: dict[int, list[str]] = {}
        self.finish_reason: str | None = None

    def feed(self, chunk: Any) -> None:
        """One parsed SSE chunk (``{"choices": [{"delta": {...}, "finish_reason": ...}]}``)."""
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason
        delta = choice.get("delta")
        fragments = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(fragments, list):
            return
        for frag in fragments:
            if not isinstance(frag, dict):
                continue
            index = frag.get("index", 0)
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_CALLS:
                continue
            fn = frag.get("function")
            if not isinstance(fn, dict):
                continue
            name = fn.get("name")
            if isinstance(name, str) and name:
                self._names[index] = self._names.get(index, "") + name
            args = fn.get("arguments")
            if isinstance(args, str) and args:
                parts = self._args.setdefault(index, [])
                if sum(map(len, parts)) < MAX_ARGUMENT_CHARS:
                    parts.append(args)

    def calls(self, request_id: str) -> tuple[ToolCall, ...]:
        out = []
        for index in sorted(self._names):
            call = _call(request_id, index, self._names[index], "".join(self._args.get(index, ())))
            if call is not None:
                out.append(call)
        return tuple(out)
