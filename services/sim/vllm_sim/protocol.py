"""OpenAI/vLLM request validation and response shapes of the emulated replica.

Shapes follow vLLM's OpenAI server (``vllm/entrypoints/openai/protocol.py``, ``serving_chat.py``,
``serving_completion.py``): errors are ``{"error": {"message", "type", "param", "code"}}`` with
``code`` the HTTP status; stream chunks are serialised like vLLM's ``exclude_unset`` dumps;
``usage.prompt_tokens_details.cached_tokens`` appears only when > 0 (vLLM with
``--enable-prompt-tokens-details``).

Synthetic-content extension (``tao_synthetic``, docs/simulation.md#synthetic-token-content):
see ``SyntheticSpec``. It is read from the top-level ``tao_synthetic`` object, else from OpenAI's
``metadata`` map as the JSON text of that object (``metadata.tao_synthetic``): routers that
rebuild the request from their own schema (sglang-router) drop unknown top-level fields but
keep ``metadata``, the one free-form field of the OpenAI API (string values).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.sim.engine import length_violation
from services.sim.vllm_sim.tokenizer import apply_chat_template, encode


class ApiError(Exception):
    """An error answered as an OpenAI-style body with ``status``."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """Synthetic content: prompt token i = f(shared_prefix_id if i < system_prompt_tokens else session_id, i)."""

    session_id: str
    prompt_tokens: int
    shared_prefix_id: str | None
    system_prompt_tokens: int


@dataclass(frozen=True, slots=True)
class GenRequest:
    kind: str  # "chat" | "completion"
    model: str
    prompt_ids: tuple[int, ...]  # empty for synthetic requests
    synthetic: SyntheticSpec | None
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool

    @property
    def prompt_len(self) -> int:
        return self.synthetic.prompt_tokens if self.synthetic else len(self.prompt_ids)


def _validation(cls: str, field: str, msg: str) -> ApiError:
    # Mirrors pydantic's text, which vLLM returns as the message of a 400.
    return bad_request(f"1 validation error for {cls}\n{field}\n  {msg}", field)


def _int_field(body: dict[str, Any], key: str, cls: str, default: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise _validation(cls, key, "Input should be a valid integer")
    return int(v)


def _bool_field(body: dict[str, Any], key: str, cls: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _validation(cls, key, "Input should be a valid boolean")
    return v


Served = str | Sequence[str]
"""The served model name, or several (vLLM's ``--served-model-name A B``)."""


def _model(body: dict[str, Any], served: Served) -> str:
    """The model name a response reports: like vLLM, the *first* served name whichever one the
    request named (vllm-project/vllm, vllm/entrypoints/openai/serving_models.py,
    ``OpenAIServingModels.model_name``: ``base_model_paths[0].name``); a name not served is vLLM's 404
    (vllm-project/vllm, vllm/entrypoints/openai/engine/serving.py, ``_check_model``)."""
    names = (served,) if isinstance(served, str) else tuple(served)
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    if model not in names:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    return names[0]


def synthetic_field(body: dict[str, Any]) -> Any:
    """The raw ``tao_synthetic`` value: the top-level field, else ``metadata.tao_synthetic``
    (JSON text, decoded); None when neither is there."""
    spec = body.get("tao_synthetic")
    if spec is not None:
        return spec
    meta = body.get("metadata")
    if not isinstance(meta, dict) or meta.get("tao_synthetic") is None:
        return None
    text = meta["tao_synthetic"]
    if not isinstance(text, str):
        raise bad_request("metadata.tao_synthetic must be a string (JSON of the tao_synthetic object)",
                          "metadata")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"metadata.tao_synthetic is not valid JSON: {exc}", "metadata") from exc


def _synthetic(body: dict[str, Any]) -> SyntheticSpec | None:
    spec = synthetic_field(body)
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise bad_request("tao_synthetic must be an object", "tao_synthetic")
    sid = spec.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise bad_request("tao_synthetic.session_id must be a non-empty string", "tao_synthetic")
    n = spec.get("prompt_tokens")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise bad_request("tao_synthetic.prompt_tokens must be an integer >= 1", "tao_synthetic")
    shared = spec.get("shared_prefix_id")
    if shared is not None and not isinstance(shared, str):
        raise bad_request("tao_synthetic.shared_prefix_id must be a string or null", "tao_synthetic")
    sys_tokens = spec.get("system_prompt_tokens", 0)
    if sys_tokens is None:
        sys_tokens = 0
    if isinstance(sys_tokens, bool) or not isinstance(sys_tokens, int) or sys_tokens < 0:
        raise bad_request("tao_synthetic.system_prompt_tokens must be an integer >= 0", "tao_synthetic")
    return SyntheticSpec(sid, n, shared or None, sys_tokens)


