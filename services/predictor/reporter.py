"""``ToolReporter``: the client agent harnesses use to tell the predictor what their tools do.

    reporter = ToolReporter("predictor:50051")                  # sync; AsyncToolReporter for asyncio
    with reporter.tool(session_id, "bash", "pytest -x tests/", deadline_s=120) as call:
        ...
        call.progress(fraction=0.4, eta_s=12.0)
    reporter.close()

Guarantees: no method blocks the agent (events go into an in-memory buffer; a background
task streams them) or raises into it (failures are counted in ``stats``). While the
predictor is unreachable the buffer keeps events (bounded: past ``max_buffer_events`` the
oldest progress events are dropped first); on reconnect — exponential backoff with jitter —
every event not yet acknowledged is resent, and the predictor's idempotency on (session,
call, sequence) makes resends harmless. An event leaves the buffer only when the predictor
acknowledged it as durable, duplicate or rejected.

While a call runs, a bare progress event (heartbeat) is sent after ``heartbeat_s`` of silence
so its prediction stays fresh (the predictor ignores predictions older than 30 s); progress
reports are coalesced to at most one per ``progress_min_interval_s`` (latest wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from services.common.aio import wait_event
from services.common.channels import make_channel
from tao.predictor.v1 import predictor_pb2 as pb
from tao.predictor.v1 import predictor_pb2_grpc as pb_grpc

log = logging.getLogger("tao.predictor.reporter")
Key = tuple[str, str, int]
_TYPES = {"started": pb.TOOL_EVENT_TYPE_STARTED, "progress": pb.TOOL_EVENT_TYPE_PROGRESS,
          "finished": pb.TOOL_EVENT_TYPE_FINISHED}  # fmt: skip


@dataclass
class ReporterStats:
    queued: int = 0
    durable: int = 0
    duplicates: int = 0
    rejected: int = 0
    dropped: int = 0
    reconnects: int = 0
    errors: int = 0
    connected: bool = False
    last_error: str = ""
    rejections: list[str] = field(default_factory=list)  # the last few reasons


@dataclass
class _OpenCall:
    session_id: str
    tool: str
    next_seq: int = 1
    last_sent_s: float = 0.0
    pending_progress: tuple[float, float | None, float | None] | None = None  # (t, eta_s, fraction)


class AsyncToolReporter:
    """Asyncio reporter; create and use it on one event loop, ``await start()`` first."""

    def __init__(
        self,
        target: str,
        *,
        runner_id: str = "",
        token: str | None = None,
        ca_file: Path | None = None,
        clock: Callable[[], float] = time.time,
        max_buffer_events: int = 100_000,
        batch_events: int = 500,
        max_inflight_batches: int = 8,
        heartbeat_s: float = 10.0,
        progress_min_interval_s: float = 1.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
    ) -> None:
        self.target = target
        self.runner_id = runner_id
        self._token, self._ca_file = token, ca_file
        self.clock = clock
        self.max_buffer_events = max_buffer_events
        self.batch_events = min(batch_events, 1000)
        self.max_inflight_batches = max_inflight_batches
        self.heartbeat_s = heartbeat_s
        self.progress_min_interval_s = progress_min_interval_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.stats = ReporterStats()
        self._buffer: OrderedDict[Key, pb.ToolEvent] = OrderedDict()
        self._unsent: deque[Key] = deque()
        self._open: dict[tuple[str, str], _OpenCall] = {}
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._channel: grpc.aio.Channel | None = None

    # ------------------------------------------------------------------ public API
    async def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._run(), name="tool-reporter"),
                           asyncio.create_task(self._housekeeping(), name="tool-reporter-heartbeats")]  # fmt: skip

    def tool(self, session_id: str, name: str, command: str = "", *, deadline_s: float | None = None,
             call_id: str | None = None) -> ToolCall:  # fmt: skip
        """A call to report; use as ``with``/``async with`` or call ``start``/``finish``."""
        return ToolCall(self.submit, self.clock, session_id, name, command, deadline_s, call_id)

    def start_call(self, session_id: str, name: str, command: str = "", *, deadline_s: float | None = None,
                   call_id: str | None = None) -> ToolCall:  # fmt: skip
        """``tool(...).start()``: report the start now, ``finish()`` the returned call later."""
        return self.tool(session_id, name, command, deadline_s=deadline_s, call_id=call_id).start()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        await self.close(timeout_s)

    def submit(self, kind: str, session_id: str, call_id: str, t: float, **fields: Any) -> None:
        """Record one event (on this reporter's loop; starts the background task if needed). Never raises."""
        try:
            if not self._tasks and not self._closing:
                self._tasks = [asyncio.get_running_loop().create_task(self._run(), name="tool-reporter"),
                               asyncio.get_running_loop().create_task(self._housekeeping(), name="tool-reporter-hb")]  # fmt: skip
            self._submit(kind, session_id, call_id, t, **fields)
        except Exception as exc:  # never fail the agent
            self.stats.errors += 1
            self.stats.last_error = repr(exc)

    def forget(self, session_id: str, call_id: str) -> None:
        """Stop heartbeating a call whose end will never be known (its session ended), without
        reporting it finished: the predictor drops it once silent (``call_ttl_s``)."""
        self._open.pop((session_id, call_id), None)

    @property
    def pending(self) -> int:
        """Events not yet acknowledged by the predictor."""
        return len(self._buffer)

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every buffered event was acknowledged (True) or ``timeout_s`` passed."""
        self._send_due_progress(force=True)
        return await wait_event(self._drained, timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Flush (best effort within ``timeout_s``), then stop and close the channel."""
        if self._tasks:
            await self.flush(timeout_s)
        self._closing = True
        self._wake.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
            self._channel = None

    # ------------------------------------------------------------------ buffering
    def _submit(self, kind: str, sid: str, cid: str, t: float, **fields: Any) -> None:
        key = (sid, cid)
        if kind == "started":
            self._open[key] = _OpenCall(sid, str(fields.get("tool", "")), last_sent_s=t)
            self._enqueue(sid, cid, 0, "started", t, **fields)
            return
        call = self._open.get(key)
        if call is None:  # progress/finish of an unknown call (started elsewhere or twice finished)
            if kind == "finished":
                self._enqueue(sid, cid, 1, kind, t, **fields)
            return
        if kind == "progress":
            if t - call.last_sent_s < self.progress_min_interval_s and call.next_seq > 1:
                call.pending_progress = (t, fields.get("eta_s"), fields.get("fraction"))
                return
            self._enqueue(sid, cid, call.next_seq, kind, t, tool=call.tool, **fields)
            call.next_seq += 1
            call.last_sent_s = t
            call.pending_progress = None
            return
        del self._open[key]  # finished
        self._enqueue(sid, cid, call.next_seq, kind, t, tool=call.tool)

    def _enqueue(self, sid: str, cid: str, seq: int, kind: str, t: float, **fields: Any) -> None:
        e = pb.ToolEvent(session_id=sid, call_id=cid, sequence=seq, type=_TYPES[kind], t_unix_s=t,
                         tool=str(fields.get("tool") or ""), command=str(fields.get("command") or ""))  # fmt: skip
        for name in ("deadline_s", "eta_s", "fraction"):
            v = fields.get(name)
            if v is not None:
                setattr(e, name, float(v))
        if len(self._buffer) >= self.max_buffer_events:
            self._drop_one()
        key = (sid, cid, seq)
        self._buffer[key] = e
        self._unsent.append(key)
        self.stats.queued += 1
        self._drained.clear()
        self._wake.set()

    def _drop_one(self) -> None:
        victim = next(
            (k for i, (k, e) in enumerate(self._buffer.items()) if i < 1000 and e.type == pb.TOOL_EVENT_TYPE_PROGRESS),
            next(iter(self._buffer)),
        )
        del self._buffer[victim]
        self.stats.dropped += 1

    def _send_due_progress(self, force: bool = False) -> None:
        now = self.clock()
        for (sid, cid), call in list(self._open.items()):
            if call.pending_progress is not None and (force or now - call.last_sent_s >= self.progress_min_interval_s):
                t, eta, frac = call.pending_progress
                call.pending_progress = None
                self._enqueue(sid, cid, call.next_seq, "progress", t, tool=call.tool, eta_s=eta, fraction=frac)
                call.next_seq += 1
                call.last_sent_s = t
            elif now - call.last_sent_s >= self.heartbeat_s:
                self._enqueue(sid, cid, call.next_seq, "progress", now, tool=call.tool)
                call.next_seq += 1
                call.last_sent_s = now

    async def _housekeeping(self) -> None:
        while not self._closing:
            await asyncio.sleep(min(0.2, self.progress_min_interval_s / 2))
            try:
                self._send_due_progress()
            except Exception as exc:
                self.stats.errors += 1
                self.stats.last_error = repr(exc)

    # ------------------------------------------------------------------ streaming
    def _on_acks(self, acks: Any) -> None:
        for a in acks:
            if self._buffer.pop((a.session_id, a.call_id, a.sequence), None) is None:
                continue
            if a.status == pb.ACK_STATUS_DURABLE:
                self.stats.durable += 1
            elif a.status == pb.ACK_STATUS_DUPLICATE:
                self.stats.duplicates += 1
            else:
                self.stats.rejected += 1
                self.stats.rejections = [*self.stats.rejections[-9:], a.reason]
                log.warning("predictor rejected event %s/%s#%d: %s", a.session_id, a.call_id, a.sequence, a.reason)
        if not self._buffer:
            self._drained.set()

    async def _stream_once(self) -> None:
        if self._channel is None:
            self._channel = make_channel(self.target, token=self._token, ca_file=self._ca_file)
        stub = pb_grpc.PredictorServiceStub(self._channel)
        call = stub.StreamToolEvents()
        self._unsent = deque(self._buffer)  # everything unacknowledged goes again, in order
        inflight: deque[int] = deque()
        window = asyncio.Event()
        window.set()

        async def read() -> None:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise ConnectionError("predictor closed the stream")
                self.stats.connected = True
                if inflight:
                    inflight.popleft()
                self._on_acks(resp.acks)
                window.set()

        reader = asyncio.create_task(read())
        try:
            while not self._closing:
                if reader.done():
                    reader.result()
                while self._unsent and self._unsent[0] not in self._buffer:
                    self._unsent.popleft()
                if not self._unsent or len(inflight) >= self.max_inflight_batches:
                    self._wake.clear()
                    window.clear()
                    waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(window.wait()), reader]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:  # also when this task is cancelled (close): no orphaned waiters
                        for w in waits[:2]:
                            w.cancel()
                    continue
                batch: list[pb.ToolEvent] = []
                while self._unsent and len(batch) < self.batch_events:
                    key = self._unsent.popleft()
                    e = self._buffer.get(key)
                    if e is not None:
                        batch.append(e)
                inflight.append(len(batch))
                await call.write(pb.StreamToolEventsRequest(runner_id=self.runner_id, events=batch))
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            call.cancel()

    async def _run(self) -> None:
        backoff = self.backoff_initial_s
        while not self._closing:
            if not self._buffer:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._stream_once()
                backoff = self.backoff_initial_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # grpc errors, resets: reconnect with backoff
                was_connected = self.stats.connected
                self.stats.connected = False
                self.stats.reconnects += 1
                if isinstance(exc, grpc.aio.AioRpcError):
                    self.stats.last_error = f"{exc.code().name}: {exc.details()}"[:200]
                else:
                    self.stats.last_error = (str(exc) or type(exc).__name__)[:200]
                if was_connected:
                    backoff = self.backoff_initial_s
                # a fresh channel: grpc's own reconnect backoff grows to minutes
                if self._channel is not None:
                    with contextlib.suppress(Exception):
                        await self._channel.close()
                    self._channel = None
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(self.backoff_max_s, backoff * 2)


