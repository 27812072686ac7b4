"""Request validation and rewriting for the gateway (no I/O).

Checks what the router itself relies on and what is cheap to get right before anything
changes: the body is a JSON object; ``model`` a non-empty string; ``messages`` (chat) a
non-empty list of objects with a string ``role``, or ``prompt`` (completions) a string,
token list or list of those; ``stream`` a boolean; token limits positive integers; the
session fields and ``tao_synthetic`` (docs/simulation.md#synthetic-token-content) well
typed. Anything deeper is the replica's to judge (its 4xx is passed through). A failure
raises ``RequestError`` carrying an OpenAI-style error; nothing has been recorded at that point.

Rewriting for the upstream request: ThunderAgent's ``program_id`` (top level or inside a
literal ``extra_body`` object) is stripped; a streaming request gets
``stream_options.include_usage`` so the router sees usage (the final usage chunk is then
removed from the client's stream if the client did not ask for it). ``tao_synthetic`` is
forwarded untouched. When nothing changes the original bytes are forwarded as they came.

The shared prefix (``ParsedRequest.prefix_key``, ``prefix_tokens``): what a chat request shares
with other sessions' prompts, read by content: the model, the ``tools`` and the leading
``system`` / ``developer`` messages, which chat templates render first, so vLLM's prefix cache
holds them once for every session that sends them. The key is a CRC-32 and length of those parts
(the same in every router of a fleet); the tokens are estimated like the prompt's. A synthetic
request names its shared prefix (``tao_synthetic.shared_prefix_id`` and
``system_prompt_tokens``). A completions prompt has no such structure: no key.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import orjson

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English text ("1 token ~= 4 chars")
MAX_SESSION_ID_CHARS = 256


class RequestError(Exception):
    """An OpenAI-style client error."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | int | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def stream_error(message: str) -> bytes:
    """A failure after a stream's headers went out: an OpenAI-style error event, then [DONE]."""
    body = RequestError(502, message, code=502, type_="server_error").body()
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    model: str
    stream: bool
    client_wants_usage: bool
    session_id: str | None
    prompt_tokens_estimate: int
    max_tokens: int | None
    upstream_body: bytes
    #: the prompt's token count is known exactly (token ids or the synthetic extension),
    #: not estimated from characters: only then may the router judge the context length
    prompt_tokens_exact: bool = False
    #: the request offers ``tools``: only then can the answer call one (the relay looks for tool
    #: calls in the stream only then: services/router/core/tools.py)
    has_tools: bool = False
    #: what it shares with other sessions' prompts ("" = nothing known) and that part's
    #: estimated tokens (see the module docstring)
    prefix_key: str = ""
    prefix_tokens: int = 0


def _bad(message: str, param: str | None, code: str = "invalid_value") -> RequestError:
    return RequestError(400, message, param=param, code=code)


def _opt_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{key}' must be an integer, got {type(value).__name__}", key, "invalid_type")
    if value < minimum:
        raise _bad(f"'{key}' must be >= {minimum}, got {value}", key)
    return value


def check_session_id(value: object, param: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise _bad(f"'{param}' must be a string", param, "invalid_type")
    text = str(value)
    if not text or len(text) > MAX_SESSION_ID_CHARS or not text.isprintable():
        raise _bad(f"'{param}' must be 1-{MAX_SESSION_ID_CHARS} printable characters", param)
    return text


def _shared_prefix(model: str, messages: list[Any], tools: Any) -> tuple[str, int]:
    """The key and estimated tokens of a chat request's shared prefix: its model, ``tools`` and
    leading system / developer messages ("" and 0 when it has neither)."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    if lead == 0 and not tools:
        return "", 0
    tool_blob = orjson.dumps(tools) if tools else b""
    blob = orjson.dumps([model, messages[:lead]]) + tool_blob
    tokens = _estimate_chat(messages[:lead]) + len(tool_blob) // CHARS_PER_TOKEN
    return f"{zlib.crc32(blob):08x}{len(blob):x}", tokens


def _estimate_chat(messages: list[Any]) -> int:
    chars = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    chars += len(part["text"])
        chars += 16  # role and chat-template tokens
    return chars // CHARS_PER_TOKEN


def _is_id_list(value: Any) -> bool:
    """A non-empty list of token ids."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value))


def _token_ids(prompt: Any) -> bool:
    """A (checked) prompt of token ids, or a batch of them: its length is exact."""
    return _is_id_list(prompt) or (isinstance(prompt, list) and bool(prompt) and all(_is_id_list(p) for p in prompt))


def _estimate_prompt(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt) // CHARS_PER_TOKEN
    if _is_id_list(prompt):
        return len(prompt)
    return max((_estimate_prompt(p) for p in prompt), default=0)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str) or _is_id_list(prompt):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or all(_is_id_list(p) for p in prompt):
            return
    raise _bad("'prompt' must be a string, a list of strings, or a (list of) token id list", "prompt",
               "invalid_type")


