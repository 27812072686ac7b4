"""The router's upstream HTTP/1.1 client (``services/router/upstream.py``) and its SSE relay
(``services/router/relay.py``), driven through the asyncio protocol callbacks with fake
transports: response framing split at every byte, keep-alive decisions, failures, and
the relay's pass-through, usage stripping, backpressure and client-gone handling."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.core.model import Usage
from services.router.relay import StreamRelay, take_usage
from services.router.upstream import Origin, UpstreamConnection, UpstreamError, request_head
from services.router.upstream_pool import UpstreamPool, UpstreamResponse


class FakeTransport(asyncio.Transport):
    def __init__(self, buffered: int = 0) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False
        self.aborted = False
        self.paused = False
        self.buffered = buffered

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.aborted = self.closing = True

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return self.buffered


class Sink:
    def __init__(self) -> None:
        self.data = b""
        self.ended: list[UpstreamError | None] = []

    def feed(self, data: bytes) -> None:
        self.data += data

    def end(self, exc: UpstreamError | None) -> None:
        self.ended.append(exc)


ORIGIN = Origin.parse("http://127.0.0.1:9")


def _conn() -> tuple[UpstreamPool, UpstreamConnection, FakeTransport, asyncio.Future[None]]:
    pool = UpstreamPool(connect_timeout_s=1.0, read_timeout_s=5.0)
    conn = UpstreamConnection(pool, ORIGIN)
    transport = FakeTransport()
    conn.connection_made(transport)
    pool._busy.add(conn)
    head = conn.send(b"POST / HTTP/1.1\r\n\r\n")
    return pool, conn, transport, head


def _chunked(pieces: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n" + trailers + b"\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_origin_and_request_head() -> None:
    o = Origin.parse("https://gpu1.example:8443/prefix/")
    assert (o.scheme, o.host, o.port, o.prefix, o.authority) == ("https", "gpu1.example", 8443, "/prefix",
                                                                 "gpu1.example:8443")
    assert Origin.parse("http://h").authority == "h" and Origin.parse("http://h").port == 80
    head = request_head(o, "/v1/completions", {"X-Request-Id": "r1"}, 12)
    assert head.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\nHost: gpu1.example:8443\r\nContent-Length: 12\r\n")
    assert head.endswith(b"X-Request-Id: r1\r\n\r\n")
    with pytest.raises(ValueError):
        request_head(o, "/x", {"X-Evil": "a\r\nInjected: 1"}, 0)
    with pytest.raises(ValueError):
        Origin.parse("ftp://h")


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=5),
       cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
       trailers=st.sampled_from([b"", b"X-Trailer: 1\r\n"]))
def test_chunked_body_survives_any_split(pieces: list[bytes], cuts: list[int], trailers: bytes) -> None:
    async def run() -> None:
        pool, conn, _, head = _conn()
        wire = HEAD_CHUNKED + _chunked(pieces, trailers)
        points = sorted({c % len(wire) for c in cuts} - {0})
        sink = Sink()
        for a, b in zip([0, *points], [*points, len(wire)], strict=True):
            conn.data_received(wire[a:b])
            if head.done() and conn._sink is None:
                conn.attach(sink)
        assert head.done() and conn.status == 200
        assert sink.data == b"".join(pieces) and sink.ended == [None]
        conn.release()
        assert pool.idle_connections == 1  # read to its end: reusable

    asyncio.run(run())


async def test_content_length_close_delimited_and_interim_responses() -> None:
    pool, conn, t, head = _conn()
    conn.data_received(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
    await head
    conn.data_received(b"lo")
    assert conn.complete and await conn.read() == b"hello"
    conn.release()
    assert pool.idle_connections == 1

    pool, conn, t, head = _conn()
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    await head
    assert await conn.read() == b"ok"
    conn.release()
    assert pool.idle_connections == 0 and t.aborted  # bytes beyond the body: never reuse

    pool, conn, t, head = _conn()
    conn.data_received(b"HTTP/1.0 200 OK\r\n\r\nuntil ")
    await head
    conn.data_received(b"close")
    assert not conn.complete
    conn.connection_lost(None)
    assert await conn.read() == b"until close"
    conn.release()
    assert pool.idle_connections == 0

    pool, conn, t, head = _conn()
    conn.data_received(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    await head
    assert conn.status == 503 and await conn.read() == b""
    conn.release()
    assert pool.idle_connections == 0  # the server asked to close


@pytest.mark.parametrize("wire", [b"HTTX/1.1 200 OK\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n"])
async def test_malformed_heads_fail_the_request(wire: bytes) -> None:
    _, conn, t, head = _conn()
    conn.data_received(wire)
    with pytest.raises(UpstreamError):
        await head
    assert t.aborted


async def test_oversized_heads_and_bytes_after_a_chunked_body() -> None:
    _, conn, t, head = _conn()
    conn.data_received(b"HTTP/1.1 200 OK\r\n")
    for _ in range(40):  # llhttp would take any number of headers: the client caps the head
        conn.data_received(b"X-Filler: " + b"a" * 2000 + b"\r\n")
    with pytest.raises(UpstreamError, match="head too large"):
        await head
    assert t.aborted

    pool, conn, t, head = _conn()
    conn.data_received(HEAD_CHUNKED + _chunked([b"data: [DONE]\n\n"]) + b"HTTP/1.1 200 OK\r\n")
    await head
    assert await conn.read() == b"data: [DONE]\n\n"  # the response stands ...
    conn.release()
    assert pool.idle_connections == 0 and t.aborted  # ... the connection, out of step, does not

    pool, conn, t, head = _conn()
    conn.data_received(b"HTTP/1.1 204 No Content\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
    await head
    assert conn.status == 204 and conn.headers["x-a"] == "1, 2" and await conn.read() == b""
    conn.release()
    assert pool.idle_connections == 1


async def test_failures_mid_body_and_before_the_head() -> None:
    _, conn, _, head = _conn()
    conn.data_received(HEAD_CHUNKED + b"5\r\nhel")
    await head
    sink = Sink()
    conn.attach(sink)
    conn.connection_lost(ConnectionResetError("reset"))
    assert sink.data == b"hel" and isinstance(sink.ended[0], UpstreamError)

    _, conn, t, head = _conn()
    conn.data_received(HEAD_CHUNKED + b"zz\r\n")
    await head
    with pytest.raises(UpstreamError, match="chunk size"):
        await conn.read()
    assert t.aborted

    _, conn, _, head = _conn()
    conn.connection_lost(ConnectionRefusedError("refused"))
    with pytest.raises(UpstreamError, match="before the response"):
        await head

    _, conn, _, head = _conn()
    conn.timed_out()
    with pytest.raises(UpstreamError, match="read timeout"):
        await head


async def test_release_before_the_end_drains_then_pools() -> None:
    pool, conn, t, head = _conn()
    conn.data_received(HEAD_CHUNKED + _chunked([b"data: [DONE]\n\n"])[:-5])  # all but "0\r\n\r\n"
    await head
    sink = Sink()
    lease = UpstreamResponse(conn)
    lease.attach(sink)
    lease.release_when_done()  # the relay is done at [DONE]; the terminator is still to come
    lease.release()  # settled already: does nothing
    assert pool.idle_connections == 0 and not t.aborted
    conn.data_received(b"0\r\n\r\n")
    assert pool.idle_connections == 1 and sink.ended == []  # the sink was detached
    conn.send(b"POST / HTTP/1.1\r\n\r\n")  # the connection serves the next request ...
    lease.close()  # ... which a stale lease cannot touch
    assert not t.aborted

    pool, conn, t, head = _conn()
    conn.data_received(HEAD_CHUNKED + b"5\r\nhello\r\n")
    await head
    conn.release()  # released mid-body without [DONE] (client gone, cancelled): abort the request
    assert t.aborted and pool.idle_connections == 0


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}


async def test_relay_passes_events_through_and_keeps_done_for_the_handler() -> None:
    _, conn, _, _ = _conn()
    relay = StreamRelay(UpstreamResponse(conn), strip_usage=True, now=lambda: 1.0)
    first = _event({"choices": [{"delta": {"content": "a"}}]})
    relay.feed(first[:7])
    assert relay.pending == [] and relay.first_read_s == 1.0
    relay.feed(first[7:])
    assert relay.pending == [first]  # no client yet: kept, the handler is woken
    await asyncio.wait_for(relay.wait(), 1)
    client = FakeTransport()
    relay.attach_client(client, chunked=True)
    assert client.written == [b"%x\r\n%b\r\n" % (len(first), first)]
    second = _event({"choices": [{"delta": {"content": "b"}}]})
    relay.feed(second + _event({"choices": [], "usage": USAGE}) + b"data: [DONE]\n\n")
    assert client.written[-1] == b"%x\r\n%b\r\n" % (len(second), second)  # the usage-only chunk was dropped
    assert relay.saw_done and relay.final == b"data: [DONE]\n\n"
    assert relay.usage == Usage(10, 2, 8)
    relay.feed(b"data: late\n\n")
    assert len(client.written) == 2  # nothing after [DONE]


async def test_relay_backpressure_and_client_gone() -> None:
    _, conn, upstream, _ = _conn()
    conn.state = 2  # BODY
    relay = StreamRelay(UpstreamResponse(conn), strip_usage=False, now=lambda: 0.0)
    client = FakeTransport(buffered=1 << 20)
    relay.attach_client(client, chunked=False)
    relay.feed(b"data: x\n\n")
    assert client.written == [b"data: x\n\n"] and relay.paused and upstream.paused
    await asyncio.wait_for(relay.wait(), 1)
    relay.resume()
    assert not relay.paused and not upstream.paused
    client.closing = True
    relay.feed(b"data: y\n\n")
    assert relay.client_gone and upstream.aborted and len(client.written) == 1


def test_take_usage_only_touches_usage_events() -> None:
    content = _event({"choices": [{"delta": {"content": 'say "usage": {'}}]})
    both = _event({"choices": [{"delta": {"content": "x"}}], "usage": USAGE})
    block = content + both + _event({"choices": [], "usage": USAGE}) + b"data: [DONE]\n\n"
    kept, usage = take_usage(block, strip=True)
    assert usage == Usage(10, 2, 8)
    assert kept == content + _event({"choices": [{"delta": {"content": "x"}}]}) + b"data: [DONE]\n\n"
    assert take_usage(block, strip=False) == (block, Usage(10, 2, 8))
    odd = b'data: ["usage", {"usage": {}}]\n\n'
    assert take_usage(odd, strip=True) == (odd, None)  # not a chunk object: left alone
