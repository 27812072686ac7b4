"""An in-repo TCP fault proxy for fault tests: sits between a client (a service) and a
server (Redis, a replica, another service) and injects latency, blackholes or resets.

Modes (switchable at run time, affecting new and existing connections):
- ``pass``: forward bytes both ways;
- ``latency``: forward, delaying every chunk by ``latency_s``;
- ``blackhole``: accept and read, forward nothing (peers see a hung connection);
- ``reset``: abort every connection with a TCP RST (SO_LINGER 0) and reset new ones at once.

An optional ``observer`` factory sees the bytes of each connection as they are forwarded
(``bench.faults.tap`` uses it to record what a replica receives); it never changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

MODES = ("pass", "latency", "blackhole", "reset")


class ConnectionObserver(Protocol):
    """Sees one proxied connection: bytes each way as forwarded, then its end."""

    def to_upstream(self, data: bytes) -> None: ...

    def to_client(self, data: bytes) -> None: ...

    def client_done(self) -> None:
        """The client's side ended (EOF or error): it will not read an answer any more."""
        ...

    def closed(self) -> None: ...


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    mode: str = "pass"
    latency_s: float = 0.0
    connections: int = 0
    observer: Callable[[], ConnectionObserver] | None = None
    _server: asyncio.Server | None = None
    _pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _unblocked: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.listen_port)
        self.set_mode(self.mode)
        return self

    def set_mode(self, mode: str, latency_s: float | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown fault mode {mode!r}; known: {', '.join(MODES)}")
        self.mode = mode
        if mode == "blackhole":
            self._unblocked.clear()
        else:
            self._unblocked.set()
        if latency_s is not None:
            self.latency_s = latency_s
        if mode == "reset":
            for client, upstream in list(self._pairs):
                _rst(client)
                _rst(upstream)
            self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode == "reset":
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            _rst(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        seen = self.observer() if self.observer is not None else None
        t1 = asyncio.create_task(self._pump(reader, up_writer, seen.to_upstream if seen else None,
                                            seen.client_done if seen else None))
        t2 = asyncio.create_task(self._pump(up_reader, writer, seen.to_client if seen else None))
        self._tasks.update((t1, t2))
        try:
            await asyncio.gather(t1, t2, return_exceptions=True)
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.difference_update((t1, t2))
            self._pairs.discard(pair)
            for w in pair:
                with contextlib.suppress(Exception):
                    w.close()
            if seen is not None:
                seen.closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    observe: Callable[[bytes], None] | None = None,
                    ended: Callable[[], None] | None = None) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if self.mode == "blackhole":
                    await self._unblocked.wait()
                if self.mode == "latency" and self.latency_s > 0:
                    await asyncio.sleep(self.latency_s)
                if self.mode == "reset":
                    break
                if observe is not None:
                    observe(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if ended is not None:
                ended()
            with contextlib.suppress(Exception):
                writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        for client, upstream in list(self._pairs):
            client.transport.abort()
            upstream.transport.abort()