def _synthetic_prompt(body: dict[str, Any]) -> tuple[int, str, int] | None:
    """A synthetic request's (prompt tokens, shared prefix key, its tokens), checked; None when
    the request is not synthetic."""
    syn = body.get("tao_synthetic")
    if syn is None:
        return None
    if not isinstance(syn, dict):
        raise _bad("'tao_synthetic' must be an object", "tao_synthetic", "invalid_type")
    for key in ("prompt_tokens", "system_prompt_tokens"):
        v = syn.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _bad(f"'tao_synthetic.{key}' must be a non-negative integer", f"tao_synthetic.{key}",
                       "invalid_type")
    if not isinstance(syn.get("session_id", ""), str):
        raise _bad("'tao_synthetic.session_id' must be a string", "tao_synthetic.session_id", "invalid_type")
    spi = syn.get("shared_prefix_id")
    if spi is not None and not isinstance(spi, str):
        raise _bad("'tao_synthetic.shared_prefix_id' must be a string or null", "tao_synthetic.shared_prefix_id",
                   "invalid_type")
    if not spi:
        return int(syn.get("prompt_tokens", 0)), "", 0
    return int(syn.get("prompt_tokens", 0)), f"synthetic:{spi}", int(syn.get("system_prompt_tokens", 0))


def parse_request(raw: bytes, chat: bool) -> ParsedRequest:
    """Validate a /v1/chat/completions (``chat``) or /v1/completions body; see module doc."""
    try:
        body = orjson.loads(raw)  # ~3x json.loads on agent-sized bodies (docs/benchmarks.md)
    except ValueError as exc:  # orjson.JSONDecodeError: bad JSON, bad UTF-8, NaN, nested over 1024 deep
        if str(exc).startswith("depth limit"):
            raise RequestError(400, "The JSON body of your request is nested too deeply.", code="invalid_json") from None
        raise RequestError(400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model",
                   "missing_required_parameter" if model is None else "invalid_type")
    if chat:
        messages = body.get("messages")
        if messages is None:
            raise _bad("'messages' is a required property", "messages", "missing_required_parameter")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty array", "messages", "invalid_type")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}]",
                           "invalid_type")
        estimate = _estimate_chat(messages)
        exact = False
        prefix_key, prefix_tokens = _shared_prefix(model, messages, body.get("tools"))
    else:
        if "prompt" not in body:
            raise _bad("'prompt' is a required property", "prompt", "missing_required_parameter")
        _check_prompt(body["prompt"])
        estimate = _estimate_prompt(body["prompt"])
        exact = _token_ids(body["prompt"])
        prefix_key, prefix_tokens = "", 0
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
    include = (options or {}).get("include_usage", False)
    if include is not None and not isinstance(include, bool):
        raise _bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage",
                   "invalid_type")
    max_tokens = _opt_int(body, "max_tokens", 1)
    max_completion = _opt_int(body, "max_completion_tokens", 1)
    _opt_int(body, "n", 1)
    limit = max_completion if max_completion is not None else max_tokens
    synthetic = _synthetic_prompt(body)
    if synthetic is not None:
        estimate, prefix_key, prefix_tokens = synthetic
        exact = True

    changed = False
    session_id: str | None = None
    if "program_id" in body:
        session_id = check_session_id(body.pop("program_id"), "program_id")
        changed = True
    extra = body.get("extra_body")
    if extra is not None:
        if not isinstance(extra, dict):
            raise _bad("'extra_body' must be an object", "extra_body", "invalid_type")
        if "program_id" in extra:
            pid = check_session_id(extra.pop("program_id"), "extra_body.program_id")
            session_id = session_id or pid
            changed = True
            if not extra:
                del body["extra_body"]
    has_tools = chat and bool(body.get("tools"))
    if stream and not include:
        plain = raw.lstrip().startswith(b"{") and raw.rstrip().endswith(b"}")  # UTF-8, one object
        if options is None and not changed and plain and "stream_options" not in body:
            # the common case, without re-encoding the whole body: append the member
            head = raw.rstrip()[:-1].rstrip()
            sep = b"" if head.endswith(b"{") else b","
            return ParsedRequest(model, stream, False, session_id, estimate, limit,
                                 head + sep + b'"stream_options":{"include_usage":true}}', exact, has_tools,
                                 prefix_key, prefix_tokens)
        body["stream_options"] = {**(options or {}), "include_usage": True}
        changed = True
    upstream = orjson.dumps(body) if changed else raw
    return ParsedRequest(model, stream, bool(include), session_id, estimate, limit, upstream, exact, has_tools,
                         prefix_key, prefix_tokens)


def check_context(parsed: ParsedRequest, max_model_len: int | None) -> None:
    """Reject, as vLLM would, a request that cannot fit the model's context on any replica:
    ``max_tokens`` alone beyond it, or (when the prompt's length is exact) prompt ≥ context or
    prompt + ``max_tokens`` beyond it. Without this the request would be held until the hold
    timeout (its footprint fits no replica) or create a session the replica then refuses.
    Character-estimated prompts are left to the replica (its tokenizer decides)."""
    if max_model_len is None:
        return
    n, limit = parsed.prompt_tokens_estimate, parsed.max_tokens
    if parsed.prompt_tokens_exact and n >= max_model_len:
        raise _bad(f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                   f"{n} input tokens. Please reduce the length of the input.", "messages",
                   "context_length_exceeded")
    if limit is not None and (limit > max_model_len or (parsed.prompt_tokens_exact and n + limit > max_model_len)):
        shown = n if parsed.prompt_tokens_exact else 0
        raise _bad(f"'max_tokens' or 'max_completion_tokens' is too large: {limit}. This model's maximum "
                   f"context length is {max_model_len} tokens and your request has at least {shown} input "
                   f"tokens ({limit} > {max_model_len} - {shown}).", "max_tokens", "context_length_exceeded")
