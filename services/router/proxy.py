"""Forwarding a granted request to its replica and relaying the answer.

- Upstream calls go through ``upstream.UpstreamPool`` (keep-alive HTTP/1.1). Streams are
  relayed event by event as they arrive by ``relay.StreamRelay``, straight from the upstream
  protocol callback to the client's transport (split on the SSE blank line, never
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

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import HttpVersion11, web

from services.common import tracing
from services.router import tracing as router_tracing
from services.router.core.model import Grant
from services.router.core.tools import StreamedCalls, ToolCall, calls_of_answer
from services.router.relay import StreamRelay, parse_usage, take_usage
from services.router.runtime import HoldTimeout, RouterRuntime, SessionReleased
from services.router.upstream import Origin, UpstreamError, request_head
from services.router.upstream_pool import UpstreamResponse
from services.router.validation import ParsedRequest, RequestError, stream_error

__all__ = ["Exchange", "error_response", "parse_usage", "serve", "take_usage", "unavailable"]

RETRYABLE_STATUS = frozenset({502, 503, 504})
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_WRITE_ERRORS = (ConnectionResetError, RuntimeError)  # aiohttp's ClientConnectionResetError is one


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
    #: the current attempt's ``router.upstream`` span (None while tracing is off)
    span: Any = None

    def forwarding(self, now_s: float) -> None:
        """The upstream call starts: close the current stretch of router time."""
        self.pre_s += now_s - self.mark_s


def error_response(err: RequestError, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=headers)


def unavailable(rt: RouterRuntime, message: str) -> web.Response:
    err = RequestError(503, message, code="service_unavailable", type_="server_error")
    return error_response(err, {"Retry-After": str(rt.settings.retry_after_s)})


async def serve(rt: RouterRuntime, request: web.Request, ex: Exchange, grant: Grant) -> web.StreamResponse:
    """Forward until a replica answers (bounded retries); always settles the request."""
    try:
        while True:
            entry = rt.registry.entries.get(grant.replica)
            try:
                if entry is None:
                    raise UpstreamFailed(f"replica {grant.replica} was removed")
                if not tracing.enabled():
                    return await _attempt(rt, request, ex, grant, entry.origin)
                with router_tracing.start_attempt(grant.replica, grant.attempt) as ex.span:
                    return await _attempt(rt, request, ex, grant, entry.origin)
            except UpstreamFailed as exc:
                down = rt.replica_failed(grant.replica, str(exc))
                ex.settled = True
                fut = rt.retry(ex.request_id, ex.tenant, down)
                if fut is None:
                    err = RequestError(502, f"no replica answered: {exc}", code="upstream_failed", type_="server_error")
                    return error_response(err)
                hold = router_tracing.start_hold(rt, ex.request_id, "retry")
                try:
                    grant = await rt.wait_grant(ex.request_id, fut, rt.now())
                except HoldTimeout:
                    router_tracing.end_hold(rt, hold, "hold timeout")
                    return unavailable(rt, "no replica could take the request within the hold timeout")
                except SessionReleased:
                    router_tracing.end_hold(rt, hold, "session released")
                    return error_response(RequestError(409, "the session was released", code="session_released"))
                except BaseException:
                    router_tracing.end_hold(rt, hold, "client gone")
                    raise
                router_tracing.end_hold(rt, hold)
                ex.settled = False
                ex.mark_s = rt.now()
    finally:
        if not ex.settled:
            ex.settled = True
            rt.finish(ex.request_id, ex.tenant, None, rt.now() - ex.arrived_s)


async def _attempt(rt: RouterRuntime, request: web.Request, ex: Exchange, grant: Grant,
                   origin: Origin) -> web.StreamResponse:
    body = ex.parsed.upstream_body
    headers = {**rt.upstream_headers, "X-Request-Id": ex.request_id}
    if ex.span is not None:
        tracing.inject(headers)  # traceparent: this attempt's span, in the client's trace
    head = request_head(origin, ex.path, headers, len(body))
    ex.forwarding(rt.now())
    try:
        resp = await rt.upstream.post(origin, head, body)
    except UpstreamError as exc:
        raise UpstreamFailed(f"{grant.replica}: {exc}") from exc
    if ex.span is not None:
        ex.span.set_attribute("http.response.status_code", resp.status)
    try:
        out_headers = {"x-tao-replica": grant.replica, "x-tao-session": ex.session_id,
                       "x-tao-hold-ms": f"{ex.hold_s * 1000:.3f}"}
        if resp.status in RETRYABLE_STATUS:
            raise UpstreamFailed(f"{grant.replica} answered {resp.status}")
        if not ex.parsed.stream or resp.status != 200:
            try:
                data = await resp.read()
            except UpstreamError as exc:
                raise UpstreamFailed(f"{grant.replica}: {exc} reading the answer") from exc
            answered = rt.now()
            if ex.span is not None:
                ex.span.add_event("first_byte")
            usage = None
            calls: tuple[ToolCall, ...] = ()
            if resp.status == 200:
                try:
                    answer = orjson.loads(data)
                except ValueError:
                    answer = None
                usage = parse_usage(answer)
                calls = calls_of_answer(ex.request_id, answer)
            elapsed = rt.now() - ex.arrived_s
            rt.first_token(ex.request_id, elapsed)
            rt.metrics.ttft.observe(elapsed)  # an unstreamed answer's first byte goes out with all of it
            rt.registry.report_success(grant.replica)
            ex.settled = True
            rt.finish(ex.request_id, ex.tenant, usage, elapsed)
            if calls:
                rt.tool_calls(ex.session_id, calls)
            if usage is not None:
                rt.learn_prompt(ex.session_id, grant.replica, ex.path, ex.parsed.upstream_body)
            if 400 <= resp.status < 500:
                rt.drop_if_unused(ex.session_id)
            out_headers["Content-Type"] = resp.headers.get("content-type", "application/json")
            response = web.Response(body=data, status=resp.status, headers=out_headers)
            rt.metrics.overhead.observe(rt.wall(ex.pre_s + rt.now() - answered))
            return response
        return await _relay(rt, request, ex, grant, resp, out_headers)
    finally:
        resp.release()


async def _relay(rt: RouterRuntime, request: web.Request, ex: Exchange, grant: Grant,
                 resp: UpstreamResponse, out_headers: dict[str, str]) -> web.StreamResponse:
    """Relay a stream (``StreamRelay`` writes the events; this task prepares the client
    response, drains it under backpressure and settles the end)."""
    relay = StreamRelay(resp, not ex.parsed.client_wants_usage, rt.now)
    if ex.parsed.has_tools:
        relay.tools = StreamedCalls()
    resp.attach(relay)
    client: web.StreamResponse | None = None
    try:
        while True:
            await relay.wait()
            if relay.client_gone:
                raise ClientGone()
            if client is None and relay.pending:
                client = await _open_client(rt, request, ex, relay, out_headers)
            if relay.paused:
                assert client is not None
                try:
                    await request.writer.drain()
                except CLIENT_WRITE_ERRORS as exc:
                    raise ClientGone() from exc
                relay.resume()
            if relay.saw_done or (relay.ended and not relay.paused):
                break
        if relay.client_gone:
            raise ClientGone()
        if relay.saw_done:
            resp.release_when_done()  # the replica's end of body follows [DONE]: keep the connection
            rt.registry.report_success(grant.replica)
            ex.settled = True
            rt.finish(ex.request_id, ex.tenant, relay.usage, rt.now() - ex.arrived_s)
            if relay.tools is not None and (calls := relay.tools.calls(ex.request_id)):
                rt.tool_calls(ex.session_id, calls)
            rt.learn_prompt(ex.session_id, grant.replica, ex.path, ex.parsed.upstream_body)
            if client is None:
                client = await _open_client(rt, request, ex, relay, out_headers)
            try:
                await client.write_eof(relay.final)  # the last events and the end of the response: one write
            except CLIENT_WRITE_ERRORS:
                pass  # the client went away at the very end: the request is complete all the same
            return client
        if relay.error is not None:
            if client is None:
                raise UpstreamFailed(f"{grant.replica}: {relay.error} before the first event")
            rt.replica_failed(grant.replica, f"mid-stream: {relay.error}")
            relay.send(stream_error(f"replica {grant.replica} failed mid-stream: {relay.error}"))
            return client
        if relay.leftover:
            if client is None:
                relay.pending.append(relay.leftover)
                client = await _open_client(rt, request, ex, relay, out_headers)
            else:
                relay.send(relay.leftover)
        # the body ended without [DONE]
        if client is None:
            raise UpstreamFailed(f"{grant.replica} closed the stream before its first event")
        rt.replica_failed(grant.replica, "stream ended without [DONE]")
        relay.send(stream_error(f"replica {grant.replica} ended the stream early"))
        return client
    except ClientGone:
        resp.close()  # the replica aborts the request
        ex.settled = True
        rt.finish(ex.request_id, ex.tenant, None, rt.now() - ex.arrived_s)
        return client if client is not None else web.Response(status=499)


async def _open_client(rt: RouterRuntime, request: web.Request, ex: Exchange, relay: StreamRelay,
                       out_headers: dict[str, str]) -> web.StreamResponse:
    """Send the client's response head and the first events; record TTFT and own time."""
    client = web.StreamResponse(status=200, headers={**SSE_HEADERS, **out_headers})
    chunked = request.version == HttpVersion11
    if chunked:
        client.enable_chunked_encoding()
    try:
        await client.prepare(request)
    except CLIENT_WRITE_ERRORS as exc:
        raise ClientGone() from exc
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ClientGone()
    relay.attach_client(transport, chunked)
    if ex.span is not None:
        ex.span.add_event("first_byte")
    now = rt.now()
    rt.first_token(ex.request_id, now - ex.arrived_s)
    rt.metrics.ttft.observe(now - ex.arrived_s)
    if relay.first_read_s:
        rt.metrics.overhead.observe(rt.wall(ex.pre_s + now - relay.first_read_s))
    return client
