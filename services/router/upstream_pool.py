"""Keep-alive pools of ``UpstreamConnection`` per replica origin, the callers' leases on
them (``UpstreamResponse``) and the read-timeout watchdog (see ``upstream.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from services.router.upstream import (
    BODY,
    HEAD,
    IDLE,
    BodySink,
    Origin,
    UpstreamConnection,
    UpstreamError,
)


class UpstreamResponse:
    """A caller's lease on a connection for one response. After ``release``,
    ``release_when_done`` or ``close`` it does nothing: the connection may serve another
    request by then."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: UpstreamConnection) -> None:
        self._conn: UpstreamConnection | None = conn
        self.status = conn.status
        self.headers = conn.headers

    def attach(self, sink: BodySink) -> None:
        assert self._conn is not None
        self._conn.attach(sink)

    async def read(self) -> bytes:
        assert self._conn is not None
        return await self._conn.read()

    def pause_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause_reading()

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.resume_reading()

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release()

    def release_when_done(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release_when_done()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class UpstreamPool:
    """Keep-alive connections to replicas (see module doc). ``start()`` runs the watchdog."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float, max_connections: int = 0,
                 keepalive_s: float = 60.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._busy: set[UpstreamConnection] = set()
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._watchdog: asyncio.Task[None] | None = None
        self.opened = 0  # connections made, for tests and the benchmark

    async def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch(), name="router-upstream-watchdog")

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        for conn in [c for conns in self._idle.values() for c in conns] + list(self._busy):
            conn.close()
        self._idle.clear()

    async def post(self, origin: Origin, head: bytes, body: bytes) -> UpstreamResponse:
        """Send a request; returns once the response head arrived (``status``, ``headers``)."""
        conn = await self._acquire(origin)
        try:
            await conn.send(head + body)
        except BaseException:
            conn.close()
            raise
        return UpstreamResponse(conn)

    async def _acquire(self, origin: Origin) -> UpstreamConnection:
        if self._slots is not None:
            await self._slots.acquire()
        try:
            idle = self._idle.get(origin)
            while idle:
                conn = idle.pop()
                if conn.transport is not None and not conn.transport.is_closing() and conn.state == IDLE:
                    break
                conn.close()
            else:
                conn = await self._connect(origin)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        conn.slot = self._slots is not None
        self._busy.add(conn)
        return conn

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        ctx: ssl.SSLContext | None = None
        if origin.scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: UpstreamConnection(self, origin), origin.host,
                                                       origin.port, ssl=ctx)
        except TimeoutError as exc:
            raise UpstreamError(f"connect timeout to {origin.authority}") from exc
        except OSError as exc:  # refused, unreachable, DNS, TLS
            raise UpstreamError(f"cannot connect to {origin.authority}: {exc}") from exc
        self.opened += 1
        return conn

    def give_back(self, conn: UpstreamConnection) -> None:
        """``conn`` finished a response and may serve the next one."""
        self._release_slot(conn)
        self._busy.discard(conn)
        conn.state = IDLE
        conn.idle_since_s = asyncio.get_running_loop().time()
        self._idle.setdefault(conn.origin, []).append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        """``conn`` is closed or closing: never hand it out again."""
        self._release_slot(conn)
        self._busy.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    def _release_slot(self, conn: UpstreamConnection) -> None:
        if conn.slot and self._slots is not None:
            conn.slot = False
            self._slots.release()

    @property
    def idle_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def _watch(self) -> None:
        tick_s = max(0.01, min(1.0, self.read_timeout_s / 4))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick_s)
            now = loop.time()
            for conn in list(self._busy):
                if conn.state not in (HEAD, BODY) or conn.paused:
                    continue
                if conn.reads != conn.seen_reads:
                    conn.seen_reads, conn.quiet_since_s = conn.reads, now
                elif now - conn.quiet_since_s >= self.read_timeout_s:
                    conn.timed_out()
            for conns in self._idle.values():
                for conn in [c for c in conns if now - c.idle_since_s > self.keepalive_s]:
                    conn.close()
