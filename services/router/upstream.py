"""A lean HTTP/1.1 client for the router's calls to its replicas.

Why not aiohttp's client here: relaying a stream through it costs, per chunk, a
``StreamReader`` wake-up, a task step and a re-armed read-timeout timer; bench/router measured
about 55 us of router CPU per relayed chunk for a bare aiohttp relay and ~2x the added
latency of this client, whose protocol callback decodes the body and hands each piece
synchronously to a sink (``proxy.StreamRelay`` writes it straight to the client).
aiohttp still serves the gateway and does the replica probes.

Scope: what talking to vLLM needs and no more. One request at a time per connection (no
pipelining); keep-alive pools per origin (``scheme://host:port``); bodies framed by
``Content-Length``, ``Transfer-Encoding: chunked`` (extensions and trailers skipped) or the
connection's close; http and https (certificates verified); 1xx responses skipped (the
router never asks to switch protocols).
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

if TYPE_CHECKING:
    from services.router.upstream_pool import UpstreamPool

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 4 * 1024
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


def _parse_head(raw: bytes) -> tuple[int, int, dict[str, str]]:
    """(minor HTTP version, status, lower-cased headers; repeated ones joined with ", ")."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
        raise UpstreamError(f"malformed status line {lines[0][:80]!r}")
    status = int(parts[1])
    if not 100 <= status <= 599:
        raise UpstreamError(f"bad status {status}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise UpstreamError(f"malformed header line {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return (1 if parts[0] == b"HTTP/1.1" else 0), status, headers


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
        self._buf = b""
        self._framing = UNTIL_CLOSE
        self._left = 0  # LENGTH: body bytes to come; CHUNKED: bytes left of the current chunk's data
        self._crlf = 0  # CHUNKED: bytes of the CRLF after a chunk's data still to skip
        self._trailers = False
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
            self._body(data)
        elif state == HEAD:
            self._on_head(data)
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
        self.status, self.headers, self._buf, self._pieces = 0, {}, b"", []
        self._sink, self._end, self._ended, self._trailers, self._finished = None, None, None, False, False
        self._discard = False
        self.seen_reads, self.paused = -1, False
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._head

    def _on_head(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._fail_head(UpstreamError("response head too large"))
                    return
                self._buf = buf
                return
            try:
                minor, status, headers = _parse_head(buf[:end])
            except UpstreamError as exc:
                self._fail_head(exc)
                return
            buf = buf[end + 4:]
            if status >= 200:
                break
            # interim (100 Continue, 103 Early Hints): the response follows
        self._buf = b""
        self.status, self.headers = status, headers
        conn = headers.get("connection", "").lower()
        self._reusable = minor == 1 and "close" not in conn
        te = headers.get("transfer-encoding")
        if status in (204, 304):
            self._framing, self._left = LENGTH, 0
        elif te is not None:
            chunked = te.lower().rsplit(",", 1)[-1].strip() == "chunked"
            self._framing = CHUNKED if chunked else UNTIL_CLOSE
            self._left = self._crlf = 0
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                self._fail_head(UpstreamError(f"bad Content-Length {length!r}"))
                return
            self._left = int(length)
            self._framing = LENGTH
        else:
            self._framing = UNTIL_CLOSE
        if self._framing == UNTIL_CLOSE:
            self._reusable = False
        self.state = BODY
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(None)
        if self._framing == LENGTH and self._left == 0:
            self._complete(None)
            if buf:
                self._reusable = False
        elif buf:
            self._body(buf)

    def _fail_head(self, exc: UpstreamError) -> None:
        self._reusable = False
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(exc)
        self._abort()

    # ------------------------------------------------------------------ bodies

    def _body(self, data: bytes) -> None:
        if self._framing == CHUNKED:
            self._chunked(data)
        elif self._framing == LENGTH:
            left = self._left
            if len(data) >= left:
                if len(data) > left:
                    self._reusable = False
                    data = data[:left]
                self._left = 0
                if data:
                    self._deliver(data)
                self._complete(None)
            else:
                self._left = left - len(data)
                self._deliver(data)
        else:
            self._deliver(data)

    def _chunked(self, data: bytes) -> None:
        if self._buf:
            data, self._buf = self._buf + data, b""
        elif not self._left and not self._crlf and not self._trailers:
            # the common read: exactly one whole chunk ("<hex>\r\n<data>\r\n")
            eol = data.find(b"\r\n", 0, 18)
            if eol > 0 and data.endswith(b"\r\n"):
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = -1
                if size > 0 and eol + size + 4 == len(data):
                    self._deliver(data[eol + 2:-2])
                    return
        pos, n = 0, len(data)
        out: list[bytes] = []
        while pos < n:
            if self._left:
                end = min(n, pos + self._left)
                out.append(data[pos:end])
                self._left -= end - pos
                pos = end
                if not self._left:
                    self._crlf = 2
                continue
            if self._crlf:
                skip = min(self._crlf, n - pos)
                pos += skip
                self._crlf -= skip
                continue
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > MAX_CHUNK_LINE_BYTES:
                    self._body_error(UpstreamError("chunk size line too long"), out)
                    return
                self._buf = data[pos:]
                break
            line, pos = data[pos:eol], eol + 2
            if self._trailers:
                if not line:  # the blank line after the trailers: the body is complete
                    if pos < n:
                        self._reusable = False
                    self._flush(out)
                    self._complete(None)
                    return
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                size = -1
            if size < 0:
                self._body_error(UpstreamError(f"bad chunk size {line[:40]!r}"), out)
                return
            if size:
                self._left = size
            else:
                self._trailers = True
        self._flush(out)

    def _flush(self, out: list[bytes]) -> None:
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out))

    def _body_error(self, exc: UpstreamError, out: list[bytes]) -> None:
        self._flush(out)
        self._complete(exc)
        self._abort()

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
