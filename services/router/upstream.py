"""A lean HTTP/1.1 client for the router's calls to its replicas.

Why not aiohttp's client here: relaying a stream through it costs, per chunk, a
``StreamReader`` wake-up, a task step and a re-armed read-timeout timer; bench/router measured
about 55 us of router CPU per relayed chunk for a bare aiohttp relay and ~2x the added
latency of this client, whose protocol callback decodes the body and hands each piece
synchronously to a sink (``proxy.StreamRelay`` writes it straight to the client).
aiohttp still serves the gateway and does the replica probes.

Scope: what talking to vLLM needs and no more. One request at a time per connection (no
pipelining); keep-alive pools per origin (``scheme://host:port``); http and https
(certificates verified). Responses are parsed by llhttp (Node.js's HTTP/1.1 parser, through
``httptools.HttpResponseParser`` and its callbacks): bodies framed by ``Content-Length``,
``Transfer-Encoding: chunked`` (extensions and trailers skipped) or the connection's close;
1xx responses skipped (the router never asks to switch protocols). The pieces of body one
read brings are joined and handed to the sink once per read.
A pooled connection is reused only after its response was read completely and neither side
asked to close; it is dropped when the server closes it or after ``keepalive_s`` idle.

The pool, leases and the watchdog are in ``upstream_pool.py``. Failures raise
``UpstreamError`` (refused, reset, timed out, malformed response) or reach a sink as
``end(UpstreamError)``. Timeouts: ``connect_timeout_s`` per new connection;
``read_timeout_s`` is the longest silence while a response is awaited or read, enforced by
one watchdog task per pool that ticks at most every second (so a timeout fires within
``read_timeout_s`` + one tick) instead of a timer per read; a connection paused for
backpressure is not silent, it is waiting for the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast
from urllib.parse import urlsplit

from httptools import HttpParserCallbackError, HttpParserError, HttpResponseParser

if TYPE_CHECKING:
    from services.router.upstream_pool import UpstreamPool

MAX_HEAD_BYTES = 64 * 1024
IDLE, HEAD, BODY, DONE, CLOSED = range(5)
CHUNKED, LENGTH, UNTIL_CLOSE = range(3)


class UpstreamError(Exception):
    """A connection-level failure talking to a replica (never an HTTP status)."""


class BodySink(Protocol):
    """Receives a response body as it arrives, on the event loop, from the protocol callback."""

    def feed(self, data: bytes) -> None: ...

    def end(self, exc: UpstreamError | None) -> None:
        """Called once: ``None`` after the whole body, else the failure."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int
    #: path of the base URL, without a trailing slash ("" for none)
    prefix: str
    #: value of the Host header
    authority: str

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        authority = shown if port == default else f"{shown}:{port}"
        return cls(parts.scheme, host, port, parts.path.rstrip("/"), authority)


