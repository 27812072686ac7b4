"""Deterministic tool calls of the emulated replica.

When a chat request carries ``tools`` (and ``tool_choice`` is not ``"none"``) and its last
message is from the user, the emulator answers with one call of the first tool, as a model
that always acts first would: ``finish_reason`` ``"tool_calls"``, ``message.tool_calls`` (or,
streamed, ``delta.tool_calls`` fragments: the first with the call's ``index``, ``id``,
``type`` and ``function.name``, then ``function.arguments`` a token at a time, as vLLM's tool
parsers stream them). The arguments are ``{"command": <the user message's text>}`` when the
tool's JSON schema has a ``command`` (or ``cmd``) property, else ``{}``: a test picks the
shell command a ``bash``/``execute`` tool runs by what it writes in the user message. After a
``tool`` message the model answers in text as usual, so an agent loop ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.sim.engine.tokens import stable_key

COMMAND_KEYS = ("command", "cmd")


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    call_id: str
    name: str
    #: the arguments' JSON text
    arguments: str

    def message(self, arguments: str | None = None) -> dict[str, Any]:
        """The ``tool_calls`` entry of a non-streamed answer (``arguments``: the text generated)."""
        return {"id": self.call_id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments if arguments is None else arguments}}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def plan_tool_call(body: dict[str, Any]) -> ToolCallPlan | None:
    """The call the emulator makes for this (validated) chat request, or None (a text answer)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    if last.get("role") != "user":
        return None
    first = tools[0]
    fn = first.get("function") if isinstance(first, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        return None
    params = fn.get("parameters") if isinstance(fn, dict) else None
    props = params.get("properties") if isinstance(params, dict) else None
    args: dict[str, str] = {}
    if isinstance(props, dict):
        key = next((k for k in COMMAND_KEYS if k in props), None)
        if key is not None:
            args[key] = _text(last.get("content"))
    arguments = json.dumps(args)
    call_id = f"call_{stable_key(f'{len(messages)}:{name}:{arguments}') % (1 << 48):012x}"
    return ToolCallPlan(call_id, name, arguments)
