"""aiohttp app of one emulated vLLM replica, and an in-process runner for tests and tools.

    async with start_vllm_sim(profile="qwen3-32b-h100x2", port=0, time_scale=50) as sim:
        client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="x")

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics, GET /version, POST /tokenize (vLLM's ``TokenizeChatRequest`` /
``TokenizeCompletionRequest`` -> ``{count, max_model_len, tokens}``, this replica's tokenizer),
and vLLM's render API (``vllm/entrypoints/serve/render``):
POST /v1/chat/completions/render and /v1/completions/render answer the prompt's token ids as a
``GenerateRequest`` without generating (routers such as vllm-router use it for token-level
prefix routing; without it they fall back to the request text). Output length: exactly ``max_tokens`` when ``ignore_eos`` is true or
``tao_synthetic`` is present; otherwise an emulated EOS after a deterministic (per prompt)
8..507 tokens, at least ``min_tokens`` and at most ``max_tokens`` (finish reason "stop" when the
EOS comes first, "length" otherwise). A chat request with ``tools`` whose last message is the
user's gets a call of the first tool instead (``services/sim/vllm_sim/tools.py``; "tool_calls").
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.common.kv_events import KVEventsConfig
from services.sim.engine import ChainCache, Engine, EngineRequest, Profile, TokenListContent, get_profile
from services.sim.engine.tokens import SyntheticContent, stable_key
from services.sim.vllm_sim.kv_publisher import KVEventPublisher
from services.sim.vllm_sim.metrics import SimMetrics
from services.sim.vllm_sim.protocol import (
    ApiError,
    GenRequest,
    _model,
    _validation,
    bad_request,
    chat_chunk,
    chat_response,
    check_length,
    completion_chunk,
    completion_response,
    parse_chat,
    parse_completion,
    usage,
)
from services.sim.vllm_sim.runner import EngineRunner, Stream
from services.sim.vllm_sim.tokenizer import (
    apply_chat_template,
    encode,
    plan_synthetic_output,
    plan_text_output,
    split,
    token_id,
)
from services.sim.vllm_sim.tools import ToolCallPlan, plan_tool_call

EOS_MIN_TOKENS = 8
EOS_SPREAD_TOKENS = 500
MAX_BODY_BYTES = 256 * 1024 * 1024
CHAIN_HASHES_PER_GPU_BLOCK = 8  # ChainCache bound: hashes held per KV block of the replica
CHAIN_HASHES_MIN = 65536
_dumps = functools.partial(json.dumps, separators=(",", ":"))  # compact, like vLLM's responses


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=_dumps)


class RenderCache:
    """The prompt token ids of synthetic chains as comma-joined text, grown per chain as its
    session's prompts grow (a turn adds only its new tokens), with each token's end offset;
    LRU over chains, bounded by chains and by tokens held (~14 bytes each: text and offset)."""

    def __init__(self, max_chains: int = 4096, max_tokens: int = 2_000_000) -> None:
        if max_chains < 1 or max_tokens < 1:
            raise ValueError("max_chains and max_tokens must be >= 1")
        self._max = max_chains
        self._max_tokens = max_tokens
        self._tokens = 0
        self._chains: OrderedDict[tuple[str, str | None, int], tuple[list[str], array[int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chains)

    @property
    def stored_tokens(self) -> int:
        return self._tokens

    def ids_text(self, content: SyntheticContent, n: int) -> str:
        """``",".join(ids[:n])`` of ``content``'s token ids."""
        key = content.memo_key
        entry = self._chains.get(key)
        if entry is None:
            entry = ([""], array("q"))
            self._chains[key] = entry
        else:
            self._chains.move_to_end(key)
        parts, ends = entry
        have = len(ends)
        if have < n:
            new = ",".join(map(str, content.token_ids(have, n)))
            text = parts[0] + ("," if have else "") + new
            pos = len(parts[0]) + (1 if have else 0)
            for piece in new.split(","):
                pos += len(piece)
                ends.append(pos)
                pos += 1
            parts[0] = text
            self._tokens += len(ends) - have
        chains = self._chains
        while len(chains) > 1 and (len(chains) > self._max or self._tokens > self._max_tokens):
            self._tokens -= len(chains.popitem(last=False)[1][1])
        return parts[0][: ends[n - 1]] if n > 0 else ""


