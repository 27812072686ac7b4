"""What a replica receives, recorded at the TCP level in front of it.

``ReplicaTap`` is a ``FaultProxy`` (so it also injects latency, blackholes and resets) whose
observer parses the HTTP/1.1 exchanges on each connection without changing a byte:
requests (method, path, headers, the JSON body's ``user`` field, which fault workloads set
to a unique marker per client attempt) and the framing of the answers (Content-Length or
chunked), so each completion request is recorded as a ``Reception`` that ends *completed*
(a 200 whose body arrived in full, and for a stream one that carried ``data: [DONE]``) or
not. HTTP/1.1 clients do not pipeline, so the n-th answer on a connection belongs to its
n-th request.

From the receptions: duplicates (one client attempt executed to completion more than once),
the credentials replicas were sent, and the peak number of completion requests in flight
at the replicas (what tenant caps bound).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.faults.proxy import FaultProxy

MAX_HEAD_BYTES = 64 * 1024
DONE = b"data: [DONE]"


@dataclass
class Reception:
    replica: str
    method: str
    path: str
    headers: dict[str, str]
    marker: str | None
    received_at_s: float
    status: int | None = None
    completed: bool = False
    ended: bool = False
    #: the client (router) had closed its connection before the answer was complete: the
    #: replica computed it for nobody (e.g. a request held by a partition, delivered after
    #: the router gave up and failed over)
    abandoned: bool = False

    @property
    def is_completion(self) -> bool:
        return self.method == "POST" and self.path.startswith("/v1/") and "completions" in self.path


@dataclass
class TapLog:
    """Receptions of every tap that shares it; also the live count of completion requests."""

    receptions: list[Reception] = field(default_factory=list)
    active: int = 0
    peak_active: int = 0

    def begin(self, r: Reception) -> None:
        self.receptions.append(r)
        if r.is_completion:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)

    def end(self, r: Reception, completed: bool) -> None:
        if r.ended:
            return
        r.ended = True
        r.completed = completed
        if r.is_completion:
            self.active -= 1

    def reset_peak(self) -> None:
        self.peak_active = self.active

    def completions(self) -> list[Reception]:
        return [r for r in self.receptions if r.is_completion]

    def duplicates(self, markers: set[str] | None = None) -> list[str]:
        """Markers (client attempts) executed to completion more than once for a client
        that was still reading (abandoned copies are ``replays``)."""
        done = Counter(r.marker for r in self.completions() if r.completed and not r.abandoned
                       and r.marker is not None)
        return sorted(m for m, n in done.items() if n > 1 and (markers is None or m in markers))

    def replays(self, markers: set[str] | None = None) -> list[str]:
        """Markers whose answer was also computed for a client that had gone (at-least-once
        execution after a failover on timeout)."""
        return sorted({r.marker for r in self.completions() if r.abandoned and r.completed and r.marker
                       and (markers is None or r.marker in markers)})

    def by_marker(self) -> dict[str, list[Reception]]:
        out: dict[str, list[Reception]] = {}
        for r in self.completions():
            if r.marker is not None:
                out.setdefault(r.marker, []).append(r)
        return out


class _Body:
    """Incremental HTTP/1.1 message body framing: Content-Length, chunked, or none."""

    def __init__(self, length: int | None, chunked: bool) -> None:
        self.remaining = length or 0
        self.chunked = chunked
        self.done = not chunked and not length
        self.chunk_left = 0
        self.state = "size"  # chunked: size | data | data_crlf | trailer
        self.line = b""

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Consume body bytes; returns (decoded payload, bytes left over after the body)."""
        if not self.chunked:
            take = min(self.remaining, len(data))
            self.remaining -= take
            self.done = self.remaining == 0
            return data[:take], data[take:]
        out = bytearray()
        i = 0
        while i < len(data) and not self.done:
            if self.state == "data":
                take = min(self.chunk_left, len(data) - i)
                out += data[i:i + take]
                i += take
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.state = "data_crlf"
                continue
            nl = data.find(b"\n", i)
            if nl < 0:
                self.line += data[i:]
                i = len(data)
                break
            line = (self.line + data[i:nl]).strip()
            self.line = b""
            i = nl + 1
            if self.state == "size":
                size = int(line.split(b";")[0] or b"0", 16)
                self.chunk_left = size
                self.state = "data" if size else "trailer"
            elif self.state == "data_crlf":
                self.state = "size"
            elif self.state == "trailer" and not line:
                self.done = True
        return bytes(out), data[i:]


