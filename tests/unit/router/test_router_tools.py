"""Tool calls read from answers (services/router/core/tools.py), the relay's incremental
parsing of streamed ``delta.tool_calls`` fragments, and the predictor's rule that a runner's
own reports win over the calls the router inferred."""

from __future__ import annotations

import json
from typing import Any, cast

from services.predictor.core import EventType, Predictor, ToolEvent
from services.predictor.core.events import INFERRED_CALL_PREFIX
from services.router.core.tools import StreamedCalls, ToolCall, calls_of_answer, command_of
from services.router.relay import StreamRelay
from services.router.validation import parse_request


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _delta(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _event({"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_command_of_arguments() -> None:
    assert command_of('{"command": "pytest -x tests/a.py"}') == "pytest -x tests/a.py"
    assert command_of('{"cmd": ["bash", "-lc", "make -j4 && ls"]}') == "bash -lc 'make -j4 && ls'"
    assert command_of('{"path": "/a", "old_str": "x"}') == ""
    assert command_of('{"command": 3}') == "" and command_of("not json") == "" and command_of("") == ""
    assert command_of('["pytest"]') == ""


def test_calls_of_a_non_streamed_answer() -> None:
    answer = {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -la"}'}},
        {"id": "y", "type": "function", "function": {"name": "finish", "arguments": "{}"}},
        {"id": "z", "type": "function", "function": {"arguments": "{}"}},  # no name: not a call
    ]}, "finish_reason": "tool_calls"}]}
    assert calls_of_answer("r1", answer) == (ToolCall(f"{INFERRED_CALL_PREFIX}r1:0", "bash", "ls -la"),
                                             ToolCall(f"{INFERRED_CALL_PREFIX}r1:1", "finish", ""))
    plain = {"choices": [{"message": {"content": "hi", "tool_calls": []}, "finish_reason": "stop"}]}
    assert calls_of_answer("r1", plain) == () and calls_of_answer("r1", None) == ()
    assert calls_of_answer("r1", {"choices": "x"}) == ()


def test_streamed_fragments_assemble_two_parallel_calls() -> None:
    acc = StreamedCalls()
    acc.feed({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    acc.feed({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": "a", "type": "function", "function": {"name": "bash", "arguments": ""}}]}}]})
    for piece in ['{"comm', 'and": "pyt', 'est -q"}']:
        acc.feed({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}}]})
    acc.feed({"choices": [{"delta": {"tool_calls": [
        {"index": 1, "id": "b", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]}}]})
    acc.feed({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    acc.feed({"choices": [{"delta": {"tool_calls": [{"index": "bad"}, "x", {"index": 99}]}}]})  # ignored
    assert acc.finish_reason == "tool_calls"
    assert acc.calls("r") == (ToolCall(f"{INFERRED_CALL_PREFIX}r:0", "bash", "pytest -q"),
                              ToolCall(f"{INFERRED_CALL_PREFIX}r:1", "read_file", ""))


def test_relay_reads_tool_calls_from_events_split_anywhere() -> None:
    body = (_delta({"role": "assistant", "content": ""})
            + _delta({"tool_calls": [{"index": 0, "id": "a", "type": "function",
                                      "function": {"name": "bash", "arguments": ""}}]})
            + b"".join(_delta({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                       for p in ['{"command"', ': "sleep', ' 3"}'])
            + _delta({}, "tool_calls") + b"data: [DONE]\n\n")
    for size in (1, 7, 64, len(body)):
        relay = StreamRelay(cast(Any, None), strip_usage=False, now=lambda: 0.0)
        relay.tools = StreamedCalls()  # the request offered tools (ParsedRequest.has_tools)
        for i in range(0, len(body), size):
            relay.feed(body[i:i + size])
        assert relay.saw_done and b"".join(relay.pending) + relay.final == body  # relayed unchanged
        assert relay.tools is not None and relay.tools.calls("r") == (
            ToolCall(f"{INFERRED_CALL_PREFIX}r:0", "bash", "sleep 3"),)
    text = StreamRelay(cast(Any, None), strip_usage=False, now=lambda: 0.0)
    text.tools = StreamedCalls()
    text.feed(_delta({"content": 'he said "tool_calls" twice'}) + b"data: [DONE]\n\n")
    assert text.tools.calls("r") == ()  # escaped quotes never match the key
    plain = StreamRelay(cast(Any, None), strip_usage=False, now=lambda: 0.0)  # no tools offered: never parsed
    plain.feed(body)
    assert plain.tools is None and plain.saw_done


def test_only_chat_requests_offering_tools_are_looked_at() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert parse_request(json.dumps({**base, "tools": [{"type": "function"}]}).encode(), chat=True).has_tools
    assert not parse_request(json.dumps(base).encode(), chat=True).has_tools
    assert not parse_request(json.dumps({**base, "tools": []}).encode(), chat=True).has_tools


def _ev(t: float, kind: EventType, cid: str, sid: str = "s") -> ToolEvent:
    return ToolEvent(t, sid, cid, kind, "bash", "make" if kind is EventType.STARTED else "")


def test_runner_reports_win_over_inferred_calls() -> None:
    p = Predictor()
    inferred = f"{INFERRED_CALL_PREFIX}r:0"
    assert p.apply(_ev(0.0, EventType.STARTED, inferred))  # nobody else reports: applied
    assert p.apply(_ev(1.0, EventType.STARTED, "own"))  # the runner's call drops the inferred one, unlearned
    assert p.session_state("s") is not None and inferred not in json.dumps(p.session_state("s"))
    assert not p.apply(_ev(2.0, EventType.FINISHED, inferred))  # ignored: answered as a duplicate
    assert p.apply(_ev(3.0, EventType.FINISHED, "own"))
    assert not p.apply(_ev(4.0, EventType.STARTED, f"{INFERRED_CALL_PREFIX}r:1"))
    other = Predictor()  # a session without runner reports learns from inferred calls
    other.apply(_ev(0.0, EventType.STARTED, inferred))
    other.apply(_ev(5.0, EventType.FINISHED, inferred))
    key = other.estimator.info("bash", "make").key_command
    history = other.history.get(key)
    assert history is not None and len(history) == 1