class ToolCall:
    """One tool call. Sync (``with``) and async (``async with``) context manager; methods
    never raise and never block. Leaving the block reports ``finished`` even if the block
    raised (the tool returned, with an error); the agent's exception propagates unchanged."""

    def __init__(self, submit: Callable[..., None], clock: Callable[[], float], session_id: str, name: str,
                 command: str, deadline_s: float | None, call_id: str | None) -> None:  # fmt: skip
        self._submit, self._clock = submit, clock
        self.session_id, self.name, self.command, self.deadline_s = session_id, name, command, deadline_s
        self.call_id = call_id or uuid.uuid4().hex[:16]
        self._state = "new"

    def start(self) -> ToolCall:
        if self._state == "new":
            self._state = "running"
            self._emit("started", tool=self.name, command=self.command, deadline_s=self.deadline_s)
        return self

    def progress(self, *, fraction: float | None = None, eta_s: float | None = None) -> None:
        if self._state == "running":
            self._emit("progress", fraction=fraction, eta_s=eta_s)

    def finish(self) -> None:
        if self._state == "running":
            self._state = "finished"
            self._emit("finished")

    def _emit(self, kind: str, **fields: Any) -> None:
        try:
            self._submit(kind, self.session_id, self.call_id, self._clock(), **fields)
        except Exception as exc:  # the loop is gone (reporter closed): drop silently
            log.debug("tool event dropped: %r", exc)

    def __enter__(self) -> ToolCall:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.finish()

    async def __aenter__(self) -> ToolCall:
        return self.start()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        self.finish()


