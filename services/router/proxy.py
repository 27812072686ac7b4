"""Forwarding a granted request to its replica and relaying the answer.

- Streams are relayed event by event as they arrive (split on the SSE blank line, never
  re-encoded); only events that carry a ``usage`` object are parsed. If the client did not
  ask for usage, the router asked on its behalf and drops the final usage-only chunk.
- A failure before the first byte reaches the client (connection refused/reset, timeout,
  502/503/504, a stream that ends before its first event) is reported to the breaker and
  the request is held again for another replica, at most ``max_attempts`` replicas; then
  502. Nothing has been sent to the client, so this is invisible to it.
- A failure mid-stream ends the client's stream cleanly: an OpenAI-style error event
  ``data: {"error": {...}}`` (the official client raises ``APIError`` on it) and then
  ``data: [DONE]``. The session goes back to the pool (its replica is down).
- A client that goes away closes the upstream response, so the replica aborts the request.
- The client's API key is never forwarded; ``upstream_api_key`` is, when set.
Every grant is settled exactly once (``finish`` or ``retry``), whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from services.router.core.model import Grant, Usage
from services.router.runtime import HoldTimeout, RouterRuntime, SessionReleased
from services.router.validation import ParsedRequest, RequestError

USAGE_RE = re.compile(rb'"usage"\s*:\s*\{')
RETRYABLE_STATUS = frozenset({502, 503, 504})
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class UpstreamFailed(Exception):
    """The replica failed before the client saw a byte."""


class ClientGone(Exception):
    pass


@dataclass
class Exchange:
    request_id: str
    session_id: str
    tenant: str
    path: str
    parsed: ParsedRequest
    arrived_s: float
    deadline_s: float
    #: router time before the upstream call, excluding holds (for the overhead metric)
    pre_s: float = 0.0
    #: when the current stretch of router-own time started
    mark_s: float = 0.0
    settled: bool = False
    #: model seconds the request was held before admission (reported as x-tao-hold-ms)
    hold_s: float = 0.0

    def forwarding(self, now_s: float) -> None:
        """The upstream call starts: close the current stretch of router time."""
        self.pre_s += now_s - self.mark_s


def error_response(err: RequestError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=headers)


def unavailable(rt: RouterRuntime, message: str) -> web.Response:
    err = RequestError(503, message, code="service_unavailable", type_="server_error")
    return error_response(err, {"Retry-After": str(rt.settings.retry_after_s)})


def parse_usage(obj: Any) -> Usage | None:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached if isinstance(cached, int) else None)


def take_usage(block: bytes, strip: bool) -> tuple[bytes, Usage | None]:
    """Read usage from the events of ``block`` that carry it; drop a usage-only chunk (or the
    usage field) when ``strip``."""
    found: Usage | None = None
    out = []
    for event in block.split(b"\n\n"):
        if not event or not USAGE_RE.search(event):
            out.append(event)
            continue
        payload = event[event.index(b"data:") + 5:] if b"data:" in event else b""
        try:
            obj = json.loads(payload)
        except ValueError:
            out.append(event)
            continue
        found = parse_usage(obj) or found
        if not strip:
            out.append(event)
        elif obj.get("choices"):
            obj.pop("usage", None)
            out.append(b"data: " + json.dumps(obj, separators=(",", ":")).encode())
    kept = b"\n\n".join(e for e in out if e)
    return (kept + b"\n\n" if kept else b""), found


def _stream_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": 502}}
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


async def serve(rt: RouterRuntime, request: web.Request, ex: Exchange, grant: Grant) -> web.StreamResponse:
    """Forward until a replica answers (bounded retries); always settles the request."""
    try:
        while True:
            entry = rt.registry.entries.get(grant.replica)
            try:
                if entry is None:
                    raise UpstreamFailed(f"replica {grant.replica} was removed")
                return await _attempt(rt, request, ex, grant, entry.url)
            except UpstreamFailed as exc:
                down = rt.replica_failed(grant.replica, str(exc))
                ex.settled = True
                fut = rt.retry(ex.request_id, ex.tenant, down)
                if fut is None:
                    err = RequestError(502, f"no replica answered: {exc}", code="upstream_failed", type_="server_error")
                    return error_response(err)
                try:
                    grant = await rt.wait_grant(ex.request_id, fut, ex.deadline_s)
                except HoldTimeout:
                    return unavailable(rt, "no replica could take the request within the hold timeout")
                except SessionReleased:
                    return error_response(RequestError(409, "the session was released", code="session_released"))
                ex.settled = False
                ex.mark_s = rt.now()
    finally:
        if not ex.settled:
            ex.settled = True
            rt.finish(ex.request_id, ex.tenant, None, rt.now() - ex.arrived_s)


def _headers(rt: RouterRuntime, ex: Exchange) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "X-Request-Id": ex.request_id}
    key = rt.settings.upstream_api_key
    if key is not None:
        headers["Authorization"] = f"Bearer {key.get_secret_value()}"
    return headers


async def _attempt(rt: RouterRuntime, request: web.Request, ex: Exchange, grant: Grant,
                   url: str) -> web.StreamResponse:
    assert rt.http is not None
    ex.forwarding(rt.now())
    try:
        resp = await rt.http.post(url + ex.path, data=ex.parsed.upstream_body, headers=_headers(rt, ex))
    except UPSTREAM_ERRORS as exc:
        raise UpstreamFailed(f"{grant.replica}: {type(exc).__name__}: {exc}") from exc
    try:
        out_headers = {"x-tao-replica": grant.replica, "x-tao-session": ex.session_id,
                       "x-tao-hold-ms": f"{ex.hold_s * 1000:.3f}"}
        if resp.status in RETRYABLE_STATUS:
            raise UpstreamFailed(f"{grant.replica} answered {resp.status}")
        if not ex.parsed.stream or resp.status != 200:
            try:
                body = await resp.read()
            except UPSTREAM_ERRORS as exc:
                raise UpstreamFailed(f"{grant.replica}: {type(exc).__name__} reading the answer") from exc
            answered = rt.now()
            usage = None
            if resp.status == 200:
                try:
                    usage = parse_usage(json.loads(body))
                except ValueError:
                    usage = None
            elapsed = rt.now() - ex.arrived_s
            rt.first_token(ex.request_id, elapsed)
            rt.registry.report_success(grant.replica)
            ex.settled = True
            rt.finish(ex.request_id, ex.tenant, usage, elapsed)
            out_headers["Content-Type"] = resp.headers.get("Content-Type", "application/json")
            response = web.Response(body=body, status=resp.status, headers=out_headers)
            rt.metrics.overhead.observe(rt.wall(ex.pre_s + rt.now() - answered))
            return response
        return await _relay(rt, request, ex, grant, resp, out_headers)
    finally:
        resp.release()


async def _relay(rt: RouterRuntime, request: web.Request, ex: Exchange, grant: Grant,
                 resp: aiohttp.ClientResponse, out_headers: dict[str, str]) -> web.StreamResponse:
    client: web.StreamResponse | None = None
    strip = not ex.parsed.client_wants_usage
    usage: Usage | None = None
    buf = b""
    done = False

    async def send(data: bytes, read_at_s: float = 0.0) -> None:
        nonlocal client
        try:
            if client is None:
                client = web.StreamResponse(status=200, headers={**SSE_HEADERS, **out_headers})
                await client.prepare(request)
                await client.write(data)
                now = rt.now()
                rt.first_token(ex.request_id, now - ex.arrived_s)
                rt.metrics.ttft.observe(now - ex.arrived_s)
                if read_at_s:
                    rt.metrics.overhead.observe(rt.wall(ex.pre_s + now - read_at_s))
                return
            await client.write(data)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError, RuntimeError) as exc:
            raise ClientGone() from exc

    try:
        try:
            async for chunk in resp.content.iter_any():
                read_at = rt.now() if client is None else 0.0
                buf = buf + chunk if buf else chunk
                cut = buf.rfind(b"\n\n")
                if cut < 0:
                    continue
                block, buf = buf[: cut + 2], buf[cut + 2:]
                if b'"usage"' in block and USAGE_RE.search(block):
                    block, found = take_usage(block, strip)
                    usage = found or usage
                if block.endswith(b"[DONE]\n\n"):
                    done = True
                if block:
                    await send(block, read_at)
        except UPSTREAM_ERRORS as exc:
            if client is None:
                raise UpstreamFailed(f"{grant.replica}: {type(exc).__name__} before the first event") from exc
            rt.replica_failed(grant.replica, f"mid-stream: {exc}")
            await send(_stream_error(f"replica {grant.replica} failed mid-stream: {type(exc).__name__}"))
            return client
        if buf:
            await send(buf)
        if not done:
            if client is None:
                raise UpstreamFailed(f"{grant.replica} closed the stream before its first event")
            rt.replica_failed(grant.replica, "stream ended without [DONE]")
            await send(_stream_error(f"replica {grant.replica} ended the stream early"))
            return client
        rt.registry.report_success(grant.replica)
        ex.settled = True
        rt.finish(ex.request_id, ex.tenant, usage, rt.now() - ex.arrived_s)
        assert client is not None
        await client.write_eof()
        return client
    except ClientGone:
        resp.close()  # the replica aborts the request
        ex.settled = True
        rt.finish(ex.request_id, ex.tenant, None, rt.now() - ex.arrived_s)
        return client if client is not None else web.Response(status=499)
