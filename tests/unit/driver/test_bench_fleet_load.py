"""The router fleet benchmark's load (bench.router.fleet.load) on the one load generator, against
real aiohttp servers on loopback standing in for routers: every turn is sent once, to the
session's home router (hashed) or to the next router each turn (round robin), with its
``x-session-id``; ``ok`` answers count as answered, anything else (an error status, a cut
connection) as failed."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bench.router.fleet import load
from services.common.testing import free_port
from services.driver.chat import CHAT_PATH

SEEN = web.AppKey("seen", list)


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _chat(request: web.Request) -> web.Response:
    sid = request.headers["x-session-id"]
    request.app[SEEN].append(sid)
    if sid.startswith("busy-"):
        return web.json_response({"error": {"message": "held too long"}}, status=503)
    if sid.startswith("cut-"):
        assert request.transport is not None
        request.transport.abort()
        return web.Response()
    return web.json_response({"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}})


@pytest.fixture
async def routers() -> AsyncIterator[list[tuple[str, list[str]]]]:
    runners, out = [], []
    for _ in range(3):
        app = web.Application()
        app[SEEN] = []
        app.router.add_get("/health", _health)
        app.router.add_post(CHAT_PATH, _chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        out.append((f"http://127.0.0.1:{port}", app[SEEN]))
    try:
        yield out
    finally:
        for runner in runners:
            await runner.cleanup()


def _home(sid: str, n: int) -> int:
    return zlib.crc32(sid.encode()) % n


async def test_hashed_load_sends_every_turn_to_the_sessions_home(routers: list[tuple[str, list[str]]]) -> None:
    urls = [u for u, _ in routers]
    assert await load(urls, 5, 4, "hash", "t") == (20, 0)
    for i, (_, seen) in enumerate(routers):
        assert all(_home(sid, 3) == i for sid in seen)
    assert sorted(sid for _, seen in routers for sid in seen) == sorted(f"t-{i}" for i in range(5) for _ in range(4))


async def test_round_robin_load_moves_each_turn_to_the_next_router(routers: list[tuple[str, list[str]]]) -> None:
    urls = [u for u, _ in routers]
    assert await load(urls, 2, 6, "rr", "t") == (12, 0)
    for _, seen in routers:  # 6 turns over 3 routers: each session twice on each
        assert sorted(seen) == ["t-0", "t-0", "t-1", "t-1"]


async def test_error_answers_and_cut_connections_fail(routers: list[tuple[str, list[str]]]) -> None:
    urls = [u for u, _ in routers]
    assert await load(urls, 2, 3, "hash", "busy") == (0, 6)  # 503 with an OpenAI error body
    assert await load(urls, 2, 3, "hash", "cut") == (0, 6)  # the connection aborted after sending
    assert await load(urls, 2, 3, "rr", "fine") == (6, 0)