def _head(buf: bytes) -> tuple[str, dict[str, str], bytes] | None:
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, buf[end + 4:]


def _framing(headers: dict[str, str]) -> _Body:
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = int(headers["content-length"]) if "content-length" in headers and not chunked else None
    return _Body(length, chunked)


def _marker(body: bytes) -> str | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    user = obj.get("user") if isinstance(obj, dict) else None
    return user if isinstance(user, str) else None


class _HttpObserver:
    """Parses one proxied connection (see module doc)."""

    def __init__(self, replica: str, log: TapLog) -> None:
        self.replica = replica
        self.log = log
        self.req_buf = b""
        self.req: tuple[str, str, dict[str, str]] | None = None
        self.req_body: _Body | None = None
        self.req_payload = bytearray()
        self.pending: list[Reception] = []
        self.resp_buf = b""
        self.resp_body: _Body | None = None
        self.resp_tail = b""
        self.saw_done = False
        self.stream = False
        self.client_gone = False

    def to_upstream(self, data: bytes) -> None:
        self.req_buf += data
        while self.req_buf:
            if self.req is None:
                parsed = _head(self.req_buf)
                if parsed is None:
                    if len(self.req_buf) > MAX_HEAD_BYTES:
                        self.req_buf = b""
                    return
                line, headers, self.req_buf = parsed
                method, _, rest = line.partition(" ")
                self.req = (method, rest.rsplit(" ", 1)[0], headers)
                self.req_body = _framing(headers)
                self.req_payload = bytearray()
            assert self.req_body is not None
            if not self.req_body.done:
                payload, self.req_buf = self.req_body.feed(self.req_buf)
                self.req_payload += payload
            if not self.req_body.done:
                return
            method, path, headers = self.req
            r = Reception(self.replica, method, path, headers, _marker(bytes(self.req_payload)) if
                          method == "POST" else None, time.monotonic(), abandoned=self.client_gone)
            self.log.begin(r)
            self.pending.append(r)
            self.req = None

    def to_client(self, data: bytes) -> None:
        self.resp_buf += data
        while self.resp_buf and self.pending:
            r = self.pending[0]
            if self.resp_body is None:
                parsed = _head(self.resp_buf)
                if parsed is None:
                    return
                line, headers, self.resp_buf = parsed
                parts = line.split(" ")
                r.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
                self.resp_body = _framing(headers)
                self.stream = "text/event-stream" in headers.get("content-type", "")
                self.saw_done = False
                self.resp_tail = b""
            payload, self.resp_buf = self.resp_body.feed(self.resp_buf)
            if payload:
                window = self.resp_tail + payload
                self.saw_done = self.saw_done or DONE in window
                self.resp_tail = window[-len(DONE):]
                if self.saw_done and r.status == 200:  # complete for the client from here on
                    self.log.end(r, True)
            if not self.resp_body.done:
                return
            self.log.end(r, r.status == 200 and (self.saw_done or not self.stream))
            self.pending.pop(0)
            self.resp_body = None

    def client_done(self) -> None:
        self.client_gone = True
        for r in self.pending:
            if not r.ended:
                r.abandoned = True

    def closed(self) -> None:
        for r in self.pending:
            self.log.end(r, False)
        self.pending.clear()


class ReplicaTap(FaultProxy):
    """A fault proxy in front of one replica that records its receptions in ``log``."""

    def __init__(self, replica: str, upstream_host: str, upstream_port: int, log: TapLog) -> None:
        super().__init__(upstream_host, upstream_port)
        self.replica = replica
        self.log = log
        self.observer = lambda: _HttpObserver(replica, log)
