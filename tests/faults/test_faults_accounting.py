"""The instruments of the fault suite can see what they claim to see: the replica tap
parses HTTP/1.1 exchanges (keep-alive, chunked SSE, Content-Length, cut streams, clients
that left) and the workload classifies every kind of answer; duplicates, replays and lost
requests are detected when they happen."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from bench.faults.tap import ReplicaTap, TapLog
from bench.faults.workload import AgentLoad, Attempt, LoadConfig, LoadResult
from services.common.testing import free_port


async def _fake_replica(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    # the tap tests say how to behave in the body; the workload tests in the session id
    behave = body.get("behave") or request.headers.get("x-session-id", "ok-").split("-")[0]
    if behave == "error400":
        return web.json_response({"error": {"message": "bad", "type": "BadRequestError"}}, status=400)
    if behave == "slow":
        await asyncio.sleep(0.5)
    if not body.get("stream"):
        return web.json_response({"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 1}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(3):
        await resp.write(b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i)
    if behave == "cut":
        assert request.transport is not None
        request.transport.abort()
        return resp
    if behave == "error_event":
        await resp.write(b'data: {"error": {"message": "replica failed mid-stream"}}\n\n')
    elif behave == "no_done":
        await resp.write_eof()
        return resp
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
async def replica() -> AsyncIterator[tuple[str, TapLog]]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _fake_replica)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    log = TapLog()
    tap = await ReplicaTap("r0", "127.0.0.1", port, log).start()
    try:
        yield f"http://127.0.0.1:{tap.port}", log
    finally:
        await tap.stop()
        await runner.cleanup()


async def _post(http: aiohttp.ClientSession, url: str, **body: object) -> tuple[int, bytes]:
    try:
        async with http.post(url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}) as r:
            return r.status, await r.read()
    except aiohttp.ClientPayloadError:
        return -1, b""


async def test_tap_records_each_exchange_on_a_keep_alive_connection(replica: tuple[str, TapLog]) -> None:
    url, log = replica
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        assert (await _post(http, url, user="m-unary"))[0] == 200
        assert (await _post(http, url, user="m-stream", stream=True))[0] == 200
        assert (await _post(http, url, user="m-400", behave="error400"))[0] == 400
        assert (await _post(http, url, user="m-event", stream=True, behave="error_event"))[0] == 200
        assert (await _post(http, url, user="m-nodone", stream=True, behave="no_done"))[0] == 200
        await _post(http, url, user="m-cut", stream=True, behave="cut")
    await asyncio.sleep(0.1)
    got = {r.marker: r for r in log.completions()}
    assert set(got) == {"m-unary", "m-stream", "m-400", "m-event", "m-nodone", "m-cut"}
    assert got["m-unary"].completed and got["m-stream"].completed
    assert got["m-event"].completed  # [DONE] arrived: the replica answered (the error is its answer)
    assert not got["m-400"].completed and got["m-400"].status == 400
    assert not got["m-nodone"].completed and not got["m-cut"].completed
    assert all(r.ended for r in got.values())
    assert got["m-unary"].headers["authorization"] == "Bearer k"
    assert log.active == 0 and log.peak_active == 1
    assert log.duplicates() == [] and log.replays() == []


async def test_tap_detects_duplicates(replica: tuple[str, TapLog]) -> None:
    url, log = replica
    async with aiohttp.ClientSession() as http:
        await _post(http, url, user="twice")
        await _post(http, url, user="twice", stream=True)
        await _post(http, url, user="once")
    assert log.duplicates() == ["twice"]
    assert log.duplicates({"once", "other"}) == []


async def test_tap_flags_answers_computed_for_a_client_that_left() -> None:
    """A replica whose answer a blackhole held until the router had given up on it (and
    failed the request over): a replay, not a duplicate."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        await asyncio.sleep(0.2)
        body = b'{"choices": [], "usage": {}}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
        await asyncio.sleep(1.0)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    log = TapLog()
    tap = await ReplicaTap("r0", "127.0.0.1", server.sockets[0].getsockname()[1], log).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        body = json.dumps({"user": "left"}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
        await asyncio.sleep(0.1)
        tap.set_mode("blackhole")  # the answer (due at 0.2 s) is held
        await asyncio.sleep(0.2)
        writer.close()  # the client gives up (a read timeout)
        await asyncio.sleep(0.1)
        tap.set_mode("pass")
        await asyncio.sleep(0.2)
    finally:
        await tap.stop()
        server.close()
    [copy] = log.completions()
    assert copy.completed and copy.abandoned
    assert log.replays() == ["left"] and log.duplicates() == []


async def _router(request: web.Request) -> web.StreamResponse:
    mode = request.headers.get("x-session-id", "").split("-")[0]
    if mode == "busy":
        return web.json_response({"error": {"message": "held too long", "type": "server_error"}}, status=503)
    if mode == "html":
        return web.Response(status=500, text="<html>oops</html>")
    if mode == "hang":
        await asyncio.sleep(5)
    if mode == "reset":
        assert request.transport is not None
        request.transport.abort()
        return web.Response()
    return await _fake_replica(request)


@pytest.mark.parametrize(("mode", "stream", "kind"), [
    ("ok", True, "ok"), ("ok", False, "ok"), ("error_event", True, "clean_error"), ("no_done", True, "cut"),
    ("cut", True, "cut"), ("busy", False, "clean_error"), ("html", False, "lost"), ("hang", False, "lost"),
    ("reset", False, "cut"),
])
async def test_workload_classifies_every_answer(mode: str, stream: bool, kind: str) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _router)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    load = AgentLoad(LoadConfig(f"http://127.0.0.1:{port}", "m", request_timeout_s=0.5))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as http:
            a = Attempt("mk", "r1", f"{mode}-s", time.monotonic(), stream=stream)
            await load._attempt(http, a, load._body(a.session, 0, a.marker, stream))
    finally:
        await runner.cleanup()
    assert a.kind == kind, (a.kind, a.detail)


async def test_refused_when_nothing_listens() -> None:
    load = AgentLoad(LoadConfig(f"http://127.0.0.1:{free_port()}", "m"))
    async with aiohttp.ClientSession() as http:
        a = Attempt("mk", "r1", "s", time.monotonic())
        await load._attempt(http, a, load._body("s", 0, "mk", False))
    assert a.kind == "refused"


def test_cut_attempts_count_as_lost_unless_the_router_was_down() -> None:
    result = LoadResult(attempts=[Attempt("a", "r1", "s", 10.0, 11.0, "cut"), Attempt("b", "r2", "s", 20.0, 21.0, "cut"),
                                  Attempt("c", "r3", "s", 30.0, 31.0, "lost"), Attempt("d", "r4", "s", 40.0, 41.0, "ok")])
    assert [a.marker for a in result.lost()] == ["a", "b", "c"]
    assert [a.marker for a in result.lost([(10.5, 12.0)])] == ["b", "c"]
