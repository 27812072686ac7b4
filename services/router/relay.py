"""Relaying a replica's SSE stream to the client, event by event, from the upstream
protocol's callback (``upstream.BodySink``), without a task wake-up per chunk.

``StreamRelay.feed`` runs inside the upstream connection's ``data_received``: it cuts the
decoded body at the last complete event (``\\n\\n``), reads usage from the events that carry
a ``"usage"`` object (only those are parsed; the usage-only chunk the router asked for on
the client's behalf is dropped), and writes the complete events straight to the client's
transport, framed as HTTP chunks when the client speaks HTTP/1.1. The ``[DONE]`` event is
handed to the handler instead, which sends it together with the end of the response (one
write): a client that stops reading at ``[DONE]`` then finds the response
complete and keeps its connection alive, and the router does not wait for the replica's
end of body to finish the client's response. A partial
event waits for its end, so an error event written after an upstream failure is never glued
to half an event.

Until the handler has prepared the client response (``attach_client``), complete events are
kept and the handler is woken: a failure before then can still go to another replica,
invisibly to the client. The handler is also woken when the client's write buffer passes
``HIGH_WATER_BYTES`` (the upstream connection is paused until the client drains), when the
client has gone (the upstream connection is closed, so the replica aborts the request) and
when the upstream body ends.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from services.router.core.model import Usage
from services.router.core.tools import StreamedCalls
from services.router.upstream import UpstreamError
from services.router.upstream_pool import UpstreamResponse

USAGE_RE = re.compile(rb'"usage"\s*:\s*\{')
DONE_EVENT = b"[DONE]\n\n"
HIGH_WATER_BYTES = 64 * 1024  # asyncio's default high-water mark: above it the client protocol is paused


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


def _usage_event(event: bytes, strip: bool) -> tuple[bytes | None, Usage | None]:
    """One SSE event that mentions ``"usage"``: (the event to send, or None to drop it; usage)."""
    if not USAGE_RE.search(event):
        return event, None
    payload = event[event.index(b"data:") + 5:] if b"data:" in event else b""
    try:
        obj = orjson.loads(payload)
    except ValueError:
        return event, None
    if not isinstance(obj, dict):
        return event, None
    found = parse_usage(obj)
    if not strip:
        return event, found
    if obj.get("choices"):
        obj.pop("usage", None)
        return b"data: " + orjson.dumps(obj), found
    return None, found


def events_with(block: bytes, key: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each SSE event of ``block`` (complete events, each ending with a blank
    line) whose bytes contain ``key``, in order, each once; ``end`` excludes the blank line."""
    pos = block.find(key)
    while pos >= 0:
        start = block.rfind(b"\n\n", 0, pos)
        start = 0 if start < 0 else start + 2
        end = block.find(b"\n\n", pos)
        end = len(block) if end < 0 else end
        yield start, end
        pos = block.find(key, end)


def take_usage(block: bytes, strip: bool) -> tuple[bytes, Usage | None]:
    """Read usage from the events of ``block`` (complete events, each ending with a blank
    line) that carry it; drop a usage-only chunk (or the usage field) when ``strip``. Only
    the events around an occurrence of ``"usage"`` are looked at: JSON escapes quotes inside
    strings, so the bytes ``"usage"`` only occur as a key."""
    found: Usage | None = None
    parts: list[bytes] = []
    copied = 0
    for start, end in events_with(block, b'"usage"'):
        original = block[start:end]
        event, usage = _usage_event(original, strip)
        found = usage or found
        if event is not original:  # changed or dropped: splice
            parts.append(block[copied:start])
            if event is not None:
                parts.append(event + b"\n\n")
            copied = min(len(block), end + 2)
    if not parts:
        return block, found
    parts.append(block[copied:])
    return b"".join(parts), found