class ToolReporter:
    """Thread-based wrapper of ``AsyncToolReporter`` for synchronous harnesses.

    A daemon thread runs the asyncio reporter; ``tool()``/``ToolCall`` methods hand events
    to it with ``call_soon_threadsafe`` (never blocking). ``flush``/``close`` block for at
    most their timeout.
    """

    def __init__(self, target: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._async = AsyncToolReporter(target, **kwargs)
        self._thread = threading.Thread(target=self._loop.run_forever, name="tool-reporter", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._async.start(), self._loop).result(timeout=10)

    @property
    def stats(self) -> ReporterStats:
        return replace(self._async.stats, rejections=list(self._async.stats.rejections))

    @property
    def pending(self) -> int:
        return self._async.pending

    def tool(self, session_id: str, name: str, command: str = "", *, deadline_s: float | None = None,
             call_id: str | None = None) -> ToolCall:  # fmt: skip
        return ToolCall(self._submit, self._async.clock, session_id, name, command, deadline_s, call_id)

    def _submit(self, kind: str, session_id: str, call_id: str, t: float, **fields: Any) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(lambda: self._async.submit(kind, session_id, call_id, t, **fields))

    def flush(self, timeout_s: float = 5.0) -> bool:
        if self._loop.is_closed():
            return False
        fut = asyncio.run_coroutine_threadsafe(self._async.flush(timeout_s), self._loop)
        try:
            return fut.result(timeout=timeout_s + 1.0)
        except Exception:
            return False

    def close(self, timeout_s: float = 5.0) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._async.close(timeout_s), self._loop).result(timeout=timeout_s + 2.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> ToolReporter:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