def request_head(origin: Origin, path: str, headers: Mapping[str, str], body_bytes: int) -> bytes:
    """The request line and headers of a POST (``headers`` must not hold CR or LF)."""
    lines = [f"POST {origin.prefix}{path} HTTP/1.1", f"Host: {origin.authority}", f"Content-Length: {body_bytes}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class UpstreamConnection(asyncio.Protocol):
    """One connection and the response being read on it (``status``, ``headers``).

    A body goes to the attached sink, or is kept for ``read()`` until one is attached.
    Callers hold an ``UpstreamResponse`` and settle it exactly once with ``release()``
    (back to the pool when reusable), ``release_when_done()`` or ``close()``."""

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self._pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.state = IDLE
        self.status = 0
        self.headers: dict[str, str] = {}
        self._reusable = False
        self._parser = HttpResponseParser(self)
        self._head_bytes = 0  # bytes read while the head was awaited
        self._framing = UNTIL_CLOSE
        self._interim = False  # the head parsed last was a 1xx
        self._message_done = False  # the parser saw the end of the response
        self._out: list[bytes] = []  # body pieces of the current read
        self._head: asyncio.Future[None] | None = None
        self._pieces: list[bytes] = []
        self._sink: BodySink | None = None
        self._end: UpstreamError | None = None
        self._ended: asyncio.Future[None] | None = None
        self._finished = False
        self._discard = False
        self.reads = 0  # data_received calls, for the watchdog
        self.seen_reads = -1
        self.quiet_since_s = 0.0
        self.paused = False
        self.idle_since_s = 0.0
        self.slot = False

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        state = self.state
        if state == BODY:
            self._feed(data)
        elif state == HEAD:
            self._head_bytes += len(data)
            self._feed(data)
            if self.state == HEAD and self._head_bytes > MAX_HEAD_BYTES:
                self._fail_head(UpstreamError("response head too large"))
        else:  # nothing was asked: the connection is out of step, never reuse it
            self._reusable = False
            self._abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        state, self.state = self.state, CLOSED
        self._pool.forget(self)
        why = f": {exc}" if exc else ""
        if state == HEAD:
            self._fail_head(UpstreamError(f"connection closed before the response{why}"))
        elif state == BODY:
            if self._framing == UNTIL_CLOSE:
                self._complete(None)
            else:
                self._complete(UpstreamError(f"connection closed mid-body{why}"))

    # ------------------------------------------------------------------ requests

    def send(self, data: bytes) -> asyncio.Future[None]:
        if self.transport is None or self.transport.is_closing() or self.state != IDLE:
            raise UpstreamError(f"connection to {self.origin.authority} closed before the request")
        self.state = HEAD
        self.status, self.headers, self._pieces = 0, {}, []
        self._sink, self._end, self._ended, self._finished = None, None, None, False
        self._parser, self._head_bytes, self._interim, self._message_done = HttpResponseParser(self), 0, False, False
        self._discard = False
        self.seen_reads, self.paused = -1, False
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._head

    # ------------------------------------------------------------------ parsing

    def _feed(self, data: bytes) -> None:
        """Run llhttp over one read; its callbacks below collect the head and the body pieces."""
        try:
            self._parser.feed_data(data)
        except HttpParserCallbackError as exc:  # a callback refused the head
            cause = exc.__context__
            self._parse_failed(cause if isinstance(cause, UpstreamError) else UpstreamError(str(exc)))
            return
        except HttpParserError as exc:
            self._parse_failed(UpstreamError(f"malformed response: {exc}"))
            return
        out = self._out
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        if self._message_done and self.state == BODY:
            self._complete(None)

    def _parse_failed(self, exc: UpstreamError) -> None:
        if self.state == HEAD:
            self._out.clear()
            self._fail_head(exc)
        elif self._message_done:  # bytes beyond the response: it stands, the connection does not
            self._reusable = False
            self._feed_done()
        else:
            out, self._out = self._out, []
            if out:
                self._deliver(b"".join(out))
            self._complete(exc)
            self._abort()

    def _feed_done(self) -> None:
        out = self._out
        if out:
            self._deliver(b"".join(out))
            out.clear()
        if self.state == BODY:
            self._complete(None)

    def on_message_begin(self) -> None:
        if self._message_done:  # a second response: the connection is out of step
            self._reusable = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state != HEAD or self._message_done:
            return  # trailers (or a response nobody asked for): skipped
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        if self._message_done:
            return
        parser = self._parser
        status = parser.get_status_code()
        if not 100 <= status <= 599:
            raise UpstreamError(f"bad status {status}")
        if status < 200:  # interim (100 Continue, 103 Early Hints): the response follows
            self._interim = True
            self.headers = {}
            return
        headers = self.headers
        self.status = status
        self._reusable = parser.should_keep_alive()
        te = headers.get("transfer-encoding")
        if status in (204, 304) or "content-length" in headers:
            self._framing = LENGTH
        elif te is not None and te.lower().rsplit(",", 1)[-1].strip() == "chunked":
            self._framing = CHUNKED
        else:
            self._framing = UNTIL_CLOSE
            self._reusable = False
        self.state = BODY
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not self._message_done:
            self._out.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        elif self.state == BODY:
            self._message_done = True

    def _fail_head(self, exc: UpstreamError) -> None:
        self._reusable = False
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(exc)
        self._abort()

    # ------------------------------------------------------------------ bodies

    def _deliver(self, data: bytes) -> None:
        sink = self._sink
        if sink is not None:
            sink.feed(data)
        elif not self._discard:
            self._pieces.append(data)

    def _complete(self, exc: UpstreamError | None) -> None:
        if self.state == BODY:
            self.state = DONE
        elif self.state != CLOSED:
            return
        if self._finished:
            return
        self._end = exc
        self._finished = True
        if self._discard:  # released before its end (see release)
            if exc is None and self._reusable:
                self._pool.give_back(self)
            else:
                self.close()
            return
        if self._sink is not None:
            self._sink.end(exc)
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(None)

    @property
    def complete(self) -> bool:
        """The body was read to its end or failed (``read()`` answers at once)."""
        return self._finished

    def attach(self, sink: BodySink) -> None:
        """From now on the body goes to ``sink`` (what arrived before is fed at once)."""
        if self._pieces:
            pieces, self._pieces = self._pieces, []
            sink.feed(b"".join(pieces))
        if self.complete:
            sink.end(self._end)
        else:
            self._sink = sink

    async def read(self) -> bytes:
        """The whole body (raises ``UpstreamError`` when it fails)."""
        if not self.complete:
            self._ended = asyncio.get_running_loop().create_future()
            await self._ended
        if self._end is not None:
            raise self._end
        return b"".join(self._pieces)

    def pause_reading(self) -> None:
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            self.seen_reads = -1  # the silence restarts now
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def release(self) -> None:
        """Settle the response: pool the connection when it was read to its end and is
        reusable, else close it (an unfinished response aborts the replica's request)."""
        if self.state == DONE and self._reusable and not self.paused:
            self._pool.give_back(self)
        else:
            self.close()

    def release_when_done(self) -> None:
        """The caller has all it wants (a stream at ``[DONE]``): read the rest of a body with
        a known end (chunked, Content-Length) and drop it, then pool the connection; close it
        when that cannot be done."""
        if self.state == BODY and self._reusable and not self.paused and self._framing != UNTIL_CLOSE:
            self._sink, self._pieces, self._discard = None, [], True
        else:
            self.release()

    def close(self) -> None:
        self._reusable = False
        self._abort()
        self._pool.forget(self)

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def timed_out(self) -> None:
        exc = UpstreamError("read timeout")
        if self.state == HEAD:
            self._fail_head(exc)
        elif self.state == BODY:
            self._complete(exc)
            self._abort()