class StreamRelay:
    """One streamed response's relay state (see module doc). Event-loop thread only."""

    __slots__ = ("_buf", "_now", "_signalled", "_strip", "_transport", "_upstream", "_waiter", "chunked",
                 "client_gone", "ended", "error", "final", "first_read_s", "paused", "pending", "saw_done", "tools",
                 "usage")

    def __init__(self, upstream: UpstreamResponse, strip_usage: bool, now: Callable[[], float]) -> None:
        self._upstream = upstream
        self._strip = strip_usage
        self._now = now
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._signalled = False
        self.chunked = True
        self.pending: list[bytes] = []
        self.usage: Usage | None = None
        #: the answer's tool calls, assembled from the events that mention "tool_calls"; None (the
        #: request offered no tools, so the answer calls none): the stream is not looked at
        self.tools: StreamedCalls | None = None
        self.saw_done = False
        self.final = b""
        self.ended = False
        self.error: UpstreamError | None = None
        self.client_gone = False
        self.paused = False
        self.first_read_s = 0.0

    # ------------------------------------------------------------------ BodySink (upstream callback)

    def feed(self, data: bytes) -> None:
        if self.saw_done:
            return  # nothing may follow [DONE]
        if not self.first_read_s and self._transport is None:
            self.first_read_s = self._now()
        buf = self._buf + data if self._buf else data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._buf = buf
            return
        cut += 2
        if cut == len(buf):
            block, self._buf = buf, b""
        else:
            block, self._buf = buf[:cut], buf[cut:]
        if b'"usage"' in block and USAGE_RE.search(block):
            block, found = take_usage(block, self._strip)
            if found is not None:
                self.usage = found
        if self.tools is not None and b'"tool_calls"' in block:
            self._tool_events(self.tools, block)
        if block.endswith(DONE_EVENT):  # the last event: the handler sends it with the end of the response
            self.saw_done = True
            last = block.rfind(b"\n\n", 0, len(block) - 2) + 2
            block, self.final = block[:last], block[last:]
            self._signal()
        if not block:
            return
        transport = self._transport
        if transport is None:
            self.pending.append(block)
            self._signal()
        else:
            self._write(transport, block)

    @staticmethod
    def _tool_events(tools: StreamedCalls, block: bytes) -> None:
        """Feed the events of ``block`` that mention ``"tool_calls"`` to ``tools`` (core/tools.py)."""
        for start, end in events_with(block, b'"tool_calls"'):
            data = block.find(b"data:", start, end)
            if data >= 0:
                try:
                    tools.feed(orjson.loads(block[data + 5:end]))
                except ValueError:
                    pass

    def end(self, exc: UpstreamError | None) -> None:
        self.ended = True
        self.error = exc
        self._signal()

    # ------------------------------------------------------------------ handler side

    @property
    def leftover(self) -> bytes:
        """Bytes after the last complete event (sent as they are when the body ends)."""
        return self._buf

    def attach_client(self, transport: asyncio.Transport, chunked: bool) -> None:
        """The client response is prepared: write what is pending, then relay directly."""
        self.chunked = chunked
        self._transport = transport
        if self.pending:
            pending, self.pending = self.pending, []
            self._write(transport, pending[0] if len(pending) == 1 else b"".join(pending))

    def send(self, block: bytes) -> None:
        """Write ``block`` to the attached client (no-op when it has gone)."""
        if self._transport is not None and block:
            self._write(self._transport, block)

    async def wait(self) -> None:
        """Until something needs the handler (pending events, pause, client gone, end)."""
        if not self._signalled:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._signalled = False

    def resume(self) -> None:
        self.paused = False
        self._upstream.resume_reading()

    def _signal(self) -> None:
        self._signalled = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _write(self, transport: asyncio.Transport, block: bytes) -> None:
        if transport.is_closing():
            if not self.client_gone:
                self.client_gone = True
                self._upstream.close()  # the replica sees the disconnect and aborts the request
                self._signal()
            return
        transport.write(b"%x\r\n%b\r\n" % (len(block), block) if self.chunked else block)
        if not self.paused and transport.get_write_buffer_size() > HIGH_WATER_BYTES:
            self.paused = True
            self._upstream.pause_reading()
            self._signal()
