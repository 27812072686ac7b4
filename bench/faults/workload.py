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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from services.driver.driver import ToolEvents

RETRYABLE_STATUS = frozenset({502, 503, 504})


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


@dataclass
class LoadResult:
    attempts: list[Attempt] = field(default_factory=list)
    #: logical request id -> final kind ("ok", "clean_error", "lost", "cut")
    requests: dict[str, str] = field(default_factory=dict)
    sessions_started: int = 0
    sessions_completed: int = 0
    releases: dict[str, int] = field(default_factory=dict)
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
        kinds = ("ok", "clean_error", "refused", "cut", "lost")
        out = {f"attempts_{k}": self.count(k) for k in kinds}
        out.update({f"requests_{k}": self.final(k) for k in ("ok", "clean_error", "refused", "cut", "lost")})
        out["requests"] = len(self.requests)
        out["sessions_started"] = self.sessions_started
        out["sessions_completed"] = self.sessions_completed
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


class AgentLoad:
    """Run with ``run(stop)``; agents finish their current request after ``stop`` is set."""

    def __init__(self, config: LoadConfig, tools: ToolEvents | None = None) -> None:
        self.config = config
        self.tools = tools
        self.result = LoadResult()
        self._seq = 0

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
        url = f"{self.config.router_url}/v1/chat/completions"
        sent = False
        try:
            async with http.post(url, json=body, headers=self._headers(a.session)) as resp:
                sent = True
                a.status = resp.status
                a.replica = resp.headers.get("x-tao-replica")
                if resp.status != 200:
                    raw = await resp.read()
                    try:
                        err = json.loads(raw).get("error")
                    except (ValueError, AttributeError):
                        err = None
                    ok_shape = isinstance(err, dict) and isinstance(err.get("message"), str)
                    a.kind = "clean_error" if ok_shape else "lost"
                    a.detail = (err or {}).get("message", "")[:160] if ok_shape else f"bad error body {raw[:80]!r}"
                    return
                if not a.stream:
                    answer = json.loads(await resp.read())
                    good = bool(answer.get("choices")) and isinstance(answer.get("usage"), dict)
                    a.kind = "ok" if good else "lost"
                    return
                await self._read_stream(resp, a)
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            a.kind = "refused" if not sent else "cut"
            a.detail = type(exc).__name__
        except TimeoutError:
            a.kind, a.detail = "lost", "client timeout"
        except (aiohttp.ClientError, ConnectionError, ValueError) as exc:
            a.kind, a.detail = "cut", f"{type(exc).__name__}: {exc}"[:160]

    async def _read_stream(self, resp: aiohttp.ClientResponse, a: Attempt) -> None:
        error: str | None = None
        content = False
        done = False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                error = str(chunk["error"].get("message", chunk["error"]))[:160]
            elif chunk.get("choices"):
                content = True
        if not done:
            a.kind, a.detail = "cut", "stream ended without [DONE]"
        elif error is not None:
            a.kind, a.detail = "clean_error", error
        else:
            a.kind = "ok" if content else "lost"
            a.detail = "" if content else "stream without content"

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
            a = Attempt(marker, request, session, time.monotonic(), stream=stream)
            self.result.attempts.append(a)
            await self._attempt(http, a, self._body(session, turn, marker, stream))
            a.ended_s = time.monotonic()
            kind = a.kind
            tries += kind != "refused"
            retry = kind in ("refused", "cut") or (kind == "clean_error" and (
                a.status in RETRYABLE_STATUS or (a.status == 200 and a.stream)))
            if not retry or (kind == "refused" and stop.is_set()):
                break
            await asyncio.sleep(c.retry_pause_s)
        self.result.requests[request] = kind
        return kind

    async def _release(self, http: aiohttp.ClientSession, session: str) -> None:
        url = f"{self.config.router_url}/v1/sessions/{session}/release"
        for _ in range(self.config.max_attempts):
            try:
                async with http.post(url, headers=self._headers(session)) as resp:
                    key = str(resp.status)
                    self.result.releases[key] = self.result.releases.get(key, 0) + 1
                    return
            except (aiohttp.ClientError, ConnectionError, TimeoutError):
                await asyncio.sleep(self.config.retry_pause_s)

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
                if stop.is_set():
                    completed = turn == self.config.turns - 1
                    break
            await self._release(http, session)
            if completed:
                self.result.sessions_completed += 1

    async def run(self, stop: asyncio.Event) -> LoadResult:
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s, connect=2.0)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
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