@dataclass(frozen=True, slots=True)
class SimConfig:
    profile: Profile
    #: the served model name, or all of them (vLLM's ``--served-model-name A B``: requests may
    #: name any, responses and metrics report the first)
    model_name: str | tuple[str, ...]
    time_scale: float = 1.0
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    #: vLLM's ``--kv-events-config``: publish KV-cache events over ZMQ (``kv_publisher.py``)
    kv_events: KVEventsConfig | None = None


class SimServer:
    """State of one replica: engine, runner, metrics and the HTTP handlers."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        names = (config.model_name,) if isinstance(config.model_name, str) else config.model_name
        if not names or not all(names):
            raise ValueError("served model names must be non-empty")
        self.served_model_names: tuple[str, ...] = names
        self.model_name = names[0]
        self.engine = Engine(config.profile, num_gpu_blocks=config.num_gpu_blocks,
                             max_num_seqs=config.max_num_seqs,
                             max_num_batched_tokens=config.max_num_batched_tokens,
                             max_model_len=config.max_model_len)
        self.runner = EngineRunner(self.engine, None, config.time_scale)
        self.metrics = SimMetrics(self.engine, self.model_name, self.runner.clock_report,
                                  config.profile.gpu_memory_utilization)
        self.runner.metrics = self.metrics
        if config.kv_events is not None and config.kv_events.publishes:
            self.engine.enable_kv_events()
        # Hash chains are worth keeping while their blocks may still be cached: a few KV caches'
        # worth of hashes (ever-new sessions grew the default 2M-hash bound, ~80 MB, in a soak).
        self.chains = ChainCache(
            max_hashes=max(CHAIN_HASHES_MIN, CHAIN_HASHES_PER_GPU_BLOCK * self.engine.num_gpu_blocks),
            block_size=self.engine.block_size)
        self.render_cache = RenderCache()
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_error_middleware])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions/render", self.render_chat)
        app.router.add_post("/v1/completions/render", self.render_completion)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/version", self.version)
        app.router.add_get("/kv_event_sources", self.kv_event_sources)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        if self.engine.pool.kv_events_enabled and self.config.kv_events is not None:
            self.runner.kv_publisher = KVEventPublisher(self.config.kv_events)
            self.runner.kv_publisher.start()
        self.runner.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.runner.stop()
        if self.runner.kv_publisher is not None:
            await self.runner.kv_publisher.close()
            self.runner.kv_publisher = None

    async def reset_prefix_cache(self, _req: web.Request) -> web.Response:
        """vLLM's ``POST /reset_prefix_cache``: forgets every cached block (an
        ``AllBlocksCleared`` event) unless blocks are in use, which vLLM answers with an error."""
        if not self.engine.reset_prefix_cache():
            raise ApiError(500, "Failed to reset prefix cache: blocks are in use", "InternalServerError")
        if self.runner.kv_publisher is not None:
            self.runner.kv_publisher.publish(self.engine.take_kv_events())
        return web.Response(status=200)

    # ---------------------------------------------------------------- simple
    async def health(self, _req: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, _req: web.Request) -> web.Response:
        return _json_response({"version": "0.0.0+tao-vllm-sim"})

    async def kv_event_sources(self, _req: web.Request) -> web.Response:
        """vLLM's ``GET /kv_event_sources`` (vllm-project/vllm#55844,
        ``vllm/entrypoints/serve/kv_events/api_router.py``; registered unconditionally): the
        resolved KV-event publisher per DP rank, ``{"sources": [{data_parallel_rank, endpoint,
        replay_endpoint, topic}]}`` sorted by rank, the endpoints as bound (ZMQ's
        ``LAST_ENDPOINT``: ``tcp://*:0`` reads back the port the OS chose). No publisher (events
        off, or ``publisher: null``): ``{"sources": []}``. The emulator is one engine, DP rank 0."""
        pub = self.runner.kv_publisher
        sources: list[dict[str, Any]] = []
        if pub is not None:
            sources.append({"data_parallel_rank": 0, "endpoint": pub.endpoint,
                            "replay_endpoint": pub.replay_endpoint, "topic": pub.config.topic})
        return _json_response({"sources": sources})

    async def metrics_handler(self, _req: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type": "version=0.0.4"})

    async def models(self, _req: web.Request) -> web.Response:
        # One card per served name, as vLLM's ``show_available_models`` lists them.
        cards = [{"id": name, "object": "model", "created": self.created, "owned_by": "vllm",
                  "root": self.config.profile.model.hf_id, "parent": None,
                  "max_model_len": self.engine.max_model_len,
                  "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                  "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                                  "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                  "allow_fine_tuning": False, "organization": "*", "group": None,
                                  "is_blocking": False}]}
                 for name in self.served_model_names]
        return _json_response({"object": "list", "data": cards})

    # ------------------------------------------------------------ generation
    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        req = parse_chat(body, self.served_model_names)
        return await self._generate(request, req, plan_tool_call(body) if req.synthetic is None else None)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion(await _json(request), self.served_model_names))

    # -------------------------------------------------------------- tokenize
    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize`` (vllm-project/vllm, vllm/entrypoints/openai/protocol.py:
        ``TokenizeChatRequest`` {model?, messages, add_generation_prompt=true, tools?} or
        ``TokenizeCompletionRequest`` {model?, prompt}; ``TokenizeResponse`` {count,
        max_model_len, tokens}) with this replica's tokenizer: the ids are exactly the prompt
        ids a chat or completion request with the same messages / prompt gets."""
        body = await _json(request)
        if not isinstance(body, dict):
            raise bad_request("Input should be a valid dictionary")
        _model(body, self.served_model_names)
        if "messages" in body:
            messages, tools = body.get("messages"), body.get("tools")
            if not isinstance(messages, list) or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise _validation("TokenizeChatRequest", "messages",
                                  "Input should be a list of messages with a string 'role'")
            if tools is not None and not isinstance(tools, list):
                raise _validation("TokenizeChatRequest", "tools", "Input should be a valid list")
            generation = body.get("add_generation_prompt", True)
            ids = apply_chat_template(messages, tools, generation is not False)
        elif isinstance(body.get("prompt"), str):
            ids = encode(body["prompt"])
        else:
            raise _validation("TokenizeCompletionRequest", "prompt", "Field required")
        return _json_response({"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids})

    # ---------------------------------------------------------------- render
    async def render_chat(self, request: web.Request) -> web.Response:
        body = self._render(parse_chat(await _json(request), self.served_model_names))
        return web.Response(body=body, content_type="application/json")

    async def render_completion(self, request: web.Request) -> web.Response:
        # vLLM answers a list: one GenerateRequest per prompt (vllm-sim takes one prompt)
        body = self._render(parse_completion(await _json(request), self.served_model_names))
        return web.Response(body=b"[" + body + b"]", content_type="application/json")

    def _render(self, req: GenRequest) -> bytes:
        """vLLM's ``GenerateRequest`` for ``req`` as JSON: its prompt token ids (for synthetic
        requests the synthetic content's ids) and sampling parameters; nothing is scheduled.
        Synthetic ids come from ``RenderCache`` (the engine shares this event loop: a 40k-token
        prompt must not cost 70 ms of id generation and JSON encoding per request)."""
        max_tokens = check_length(req, self.engine.max_model_len)
        if req.synthetic is not None:
            syn = req.synthetic
            content = self.chains.synthetic(syn.session_id, syn.shared_prefix_id, syn.system_prompt_tokens)
            ids_text = self.render_cache.ids_text(content, syn.prompt_tokens)
        else:
            ids_text = ",".join(map(str, req.prompt_ids))
        rest = {"features": None,
                "sampling_params": {"max_tokens": max_tokens, "min_tokens": req.min_tokens,
                                    "ignore_eos": req.ignore_eos},
                "model": req.model, "stream": req.stream,
                "stream_options": ({"include_usage": req.include_usage,
                                    "continuous_usage_stats": req.continuous_usage} if req.stream else None),
                "cache_salt": None, "priority": 0, "kv_transfer_params": None}
        return (f'{{"request_id":"{uuid.uuid4().hex}","token_ids":[{ids_text}],'.encode()
                + _dumps(rest)[1:].encode())

    def _plan(self, req: GenRequest, tool: ToolCallPlan | None = None) -> tuple[EngineRequest, list[str]]:
        max_tokens = check_length(req, self.engine.max_model_len)
        rid = ("chatcmpl-" if req.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        if tool is not None:  # the arguments are the generated tokens (services/sim/vllm_sim/tools.py)
            pieces = split(tool.arguments)[:max_tokens]
            # the engine finishes with "stop"; the API says "tool_calls", as vLLM's serving_chat rewrites it
            reason = "stop" if "".join(pieces) == tool.arguments else "length"
            tokens = TokenListContent(req.prompt_ids + tuple(token_id(p) for p in pieces), self.engine.block_size)
            return EngineRequest(rid, tokens, len(req.prompt_ids), len(pieces), finish_reason_at_max=reason), pieces
        syn = req.synthetic
        if syn is not None:
            content = self.chains.synthetic(syn.session_id, syn.shared_prefix_id, syn.system_prompt_tokens)
            return EngineRequest(rid, content, syn.prompt_tokens, max_tokens), \
                plan_synthetic_output(syn.session_id, syn.prompt_tokens, max_tokens)
        n_out, reason = max_tokens, "length"
        if not req.ignore_eos:
            eos = EOS_MIN_TOKENS + stable_key(f"eos:{hash(req.prompt_ids)}") % EOS_SPREAD_TOKENS
            eos = max(eos, req.min_tokens, 1)
            if eos < max_tokens:
                n_out, reason = eos, "stop"
        pieces = plan_text_output(hash(req.prompt_ids), n_out)
        tokens = TokenListContent(req.prompt_ids + tuple(token_id(p) for p in pieces), self.engine.block_size)
        return EngineRequest(rid, tokens, len(req.prompt_ids), n_out, finish_reason_at_max=reason), pieces

    async def _generate(self, request: web.Request, req: GenRequest,
                        tool: ToolCallPlan | None = None) -> web.StreamResponse:
        engine_req, pieces = self._plan(req, tool)
        try:
            stream = self.runner.submit(engine_req, pieces)
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
        try:
            if req.stream:
                return await self._stream(request, req, stream, tool)
            return await self._unary(req, stream, tool)
        finally:
            if stream.finished is None:
                self.runner.abort(stream.request_id)

    async def _unary(self, req: GenRequest, stream: Stream, tool: ToolCallPlan | None = None) -> web.Response:
        while stream.finished is None:
            stream.changed.clear()
            await stream.changed.wait()
        fin = stream.finished
        text = "".join(stream.pieces[: fin.output_tokens])
        u = usage(stream.prompt_tokens, fin.output_tokens, fin.cached_tokens, drop_none=False)
        build = chat_response if req.kind == "chat" else completion_response
        out = build(stream.request_id, int(time.time()), req.model, text,
                    _api_reason(fin.finish_reason, tool), u)
        if tool is not None:
            out["choices"][0]["message"].update(content=None, tool_calls=[tool.message(text)])
        return _json_response(out)

    async def _stream(self, request: web.Request, req: GenRequest, stream: Stream,
                      tool: ToolCallPlan | None = None) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                        "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            await self._stream_body(resp, req, stream, tool)
        except ConnectionResetError:  # the client went away: _generate aborts the request
            pass
        return resp

    async def _stream_body(self, resp: web.StreamResponse, req: GenRequest, stream: Stream,
                           tool: ToolCallPlan | None = None) -> None:
        created = int(time.time())
        rid, model, chat = stream.request_id, req.model, req.kind == "chat"

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

        def cont_usage(n: int) -> dict[str, Any] | None:
            return usage(stream.prompt_tokens, n, 0, drop_none=True) if req.continuous_usage else None

        if chat:
            await send(chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, cont_usage(0)))
        # Hot path: a token chunk is a fixed prefix + the JSON string + a fixed suffix.
        if chat:
            head = _dumps(chat_chunk(rid, created, model, {"content": ""}, None)).split('"content":""')
        else:
            head = _dumps(completion_chunk(rid, created, model, "", None)).split('"text":""')
        key = '"content":' if chat else '"text":'
        prefix, suffix = (b"data: " + head[0].encode() + key.encode()), (head[1] + "\n\n").encode()
        sent = 0
        tool_started = False
        while True:
            stream.changed.clear()
            fin = stream.finished
            upto = fin.output_tokens if fin is not None else stream.emitted
            if upto > sent or fin is not None:
                text = "".join(stream.pieces[sent:upto])
                sent = upto
                reason = fin.finish_reason if fin is not None else None
                if tool is not None:  # delta.tool_calls: id, type and name first, then argument fragments
                    call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
                    if not tool_started:
                        tool_started = True
                        call = {"index": 0, "id": tool.call_id, "type": "function",
                                "function": {"name": tool.name, "arguments": text}}
                    await send(chat_chunk(rid, created, model, {"tool_calls": [call]}, _api_reason(reason, tool),
                                          cont_usage(sent)))
                elif reason is None and not req.continuous_usage:
                    await resp.write(prefix + json.dumps(text).encode() + suffix)
                elif chat:
                    await send(chat_chunk(rid, created, model, {"content": text}, reason, cont_usage(sent)))
                else:
                    await send(completion_chunk(rid, created, model, text, reason, cont_usage(sent)))
            if fin is not None:
                break
            await stream.changed.wait()
        if req.include_usage:
            u = usage(stream.prompt_tokens, fin.output_tokens, fin.cached_tokens, drop_none=True)
            build = chat_chunk if chat else completion_chunk
            await send(build(rid, created, model, None, None, u))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()


def _api_reason(reason: str | None, tool: ToolCallPlan | None) -> str | None:
    """The finish reason the API reports: a complete tool call ends with "tool_calls"."""
    return "tool_calls" if tool is not None and reason == "stop" else reason


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, too deep
        raise bad_request(f"JSON decode error: {exc}") from exc


@web.middleware
async def _error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        resp: web.StreamResponse = await handler(request)
        return resp
    except ApiError as err:
        return _json_response(err.body(), status=err.status)
    except web.HTTPRequestEntityTooLarge as exc:
        return _json_response(ApiError(413, exc.text or "Request body too large").body(), status=413)
    except web.HTTPException:
        raise
    except (ConnectionResetError, TimeoutError):
        raise
    except Exception as exc:  # a bug: answer like vLLM's InternalServerError, keep serving
        return _json_response(ApiError(500, f"{type(exc).__name__}: {exc}", "InternalServerError").body(),
                                 status=500)


def build_server(profile: str | Profile, *, model_name: str | Sequence[str] | None = None, time_scale: float = 1.0,
                 num_gpu_blocks: int | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
                 kv_events: KVEventsConfig | None = None) -> SimServer:
    prof = get_profile(profile) if isinstance(profile, str) else profile
    model_name = model_name if model_name is None or isinstance(model_name, str) else tuple(model_name)
    return SimServer(SimConfig(prof, model_name or prof.model_name, time_scale, num_gpu_blocks, max_num_seqs,
                               max_num_batched_tokens, max_model_len, kv_events))


@dataclass(slots=True)
class RunningSim:
    server: SimServer
    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine(self) -> Engine:
        return self.server.engine


@asynccontextmanager
async def start_vllm_sim(profile: str | Profile = "qwen3-32b-h100x2", *, host: str = "127.0.0.1", port: int = 0,
                         time_scale: float = 1.0, model_name: str | Sequence[str] | None = None,
                         num_gpu_blocks: int | None = None, max_num_seqs: int | None = None,
                         max_num_batched_tokens: int | None = None,
                         max_model_len: int | None = None,
                         kv_events: KVEventsConfig | None = None) -> AsyncIterator[RunningSim]:
    """Serve one replica in this event loop; ``port=0`` picks a free port (see ``.port``)."""
    server = build_server(profile, model_name=model_name, time_scale=time_scale, num_gpu_blocks=num_gpu_blocks,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, kv_events=kv_events)
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    try:
        yield RunningSim(server, host, bound)
    finally:
        await runner.cleanup()
