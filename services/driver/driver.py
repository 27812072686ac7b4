"""An agent driver that plays a trace (docs/architecture.md#trace-format) against a live OpenAI-compatible endpoint.

Each trace session becomes one agent: its turns are real streaming chat requests (the
session named both ways: ``x-session-id`` and ThunderAgent's ``program_id``), carrying the
synthetic-token extension so the replica's prefix cache sees exactly the trace's token
content; between turns the tool "runs" for ``duration_s`` scaled by ``time_scale`` while its
events stream to the predictor through ``ToolReporter`` when one is given.

All reported times are *model* seconds (wall seconds x time_scale) so figures compare
directly with `tao sim run` on the same trace and with replicas running at that time scale.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from services.driver.chat import CHAT_PATH, Outcome, open_http, send_chat
from services.sim.engine.tokens import synthetic_token_id
from services.sim.workload.trace import TraceSession


class ToolEvents(Protocol):
    """Where the driver reports tool calls (the predictor's ToolReporter, or nothing)."""

    async def started(self, session_id: str, call_id: str, tool: str, command: str,
                      deadline_s: float | None) -> None: ...

    async def progress(self, session_id: str, call_id: str, fraction: float | None, eta_s: float | None) -> None: ...

    async def finished(self, session_id: str, call_id: str) -> None: ...

    async def close(self) -> None: ...


class NoToolEvents:
    async def started(self, session_id: str, call_id: str, tool: str, command: str,
                      deadline_s: float | None) -> None:
        return None

    async def progress(self, session_id: str, call_id: str, fraction: float | None, eta_s: float | None) -> None:
        return None

    async def finished(self, session_id: str, call_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class DriverConfig:
    base_url: str
    time_scale: float = 1.0
    concurrency: int = 64
    api_key: str = "EMPTY"
    model: str | None = None
    request_timeout_s: float = 600.0
    tenant_header: str | None = None
    #: answers 503 (overload or failure at the router: held past its hold timeout while nothing
    #: could serve the request; a session the plan pauses is held, not refused) are retried after
    #: Retry-After, this often
    max_retries_503: int = 5
    #: release each session when its last turn ends, as a harness integrated with TAO or
    #: ThunderAgent does: TAO's ``POST /v1/sessions/{id}/release`` and ThunderAgent's
    #: ``POST /programs/release`` (``{"program_id": id}``); 404 from endpoints without one is ignored
    release_sessions: bool = True


@dataclass
class RequestResult:
    session_id: str
    turn: int
    after_tool: bool
    sent_at_s: float
    ttft_s: float | None
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    hold_s: float | None
    error: str | None = None
    retries: int = 0
    #: time from sending the request to its response headers, measured here (model seconds):
    #: how long it waited before anything forwarded it. The same measurement for every
    #: endpoint: vLLM and per-request routers answer headers at once, a router that holds a
    #: paused program (ThunderAgent, TAO) only when it forwards. Across 503 retries, from the
    #: first attempt. None when no headers came.
    wait_s: float | None = None


@dataclass
class SessionResult:
    session_id: str
    tenant: str
    started_at_s: float
    ended_at_s: float
    completed: bool
    requests: list[RequestResult] = field(default_factory=list)


@dataclass
class DriverResult:
    sessions: list[SessionResult]
    wall_s: float
    time_scale: float
    errors: int


#: the stand-in message text carries one word per this many prompt tokens
TOKENS_PER_WORD = 64


def stand_in_text(session: TraceSession, prompt_tokens: int) -> str:
    """A miniature of the prompt for routers that route on request text (text cache-aware):
    one word per ``TOKENS_PER_WORD`` tokens, each word a function of the synthetic content at
    that position (the shared system prompt's source before ``system_prompt_tokens``, the
    session's after). So, as with real agent prompts, a session's next turn extends its
    previous text and two sessions share only their system prompt's share of it. The replicas
    read the real size and content from ``tao_synthetic``."""
    shared, sys_tokens = session.shared_prefix_id, session.system_prompt_tokens
    words = []
    for pos in range(0, prompt_tokens, TOKENS_PER_WORD):
        source = shared if shared is not None and pos < sys_tokens else session.session_id
        words.append(f"w{synthetic_token_id(source, pos) % 1_000_003}")
    return " ".join(words)


def _error(out: Outcome) -> str | None:
    """The request's error as the driver reports it; None when it ended ``ok``."""
    if out.ok:
        return None
    if out.status is not None and out.status != 200:
        return f"HTTP {out.status}: {out.body.decode(errors='replace')[:200]}"
    if out.exception is not None:
        return f"{type(out.exception).__name__}: {out.exception}"
    return out.detail


def _prompt_tokens(session: TraceSession, turn_index: int) -> int:
    total = session.system_prompt_tokens
    for i, turn in enumerate(session.turns[: turn_index + 1]):
        total += turn.append_tokens
        if i < turn_index:
            total += turn.output_tokens
    return total


class TraceDriver:
    def __init__(self, config: DriverConfig, tools: ToolEvents | None = None,
                 on_request: Callable[[RequestResult], None] | None = None) -> None:
        self.config = config
        self.tools = tools or NoToolEvents()
        self.on_request = on_request
        self._t0 = 0.0
        self.active = 0
        self.acting = 0
        self.done = 0

    def _now_model_s(self) -> float:
        return (time.monotonic() - self._t0) * self.config.time_scale

    async def _discover_model(self, http: aiohttp.ClientSession) -> str:
        async with http.get(f"{self.config.base_url}/v1/models") as resp:
            body = await resp.json()
            if resp.status != 200 or not body.get("data"):
                raise RuntimeError(f"{self.config.base_url}/v1/models answered {resp.status}: {body}")
            return str(body["data"][0]["id"])

    async def _request(self, http: aiohttp.ClientSession, model: str, session: TraceSession, turn_index: int) -> RequestResult:
        """One turn; a 503 (held too long at the router) is retried after its Retry-After,
        with TTFT and latency measured from the first attempt, as the agent experiences them."""
        first_sent = time.monotonic()
        retries = 0
        while True:
            result, retry_after = await self._attempt(http, model, session, turn_index, first_sent)
            if retry_after is None or retries >= self.config.max_retries_503:
                break
            retries += 1
            await asyncio.sleep(min(retry_after, 5.0) / max(1.0, self.config.time_scale))
        result.retries = retries
        if self.on_request is not None:
            self.on_request(result)
        return result

    async def _attempt(self, http: aiohttp.ClientSession, model: str, session: TraceSession, turn_index: int,
                       sent: float) -> tuple[RequestResult, float | None]:
        turn = session.turns[turn_index]
        prompt_tokens = _prompt_tokens(session, turn_index)
        synthetic = {
            "session_id": session.session_id,
            "prompt_tokens": prompt_tokens,
            "shared_prefix_id": session.shared_prefix_id,
            "system_prompt_tokens": session.system_prompt_tokens,
        }
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user",
                          "content": f"{stand_in_text(session, prompt_tokens)} {session.session_id} turn {turn_index}"}],
            "max_tokens": turn.output_tokens,
            "min_tokens": turn.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "program_id": session.session_id,
            "tao_synthetic": synthetic,
            # the same again where routers that rebuild requests from their own schema keep it
            # (sglang-router drops unknown top-level fields but forwards OpenAI's metadata)
            "metadata": {"tao_synthetic": json.dumps(synthetic, separators=(",", ":"))},
        }
        headers = {"x-session-id": session.session_id, "authorization": f"Bearer {self.config.api_key}"}
        if self.config.tenant_header:
            headers["x-tao-tenant"] = session.tenant
        out = await send_chat(http, self.config.base_url + CHAT_PATH, body, headers, t0=sent, clock=time.monotonic)
        hold_header = out.headers.get("x-tao-hold-ms")
        hold_s = None if hold_header is None else float(hold_header) / 1000.0  # the router reports model ms
        scale = self.config.time_scale
        usage = out.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        result = RequestResult(
            session_id=session.session_id, turn=turn_index, after_tool=turn_index > 0,
            sent_at_s=(sent - self._t0) * scale, ttft_s=None if out.ttft_s is None else out.ttft_s * scale,
            latency_s=out.total_s * scale, prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens", 0) or 0), hold_s=hold_s, error=_error(out),
            wait_s=None if out.headers_s is None else out.headers_s * scale,
        )
        retry_after = None
        if out.status == 503:
            retry_after = float(out.headers.get("Retry-After", "1") or 1)
        return result, retry_after

    async def _release(self, http: aiohttp.ClientSession, session: TraceSession) -> None:
        """Release the session: TAO's ``/v1/sessions/{id}/release`` first, and when that is not
        answered 2xx (ThunderAgent, other endpoints: 404) ThunderAgent's ``/programs/release``.
        Failures and 404s are ignored: an endpoint without sessions has nothing to release."""
        # x-session-id too: a gateway that hashes on it sends the release to the session's router
        headers = {"authorization": f"Bearer {self.config.api_key}", "x-session-id": session.session_id}
        if self.config.tenant_header:
            headers["x-tao-tenant"] = session.tenant
        base, sid = self.config.base_url, session.session_id
        for url, body in ((f"{base}/v1/sessions/{sid}/release", None),
                          (f"{base}/programs/release", {"program_id": sid})):
            try:
                async with http.post(url, headers=headers, json=body) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass

    async def _run_tool(self, session: TraceSession, turn_index: int) -> None:
        tool = session.turns[turn_index].tool
        assert tool is not None
        call_id = f"{session.session_id}:{turn_index}"
        scale = self.config.time_scale
        await self.tools.started(session.session_id, call_id, tool.name, tool.command, tool.deadline_s)
        elapsed = 0.0
        for event in tool.progress or ():
            wait = (event.after_s - elapsed) / scale
            if wait > 0:
                await asyncio.sleep(wait)
            elapsed = event.after_s
            await self.tools.progress(session.session_id, call_id, event.fraction, event.eta_s)
        remaining = (tool.duration_s - elapsed) / scale
        if remaining > 0:
            await asyncio.sleep(remaining)
        await self.tools.finished(session.session_id, call_id)

    async def _run_session(self, http: aiohttp.ClientSession, model: str, session: TraceSession) -> SessionResult:
        result = SessionResult(session.session_id, session.tenant, self._now_model_s(), 0.0, False)
        self.active += 1
        try:
            for i, turn in enumerate(session.turns):
                req = await self._request(http, model, session, i)
                result.requests.append(req)
                if req.error is not None:
                    break
                if turn.tool is not None:
                    self.acting += 1
                    try:
                        await self._run_tool(session, i)
                    finally:
                        self.acting -= 1
            else:
                result.completed = True
            if self.config.release_sessions:
                await self._release(http, session)
        finally:
            result.ended_at_s = self._now_model_s()
            self.active -= 1
            self.done += 1
        return result

    async def run(self, sessions: list[TraceSession]) -> DriverResult:
        """Play every session: each starts at its arrival time (scaled) once fewer than
        ``concurrency`` sessions are active (closed loop)."""
        self._t0 = time.monotonic()
        gate = asyncio.Semaphore(self.config.concurrency)
        async with open_http(self.config.request_timeout_s) as http:
            model = self.config.model or await self._discover_model(http)

            async def one(session: TraceSession) -> SessionResult:
                delay = session.arrival_s / self.config.time_scale - (time.monotonic() - self._t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                async with gate:
                    return await self._run_session(http, model, session)

            try:
                results = await asyncio.gather(*(one(s) for s in sorted(sessions, key=lambda s: s.arrival_s)))
            finally:
                await self.tools.close()
        errors = sum(1 for s in results for r in s.requests if r.error is not None)
        return DriverResult(list(results), time.monotonic() - self._t0, self.config.time_scale, errors)