def _common(body: dict[str, Any], cls: str, kind: str, served: Served, prompt_ids: list[int]) -> GenRequest:
    model = _model(body, served)
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _int_field(body, "max_completion_tokens", cls, None)
    else:
        max_tokens = _int_field(body, "max_tokens", cls, None)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    min_tokens = _int_field(body, "min_tokens", cls, 0) or 0
    if min_tokens < 0:
        raise bad_request(f"min_tokens must be greater than or equal to 0, got {min_tokens}.", "min_tokens")
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
                          "min_tokens")
    n = _int_field(body, "n", cls, 1)
    if n != 1:
        raise bad_request(f"n={n} is not supported by vllm-sim (only n=1)", "n")
    stream = _bool_field(body, "stream", cls, False)
    opts = body.get("stream_options")
    include_usage = continuous = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise _validation(cls, "stream_options", "Input should be a valid dictionary")
        if not stream:
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        include_usage = _bool_field(opts, "include_usage", "StreamOptions", True)
        continuous = _bool_field(opts, "continuous_usage_stats", "StreamOptions", False)
    ignore_eos = _bool_field(body, "ignore_eos", cls, False)
    synthetic = _synthetic(body)
    return GenRequest(kind, model, tuple(prompt_ids) if synthetic is None else (), synthetic, max_tokens,
                      min_tokens, ignore_eos, stream, include_usage, continuous)


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object")
    return body


def parse_chat(body: Any, served_model: Served) -> GenRequest:
    body = _require_object(body)
    cls = "ChatCompletionRequest"
    messages = body.get("messages")
    if messages is None:
        raise _validation(cls, "messages", "Field required")
    if not isinstance(messages, list) or not messages:
        raise _validation(cls, "messages", "Input should be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _validation(cls, f"messages.{i}", "Each message must be an object with a string 'role'")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _validation(cls, "tools", "Input should be a valid list")
    synthetic = synthetic_field(body) is not None
    ids = [] if synthetic else apply_chat_template(messages, tools)
    return _common(body, cls, "chat", served_model, ids)


def parse_completion(body: Any, served_model: Served) -> GenRequest:
    body = _require_object(body)
    cls = "CompletionRequest"
    prompt = body.get("prompt")
    if prompt is None:
        raise _validation(cls, "prompt", "Field required")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    ids: list[int]
    if isinstance(prompt, str):
        ids = encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, list):
        raise bad_request("vllm-sim supports one prompt per request (string or token ids)", "prompt")
    else:
        raise _validation(cls, "prompt", "Input should be a string or a list of token ids")
    if not ids and synthetic_field(body) is None:
        raise bad_request("Prompt cannot be empty", "prompt")
    return _common(body, cls, "completion", served_model, ids)


def check_length(req: GenRequest, max_model_len: int) -> int:
    """Validate lengths as vLLM's ``_validate_input``; returns the effective max_tokens."""
    n = req.prompt_len
    if req.kind == "chat":
        what = "messages"
    else:
        what = "prompt"
    violation = length_violation(n, req.max_tokens, max_model_len)
    if violation == "prompt":
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{n} input tokens. Please reduce the length of the input {what}.", what)
    if req.max_tokens is None:
        return max_model_len - n
    if violation == "max_tokens":
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {req.max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {n} input tokens "
            f"({req.max_tokens} > {max_model_len} - {n}).", "max_tokens")
    return req.max_tokens


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, *, drop_none: bool) -> dict[str, Any]:
    u: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                         "completion_tokens": completion_tokens}
    if cached_tokens > 0:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    elif not drop_none:
        u["prompt_tokens_details"] = None
    return u


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, Any] | None, finish: str | None,
               usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    if delta is None:
        chunk["choices"] = []
    else:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        chunk["choices"] = [choice]
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def completion_chunk(rid: str, created: int, model: str, text: str | None, finish: str | None,
                     usage_: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model}
    if text is None:
        chunk["choices"] = []
    else:
        chunk["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None}]
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def chat_response(rid: str, created: int, model: str, text: str, finish: str,
                  usage_: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "tool_calls": [], "reasoning_content": None}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None}],
            "service_tier": None, "system_fingerprint": None, "usage": usage_, "prompt_logprobs": None,
            "kv_transfer_params": None}


def completion_response(rid: str, created: int, model: str, text: str, finish: str,
                        usage_: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None, "prompt_logprobs": None}],
            "service_tier": None, "system_fingerprint": None, "usage": usage_, "kv_transfer_params": None}
