"""The upstream pool over real sockets: keep-alive reuse, a server that closes idle
connections, the read-timeout watchdog, refused connections and the connection limit."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from services.router.upstream import Origin, UpstreamError, request_head
from services.router.upstream_pool import UpstreamPool

Reply = Callable[[bytes], bytes | None]


@contextlib.asynccontextmanager
async def raw_server(reply: Reply, close_after: bool = False) -> AsyncIterator[tuple[Origin, list[int]]]:
    """A tiny HTTP/1.1 server: answers each request head+body with ``reply(body)`` (None: stay
    silent until the server stops). Yields the origin and a one-item list counting accepted
    connections; on exit every connection is closed."""
    accepted = [0]
    stop = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                answer = reply(await reader.readexactly(length))
                if answer is None:
                    await stop.wait()
                    return
                writer.write(answer)
                await writer.drain()
                if close_after:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Origin.parse(f"http://127.0.0.1:{port}"), accepted
    finally:
        stop.set()
        server.close()
        for w in writers:
            w.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def echo(body: bytes) -> bytes:
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (b"data: ", body, b"\n\n"))
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


async def _post(pool: UpstreamPool, origin: Origin, body: bytes) -> bytes:
    conn = await pool.post(origin, request_head(origin, "/v1/x", {}, len(body)), body)
    try:
        return await conn.read()
    finally:
        conn.release()


async def test_keep_alive_reuses_one_connection() -> None:
    pool = UpstreamPool(connect_timeout_s=1.0, read_timeout_s=5.0)
    await pool.start()
    try:
        async with raw_server(echo) as (origin, accepted):
            for i in range(5):
                assert await _post(pool, origin, b"n%d" % i) == b"data: n%d\n\n" % i
            assert pool.opened == 1 and accepted[0] == 1 and pool.idle_connections == 1
            results = await asyncio.gather(*(_post(pool, origin, b"c%d" % i) for i in range(4)))
            assert results == [b"data: c%d\n\n" % i for i in range(4)] and pool.opened == 4
    finally:
        await pool.close()


async def test_server_closing_idle_connections_is_noticed() -> None:
    pool = UpstreamPool(connect_timeout_s=1.0, read_timeout_s=5.0)
    await pool.start()
    try:
        async with raw_server(echo, close_after=True) as (origin, accepted):
            assert await _post(pool, origin, b"a") == b"data: a\n\n"
            for _ in range(100):  # the server's FIN drops the pooled connection
                if pool.idle_connections == 0:
                    break
                await asyncio.sleep(0.01)
            assert pool.idle_connections == 0
            assert await _post(pool, origin, b"b") == b"data: b\n\n" and accepted[0] == 2
    finally:
        await pool.close()


async def test_read_timeout_refused_connection_and_limit() -> None:
    pool = UpstreamPool(connect_timeout_s=1.0, read_timeout_s=0.2, max_connections=1)
    await pool.start()
    try:
        async with raw_server(lambda body: None) as (origin, _):
            started = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamError, match="read timeout"):
                await _post(pool, origin, b"x")
            assert 0.15 < asyncio.get_running_loop().time() - started < 2.0
        async with raw_server(echo) as (origin, _):
            slow = asyncio.create_task(_post(pool, origin, b"1"))
            assert await asyncio.wait_for(_post(pool, origin, b"2"), 2) == b"data: 2\n\n"  # waits for the slot
            assert await slow == b"data: 1\n\n"
        with pytest.raises(UpstreamError, match="cannot connect"):
            await _post(pool, Origin.parse(f"http://127.0.0.1:{closed_port()}"), b"refused")
    finally:
        await pool.close()
