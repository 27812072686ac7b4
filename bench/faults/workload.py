"""A small agent workload for fault runs that accounts for every request.

``AgentLoad`` runs ``agents`` concurrent agents against the router; each plays sessions
back to back (``turns`` streaming or plain chat requests, a short "tool" between turns,
reported to the predictor when a reporter is given; then the session is released), so new
sessions keep arriving throughout a fault. Every *attempt* carries a unique marker in the
body's ``user`` field, which the replica taps record (``bench.faults.tap``).

Each attempt ends as one of:
- ``ok``: a 200 with a complete answer (a stream that reached ``[DONE]`` without an error);
- ``clean_error``: an OpenAI-style error body, or a stream ended by an error event and
  ``[DONE]`` (what docs/architecture.md#failure-modes-and-degraded-behaviour asks of a failure);
- ``refused``: the router did not accept the connection (it is down): nothing was sent;
- ``cut``: the connection broke after the request was sent (or a stream ended without
  ``[DONE]``); acceptable only while the router itself was being killed;
- ``lost``: no answer within the client timeout, or an answer that is not one of the above.
A logical request is retried (new attempt, new marker) after ``refused``, ``cut`` and the
retryable clean errors (502, 503, an error event mid-stream), like the openai client does.

With several routers (``LoadConfig.router_urls``, the fleet suite) the workload is its own
L7 balancer: ``spread="hash"`` sends every request of a session to the router its id hashes
to (what Envoy's ring hash or NGINX ``hash $http_x_session_id consistent`` do),
``"round_robin"`` the next router per request (every request may land on a non-owner). A
router that refused or cut a connection is taken out for ``router_eject_s`` (a balancer's
outlier detection) and the retry goes to the next one in the session's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from services.driver.chat import CHAT_PATH, KINDS, open_http, send_chat
from services.driver.driver import ToolEvents


@dataclass
class Attempt:
    marker: str
    request: str
    session: str
    started_s: float
    ended_s: float = 0.0
    kind: str = "lost"
    status: int | None = None
    replica: str | None = None
    detail: str = ""
    stream: bool = False
    #: the router URL it was sent to
    router: str = ""
    #: a client retries it (``services.driver.chat.Outcome.retryable``)
    retryable: bool = False


@dataclass
class LoadResult:
    attempts: list[Attempt] = field(default_factory=list)
    #: logical request id -> final kind ("ok", "clean_error", "lost", "cut")
    requests: dict[str, str] = field(default_factory=dict)
    sessions_started: int = 0
    sessions_completed: int = 0
    releases: dict[str, int] = field(default_factory=dict)
    #: sessions whose requests did not all end ok, or whose release was not answered 200
    #: (counted only with ``LoadConfig.finish_sessions``)
    unfinished: list[str] = field(default_factory=list)
    #: (session, turn, monotonic time) of every tool call that finished
    tools_finished: list[tuple[str, int, float]] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for a in self.attempts if a.kind == kind)

    def final(self, kind: str) -> int:
        return sum(1 for k in self.requests.values() if k == kind)

    def markers(self) -> set[str]:
        return {a.marker for a in self.attempts}

    def lost(self, router_down: list[tuple[float, float]] | None = None) -> list[Attempt]:
        """Attempts that got no proper answer; ``cut`` ones count unless they overlap a window
        in which the router itself was down (``(start_s, end_s)`` on ``time.monotonic``)."""
        out = []
        for a in self.attempts:
            if a.kind == "lost":
                out.append(a)
            elif a.kind == "cut" and not any(a.started_s <= end and a.ended_s >= start
                                             for start, end in router_down or ()):
                out.append(a)
        return out

    def first_seen(self) -> dict[str, float]:
        """Session -> when its first attempt started."""
        out: dict[str, float] = {}
        for a in self.attempts:
            out.setdefault(a.session, a.started_s)
        return out

    def between(self, start_s: float, end_s: float) -> list[Attempt]:
        """Attempts started in [start_s, end_s)."""
        return [a for a in self.attempts if start_s <= a.started_s < end_s]

    def summary(self) -> dict[str, int]:
        out = {f"attempts_{k}": self.count(k) for k in KINDS}
        out.update({f"requests_{k}": self.final(k) for k in KINDS})
        out["requests"] = len(self.requests)
        out["sessions_started"] = self.sessions_started
        out["sessions_completed"] = self.sessions_completed
        out["sessions_unfinished"] = len(self.unfinished)
        return out


@dataclass
class LoadConfig:
    router_url: str
    model: str
    name: str = "load"
    agents: int = 4
    turns: int = 4
    output_tokens: int = 24
    #: every k-th request is streamed (1: all)
    stream_every: int = 2
    tool_s: float = 0.05
    system_prompt_tokens: int = 256
    append_tokens: int = 96
    request_timeout_s: float = 30.0
    max_attempts: int = 8
    retry_pause_s: float = 0.2
    api_key: str | None = None
    tenant: str | None = None
    tenant_header: str = "x-tao-tenant"
    #: several routers (the fleet): overrides ``router_url``; ``spread`` "hash" or "round_robin"
    router_urls: tuple[str, ...] = ()
    spread: str = "hash"
    #: wall seconds a router that refused or cut a connection is skipped
    router_eject_s: float = 1.0
    #: after ``stop``, agents finish the session they are in (all turns and the release)
    #: instead of leaving it half done: every session started is expected to finish
    finish_sessions: bool = False


class AgentLoad:
    """Run with ``run(stop)``; agents finish their current request after ``stop`` is set."""

    def __init__(self, config: LoadConfig, tools: ToolEvents | None = None) -> None:
        self.config = config
        self.tools = tools
        self.result = LoadResult()
        self._seq = 0
        self._rr = 0
        self._ejected: dict[str, float] = {}

    def _routers(self) -> list[str]:
        return list(self.config.router_urls) or [self.config.router_url]

    def pick_router(self, session: str) -> str:
        """The router for the next attempt of ``session`` (see the module docstring)."""
        routers = self._routers()
        if len(routers) == 1:
            return routers[0]
        if self.config.spread == "round_robin":
            self._rr += 1
            start = self._rr
        else:
            start = zlib.crc32(session.encode())
        now = time.monotonic()
        order = [routers[(start + i) % len(routers)] for i in range(len(routers))]
        live = [r for r in order if self._ejected.get(r, 0.0) <= now]
        return (live or order)[0]

    def _eject(self, router: str) -> None:
        if len(self._routers()) > 1:
            self._ejected[router] = time.monotonic() + self.config.router_eject_s

    def _headers(self, session: str) -> dict[str, str]:
        c = self.config
        headers = {"x-session-id": session, "content-type": "application/json"}
        if c.api_key:
            headers["authorization"] = f"Bearer {c.api_key}"
        if c.tenant:
            headers[c.tenant_header] = c.tenant
        return headers

    def _body(self, session: str, turn: int, marker: str, stream: bool) -> dict[str, Any]:
        c = self.config
        prompt = c.system_prompt_tokens + turn * (c.append_tokens + c.output_tokens) + c.append_tokens
        body: dict[str, Any] = {
            "model": c.model, "messages": [{"role": "user", "content": f"{session} turn {turn}"}],
            "max_tokens": c.output_tokens, "ignore_eos": True, "stream": stream, "user": marker,
            "tao_synthetic": {"session_id": session, "prompt_tokens": prompt, "shared_prefix_id": None,
                              "system_prompt_tokens": c.system_prompt_tokens},
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def _attempt(self, http: aiohttp.ClientSession, a: Attempt, body: dict[str, Any]) -> None:
        url = f"{a.router or self.config.router_url}{CHAT_PATH}"
        out = await send_chat(http, url, body, self._headers(a.session), clock=time.monotonic)
        a.kind, a.status, a.detail = out.kind, out.status, out.detail[:160]
        a.replica = out.headers.get("x-tao-replica")
        a.retryable = out.retryable

    async def _request(self, http: aiohttp.ClientSession, session: str, turn: int, stop: asyncio.Event) -> str:
        """One logical request with retries; returns its final kind. ``refused`` attempts
        (nothing sent) do not use up ``max_attempts``; they are retried until the timeout."""
        c = self.config
        self._seq += 1
        request = f"{c.name}-r{self._seq}"
        stream = c.stream_every > 0 and self._seq % c.stream_every == 0
        kind = "lost"
        tries = 0
        give_up_s = time.monotonic() + c.request_timeout_s
        while tries < c.max_attempts and time.monotonic() < give_up_s:
            marker = f"{request}-{uuid.uuid4().hex[:8]}"
            a = Attempt(marker, request, session, time.monotonic(), stream=stream, router=self.pick_router(session))
            self.result.attempts.append(a)
            await self._attempt(http, a, self._body(session, turn, marker, stream))
            a.ended_s = time.monotonic()
            kind = a.kind
            if kind in ("refused", "cut"):
                self._eject(a.router)
            tries += kind != "refused"
            retry = a.retryable
            if not retry or (kind == "refused" and stop.is_set() and not c.finish_sessions):
                break
            await asyncio.sleep(c.retry_pause_s)
        self.result.requests[request] = kind
        return kind

    async def _release(self, http: aiohttp.ClientSession, session: str) -> bool:
        """Release ``session``; True when a router answered 200. A 5xx or a connection error
        is retried (on the next router when there are several)."""
        for _ in range(self.config.max_attempts):
            router = self.pick_router(session)
            url = f"{router}/v1/sessions/{session}/release"
            try:
                async with http.post(url, headers=self._headers(session)) as resp:
                    key = str(resp.status)
                    self.result.releases[key] = self.result.releases.get(key, 0) + 1
                    if resp.status < 500:
                        return resp.status == 200
            except (aiohttp.ClientError, ConnectionError, TimeoutError):
                self._eject(router)
            await asyncio.sleep(self.config.retry_pause_s)
        return False

    async def _tool(self, session: str, turn: int) -> None:
        call = f"{session}:{turn}"
        if self.tools is not None:
            await self.tools.started(session, call, "bash", f"sleep {self.config.tool_s:g}", None)
        await asyncio.sleep(self.config.tool_s)
        if self.tools is not None:
            await self.tools.finished(session, call)
        self.result.tools_finished.append((session, turn, time.monotonic()))

    async def _agent(self, http: aiohttp.ClientSession, index: int, stop: asyncio.Event) -> None:
        k = 0
        while not stop.is_set():
            session = f"{self.config.name}-a{index}-s{k}-{uuid.uuid4().hex[:6]}"
            k += 1
            self.result.sessions_started += 1
            completed = True
            for turn in range(self.config.turns):
                kind = await self._request(http, session, turn, stop)
                if kind != "ok":
                    completed = False
                    break
                if turn < self.config.turns - 1:
                    await self._tool(session, turn)
                if stop.is_set() and not self.config.finish_sessions:
                    completed = turn == self.config.turns - 1
                    break
            released = await self._release(http, session)
            if completed:
                self.result.sessions_completed += 1
            if not (completed and released) and self.config.finish_sessions:
                self.result.unfinished.append(session)

    async def run(self, stop: asyncio.Event) -> LoadResult:
        async with open_http(self.config.request_timeout_s, connect_s=2.0) as http:
            await asyncio.gather(*(self._agent(http, i, stop) for i in range(self.config.agents)))
        return self.result


@contextlib.asynccontextmanager
async def running(load: AgentLoad) -> Any:
    """``async with running(load) as stop:`` ... — the load runs in the background; on exit
    it is stopped and awaited (its result is ``load.result``)."""
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await task
