"""Exact prompt lengths for a session's first request (the router's only blind spot).

Before a session's first answer the router knows its prompt only from the request text; the
estimate (characters ÷ 4, ``validation.CHARS_PER_TOKEN``) sizes its footprint, its tokens-
per-minute debit and the context-length check. ``PromptCounter`` replaces it by the exact count:

- ``source="local"``: a tokenizer the operator configured (``tokenizer``: a Hugging Face name
  or path, loaded with ``transformers.AutoTokenizer`` when transformers is installed; its
  chat template, with the request's ``tools``), run in a worker thread;
- ``source="tokenize"``: the replica's ``POST /tokenize`` (vLLM's, vllm-project/vllm,
  vllm/entrypoints/openai/protocol.py: ``TokenizeChatRequest`` ``{model, messages, tools,
  add_generation_prompt}`` / ``TokenizeCompletionRequest`` ``{model, prompt}`` ->
  ``TokenizeResponse`` ``{count, max_model_len, tokens}``), on a healthy replica serving the
  model, bounded by ``tokenize_timeout_s``; a replica that answers 404/405/501 (no such
  endpoint) is not asked again;
- ``source="estimate"``: neither answered in time (or ``prompt_length`` is ``estimate``).

Only a session's first request is counted (a request without a session id is always one): a
later request's footprint comes from the previous answer's usage. Requests whose length is
exact already (token ids, ``tao_synthetic``) are ``source="exact"``. Every request is counted
in ``tao_router_prompt_length_estimated_total{source}``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import structlog
from prometheus_client import CollectorRegistry, Counter

SOURCES = ("exact", "local", "tokenize", "estimate")
#: chat request fields that vLLM's TokenizeChatRequest takes too (vllm-project/vllm,
#: vllm/entrypoints/openai/protocol.py) and that change the prompt the chat template renders
CHAT_TEMPLATE_FIELDS = ("tools", "add_generation_prompt", "continue_final_message", "add_special_tokens",
                        "chat_template", "chat_template_kwargs")
NO_ENDPOINT = frozenset({404, 405, 501})


def tokenize_request(body: bytes, chat: bool) -> dict[str, Any] | None:
    """vLLM's ``TokenizeChatRequest`` / ``TokenizeCompletionRequest`` (vllm-project/vllm,
    vllm/entrypoints/openai/protocol.py) for a chat or completion request body: its model and
    messages with the fields that change the rendered prompt, or its model and prompt; None for
    a body that is not a JSON object, a chat without messages, or a batch of prompts (vLLM's
    ``TokenizeCompletionRequest.prompt`` is one string)."""
    try:
        req = orjson.loads(body)
    except ValueError:
        return None
    if not isinstance(req, dict):
        return None
    if chat:
        if not isinstance(req.get("messages"), list):
            return None
        ask: dict[str, Any] = {"model": req.get("model"), "messages": req["messages"], "add_generation_prompt": True}
        for key in CHAT_TEMPLATE_FIELDS:  # they change the rendered prompt: the count and the ids see them
            if req.get(key) is not None:
                ask[key] = req[key]
        return ask
    if isinstance(req.get("prompt"), str):
        return {"model": req.get("model"), "prompt": req["prompt"]}
    return None


class PromptCounter:
    """See the module doc. ``mode``: ``tokenize`` (local tokenizer if configured, else the
    replica), ``local`` (the local tokenizer only) or ``estimate`` (never count)."""

    def __init__(self, mode: str, timeout_s: float, tokenizer: str | None, registry: CollectorRegistry,
                 log: structlog.stdlib.BoundLogger) -> None:
        self.mode = mode
        self.timeout_s = timeout_s
        self.tokenizer_name = tokenizer
        self.log = log
        self._local: Any = None
        self._http: aiohttp.ClientSession | None = None
        self._no_endpoint: set[str] = set()
        counter = Counter("tao_router_prompt_length_estimated", "Requests by where their prompt length came "
                          "from: exact (token ids), local (tokenizer), tokenize (replica), estimate (chars / 4).",
                          ["source"], registry=registry)
        self.sources = {s: counter.labels(s) for s in SOURCES}

    async def start(self) -> None:
        if self.mode == "estimate":
            return
        if self.tokenizer_name:
            try:
                from transformers import AutoTokenizer  # optional: only when the operator installed it
            except ImportError:
                self.log.warning("tokenizer set but transformers is not installed; using the replicas' /tokenize",
                                 tokenizer=self.tokenizer_name)
            else:
                name = self.tokenizer_name
                self._local = await asyncio.to_thread(AutoTokenizer.from_pretrained, name)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                           connector=aiohttp.TCPConnector(limit=32))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def set_local(self, tokenizer: Any) -> None:
        """Use ``tokenizer`` (an object with Hugging Face's ``apply_chat_template`` / ``encode``)."""
        self._local = tokenizer

    async def count(self, upstream_body: bytes, chat: bool, replica_urls: list[str],
                    headers: dict[str, str] | None = None) -> int | None:
        """The exact prompt tokens of a request, or None (then the caller's estimate stands).
        ``replica_urls``: healthy replicas serving its model, in preference order; ``headers``:
        the router's upstream headers (its ``upstream_api_key``, never the client's)."""
        if self.mode == "estimate":
            return None
        ask = tokenize_request(upstream_body, chat)
        if ask is None:
            return None  # a batch of prompts: the longest one's estimate stands
        if self._local is not None:
            n = await self._count_local(ask)
            if n is not None:
                self.sources["local"].inc()
                return n
        if self.mode == "tokenize":
            for url in replica_urls:
                if url in self._no_endpoint:
                    continue
                n = await self._count_remote(url, ask, headers or {})
                if n is not None:
                    self.sources["tokenize"].inc()
                    return n
                break  # one try: a slow replica must not cost the request a timeout per replica
        self.sources["estimate"].inc()
        return None

    async def _count_local(self, ask: dict[str, Any]) -> int | None:
        tok = self._local

        def run() -> int:
            if "messages" in ask:
                kwargs = ask.get("chat_template_kwargs")
                ids = tok.apply_chat_template(
                    ask["messages"], tools=ask.get("tools"), add_generation_prompt=ask["add_generation_prompt"],
                    continue_final_message=bool(ask.get("continue_final_message")), tokenize=True,
                    **(kwargs if isinstance(kwargs, dict) else {}))
            else:
                ids = tok.encode(ask["prompt"])
            return len(ids)

        try:
            return await asyncio.to_thread(run)
        except Exception as exc:  # a template that cannot render this request: the replica decides
            self.log.debug("local tokenizer failed", error=repr(exc))
            return None

    async def _count_remote(self, url: str, ask: dict[str, Any], headers: dict[str, str]) -> int | None:
        if self._http is None:
            return None
        try:
            async with self._http.post(url + "/tokenize", data=orjson.dumps(ask),
                                       headers={**headers, "Content-Type": "application/json"}) as resp:
                if resp.status in NO_ENDPOINT:
                    self._no_endpoint.add(url)
                    self.log.info("replica has no /tokenize; prompt lengths are estimated there", replica=url)
                    return None
                if resp.status != 200:
                    return None
                out = orjson.loads(await resp.read())
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError):
            return None
        n = out.get("count") if isinstance(out, dict) else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    def exact(self) -> None:
        self.sources["exact"].inc()

    def estimated(self) -> None:
        self.sources["estimate"].inc()
