"""The one load generator's request (services.driver.chat.send_chat) against a real aiohttp
server on loopback: streamed and unary answers, error bodies and events, cut and refused
connections, a client timeout; both ways of reading a stream; times on an injected clock."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from services.common.testing import free_port
from services.driver.chat import CHAT_PATH, Outcome, open_http, send_chat

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
ERROR_EVENT = b'data: {"error": {"message": "replica failed mid-stream", "code": 502}}\n\n'
DONE = b"data: [DONE]\n\n"
RELEASE = web.AppKey("release", asyncio.Event)


def token(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


async def _answer(request: web.Request) -> web.StreamResponse:
    behave = request.headers.get("x-behave", "ok")
    body = await request.json()
    if behave == "busy":
        return web.json_response({"error": {"message": "held too long", "type": "server_error"}}, status=503,
                                 headers={"Retry-After": "2"})
    if behave == "html":
        return web.Response(status=500, text="<html>oops</html>")
    if behave == "hang":  # until the test is over
        await request.app[RELEASE].wait()
    if behave == "reset":
        assert request.transport is not None
        request.transport.abort()
        return web.Response()
    if not body.get("stream"):
        if behave == "not_chat":
            return web.json_response({"object": "list", "data": []})
        return web.json_response({"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 5}},
                                 headers={"x-tao-replica": "r0"})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-tao-replica": "r0"})
    await resp.prepare(request)
    events = {
        "ok": [ROLE, token("a"), token("b"), token("c"), USAGE, DONE],
        # content that looks like an error key and like [DONE], escaped as JSON escapes it
        "tricky": [token('say \\"error\\": [DONE]'), DONE],
        "error_event": [token("a"), ERROR_EVENT, DONE],
        "no_done": [token("a"), token("b")],
        "empty": [DONE],
        "cut": [token("a"), token("b")],
    }[behave]
    for event in events:
        await resp.write(event)
    if behave == "cut":
        assert request.transport is not None
        request.transport.abort()
        return resp
    await resp.write_eof()
    return resp


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application()
    app[RELEASE] = asyncio.Event()
    app.router.add_post(CHAT_PATH, _answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}{CHAT_PATH}"
    finally:
        app[RELEASE].set()
        await runner.cleanup()


def _body(stream: bool) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream}


async def _send(url: str, behave: str, stream: bool = True, parse: bool = True, timeout_s: float = 10.0,
                t0: float | None = None, clock: Callable[[], float] = time.perf_counter) -> Outcome:
    async with open_http(timeout_s) as http:
        return await send_chat(http, url, _body(stream), {"x-behave": behave}, parse=parse, t0=t0, clock=clock)


async def test_stream_parsed_first_token_usage_and_times_on_the_clock(url: str) -> None:
    ticks = itertools.count()
    out = await _send(url, "ok", clock=lambda: float(next(ticks)))
    assert out.kind == "ok" and out.ok and not out.retryable and out.detail == ""
    assert out.status == 200 and out.headers["x-tao-replica"] == "r0"
    # clock reads: 0 start, 1 headers, then one per event: role 2, a 3, b 4, c 5, usage 6; 7 the end
    assert out.headers_s == 1.0
    assert out.chunks == 5 and out.gaps_s == [1.0, 1.0, 1.0, 1.0]
    assert out.ttft_s == 3.0  # the first chunk with content, not the role chunk
    assert out.total_s == 7.0
    assert out.usage == {"prompt_tokens": 7, "completion_tokens": 3}


async def test_stream_counted_first_event_no_usage(url: str) -> None:
    ticks = itertools.count()
    out = await _send(url, "ok", parse=False, clock=lambda: float(next(ticks)))
    assert out.kind == "ok"
    assert out.chunks == 5 and out.gaps_s == [1.0, 1.0, 1.0, 1.0]
    assert out.ttft_s == 2.0  # counted: the first event
    assert out.usage is None


async def test_t0_counts_from_the_given_time(url: str) -> None:
    out = await _send(url, "ok", parse=False, t0=-100.0, clock=lambda: 0.0)
    assert out.ttft_s == 100.0 and out.total_s == 100.0 and out.headers_s == 100.0


@pytest.mark.parametrize("parse", [True, False])
async def test_escaped_error_and_done_in_content_are_content(url: str, parse: bool) -> None:
    out = await _send(url, "tricky", parse=parse)
    assert out.kind == "ok" and out.chunks == 1


@pytest.mark.parametrize("parse", [True, False])
async def test_error_event_then_done_is_a_clean_retryable_error(url: str, parse: bool) -> None:
    out = await _send(url, "error_event", parse=parse)
    assert out.kind == "clean_error" and out.status == 200
    assert out.detail == "replica failed mid-stream"
    assert out.retryable


@pytest.mark.parametrize("parse", [True, False])
async def test_stream_without_done_is_cut(url: str, parse: bool) -> None:
    out = await _send(url, "no_done", parse=parse)
    assert out.kind == "cut" and out.detail == "stream ended without [DONE]" and out.retryable


@pytest.mark.parametrize("parse", [True, False])
async def test_stream_without_content_is_lost(url: str, parse: bool) -> None:
    out = await _send(url, "empty", parse=parse)
    assert out.kind == "lost" and out.chunks == 0 and out.ttft_s is None and not out.retryable


@pytest.mark.parametrize("parse", [True, False])
async def test_connection_cut_mid_stream(url: str, parse: bool) -> None:
    out = await _send(url, "cut", parse=parse)
    assert out.kind == "cut" and out.status == 200 and out.retryable
    # the break is seen as an exception (payload not completed) or as the end without [DONE]
    assert isinstance(out.exception, aiohttp.ClientError) or out.detail == "stream ended without [DONE]"


async def test_connection_reset_before_the_answer_is_cut(url: str) -> None:
    out = await _send(url, "reset", stream=False)
    assert out.kind == "cut" and out.status is None and isinstance(out.exception, aiohttp.ClientError)


async def test_unary_answers(url: str) -> None:
    out = await _send(url, "ok", stream=False)
    assert out.kind == "ok" and out.chunks == 1 and out.usage == {"prompt_tokens": 5}
    assert out.headers["x-tao-replica"] == "r0" and out.ttft_s is not None and out.ttft_s <= out.total_s
    bad = await _send(url, "not_chat", stream=False)
    assert bad.kind == "lost" and bad.detail == "not a chat completion"
    counted = await _send(url, "not_chat", stream=False, parse=False)
    assert counted.kind == "ok" and counted.usage is None  # counted: a unary 200 is not decoded


async def test_error_bodies(url: str) -> None:
    busy = await _send(url, "busy", stream=True)
    assert busy.kind == "clean_error" and busy.status == 503 and busy.detail == "held too long"
    assert busy.retryable and busy.headers["Retry-After"] == "2" and b"held too long" in busy.body
    html = await _send(url, "html", stream=False)
    assert html.kind == "lost" and html.status == 500 and html.detail.startswith("bad error body")
    assert not html.retryable and html.body == b"<html>oops</html>"


async def test_refused_when_nothing_listens() -> None:
    out = await _send(f"http://127.0.0.1:{free_port()}{CHAT_PATH}", "ok")
    assert out.kind == "refused" and out.status is None and out.headers_s is None and out.retryable


async def test_client_timeout_is_lost(url: str) -> None:
    out = await _send(url, "hang", stream=False, timeout_s=0.3)
    assert out.kind == "lost" and out.detail == "client timeout" and not out.retryable
