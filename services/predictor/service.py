"""The predictor engine (core + durability + fan-out) and its thin gRPC servicer.

Ingestion path (``PredictorEngine.ingest``): each event is deduplicated on (session, call,
sequence), converted and validated (invalid -> REJECTED with the reason; the stream goes on),
applied to the core and appended to the pending event log. The caller then waits until
one Redis transaction containing it succeeded, and only then acks. Group commit: the
flusher takes everything that accumulated while the previous write was in flight,
computes readiness changes and the prediction records of every session touched since
(once per flush, however many batches touched it) and writes log + records + readiness
publications in one transaction. So an ack means "durable and published".
If Redis does not answer within ``flush_timeout_s`` the RPC fails with UNAVAILABLE and the
runner resends; nothing acked is ever lost.

Everything runs on one event loop; the core is touched only from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

import grpc
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Histogram
from redis.exceptions import RedisError

from services.common import tracing
from services.common.aio import reraise_if_cancelling, within
from services.common.clock import Clock
from services.common.epoch import RevisionCounter
from services.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from services.predictor.convert import (
    ack,
    event_from_log,
    event_from_proto,
    event_to_log,
    prediction_to_proto,
    record_json,
)
from services.predictor.core import (
    InvalidEventError,
    Predictor,
    ReadyReason,
    SessionPrediction,
)
from services.predictor.settings import Settings
from services.predictor.store import EpochLost, NotReplicated, PredictorStore, Snapshot, WriteBatch
from tao.predictor.v1 import predictor_pb2 as pb
from tao.predictor.v1 import predictor_pb2_grpc as pb_grpc


def _monotonic() -> float:
    """Operational periods (snapshots) run on the loop's monotonic clock, not event time."""
    return asyncio.get_running_loop().time()


class _Seen:
    """Sequences seen for one call: all below ``upto`` plus ``extra``."""

    __slots__ = ("extra", "upto")

    def __init__(self, upto: int = 0, extra: Iterable[int] = ()) -> None:
        self.upto = upto
        self.extra = set(extra)

    def __contains__(self, seq: int) -> bool:
        return seq < self.upto or seq in self.extra

    def add(self, seq: int) -> None:
        if seq == self.upto:
            self.upto += 1
            while self.upto in self.extra:
                self.extra.remove(self.upto)
                self.upto += 1
        elif seq > self.upto:
            self.extra.add(seq)

    def to_json(self) -> list[object]:
        return [self.upto, sorted(self.extra)]


@dataclass
class _Watcher:
    sessions: frozenset[str]
    queue: asyncio.Queue[SessionPrediction | None]
    overflow: bool = False


@dataclass
class _Pending:
    log: list[str] = field(default_factory=list)
    predictions: dict[str, str] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    publish: list[str] = field(default_factory=list)


ERROR_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)


class PredictorMetrics:
    """Prediction error: when a call finishes, |the latest prediction of its duration - the
    duration it took| (model s), by the evidence that prediction came from."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.error = Histogram("tao_predictor_error_seconds",
                               "Absolute error of a tool call's last duration prediction when it finished.",
                               ["evidence"], buckets=ERROR_BUCKETS, registry=registry)


class PredictorEngine:
    def __init__(self, settings: Settings, redis: aioredis.Redis, clock: Clock, epoch: str,
                 metrics: PredictorMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.core = Predictor(settings.predictor_config())
        self.store = PredictorStore(redis, epoch, settings.redis_wait_replicas, settings.redis_timeout_s / 2)
        self.revs = RevisionCounter(epoch)
        self._seen: dict[str, OrderedDict[str, _Seen]] = {}
        self._pending = _Pending()
        self._snap_pending = Snapshot()
        self._log_len = 0  # events in the Redis log since the last snapshot (approx.)
        self._last_snapshot_s = -math.inf
        self._force_snapshot = False
        self._written = False  # a write succeeded in this epoch (then the epoch key must be ours)
        self._resyncing = False
        self._applied_gen = 0
        self._durable_gen = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flush_needed = asyncio.Event()
        self._watchers: list[_Watcher] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.restored_events = 0

    # ------------------------------------------------------------------ lifecycle
    async def restore(self) -> None:
        """Load the last snapshot and replay the event log on top of it."""
        loaded = await self.store.load()
        history = {k: json.loads(v) for k, v in loaded.history.items()}
        self.core.history.load(history)
        for sid, raw in loaded.states.items():
            data = json.loads(raw)
            self.core.load_session(sid, data["core"])
            calls: OrderedDict[str, _Seen] = OrderedDict()
            for cid, (upto, extra) in data.get("seen", {}).items():
                calls[cid] = _Seen(int(upto), (int(x) for x in extra))
            self._seen[sid] = calls
        for raw in loaded.log:
            ev = event_from_log(raw)
            calls = self._seen.setdefault(ev.session_id, OrderedDict())
            seen = calls.get(ev.call_id)
            if seen is not None and ev.seq in seen:
                continue
            with contextlib.suppress(InvalidEventError):  # it was valid when logged
                self.core.apply(ev)
            self._mark_seen(ev.session_id, ev.call_id, ev.seq)
        self._log_len = len(loaded.log)
        self.restored_events = len(loaded.log)
        # sessions changed by the replayed log stay dirty: the next snapshot replaces the log
        for sid in self.core.sessions():  # republish under this epoch
            self._queue_record(self.core.predict(sid, self.clock.now()))
        self._publish_changes(self.clock.now())
        self._flush_needed.set()

    def start_background(self) -> None:
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="predictor-flush"),
            asyncio.create_task(self._tick_loop(), name="predictor-tick"),
            asyncio.create_task(self._maintenance_loop(), name="predictor-maintenance"),
        ]

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.wait_durable(self._applied_gen, timeout_s=1.0)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for w in self._watchers:
            w.queue.put_nowait(None)

    # ------------------------------------------------------------------ ingestion
    def apply(self, events: Sequence[pb.ToolEvent]) -> list[pb.EventAck]:
        """Apply a batch to the core (no I/O); the acks are valid once ``wait_durable``.

        The hot path of ingestion: proto fields are read once into locals (each read of a
        proto string builds a new Python string)."""
        if len(events) > self.settings.max_batch_events:
            reason = f"batch of {len(events)} events exceeds {self.settings.max_batch_events}"
            return [ack(e, pb.ACK_STATUS_REJECTED, reason) for e in events]
        now = self.clock.now()
        acks: list[pb.EventAck] = []
        log = self._pending.log
        seen_by_session = self._seen
        core_apply = self.core.apply
        make_ack = pb.EventAck
        durable, duplicate, rejected = pb.ACK_STATUS_DURABLE, pb.ACK_STATUS_DUPLICATE, pb.ACK_STATUS_REJECTED
        applied = False
        finished = pb.TOOL_EVENT_TYPE_FINISHED
        for e in events:
            sid, cid, seq = e.session_id, e.call_id, e.sequence
            calls = seen_by_session.get(sid)
            seen = calls.get(cid) if calls is not None else None
            if seen is not None and seq in seen:
                acks.append(make_ack(session_id=sid, call_id=cid, sequence=seq, status=duplicate))
                continue
            if e.type == finished and self.metrics is not None:
                self._observe_error(sid, cid, e.t_unix_s)
            try:
                changed = core_apply(event_from_proto(e, sid, cid), now)
            except InvalidEventError as exc:
                acks.append(make_ack(session_id=sid, call_id=cid, sequence=seq, status=rejected, reason=str(exc)))
                continue
            if seen is None:
                self._mark_seen(sid, cid, seq)
            else:
                seen.add(seq)
            if not changed:
                acks.append(make_ack(session_id=sid, call_id=cid, sequence=seq, status=duplicate))
                continue
            log.append(event_to_log(e))
            applied = True
            acks.append(make_ack(session_id=sid, call_id=cid, sequence=seq, status=durable))
        # even a batch of duplicates waits for the write that made the originals durable
        self._applied_gen += 1 if applied else 0
        self._flush_needed.set()  # the flush computes the touched sessions' records once
        return acks

    def _observe_error(self, sid: str, cid: str, finished_t: float) -> None:
        pred = self.core.call_prediction(sid, cid)
        if pred is None or pred.completed or finished_t < pred.started_at_s or self.metrics is None:
            return
        self.metrics.error.labels(pred.evidence.kind).observe(abs(pred.expected_s - (finished_t - pred.started_at_s)))

    async def ingest(self, events: Sequence[pb.ToolEvent]) -> list[pb.EventAck]:
        with tracing.span("tao.predictor", "predictor.ingest", {"tao.events": len(events)}):
            acks = self.apply(events)
            await self.wait_durable(self._applied_gen, self.settings.flush_timeout_s)
            return acks

    async def wait_durable(self, gen: int, timeout_s: float) -> None:
        if self._durable_gen >= gen:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((gen, fut))
        self._flush_needed.set()
        try:
            await within(fut, timeout_s)
        except TimeoutError:
            raise Unavailable(f"Redis did not confirm the write within {timeout_s} s; resend") from None

    def _mark_seen(self, sid: str, cid: str, seq: int) -> None:
        calls = self._seen.get(sid)
        if calls is None:
            calls = self._seen[sid] = OrderedDict()
        seen = calls.get(cid)
        if seen is None:
            seen = calls[cid] = _Seen()
            while len(calls) > self.settings.dedupe_calls_per_session:
                calls.popitem(last=False)
        seen.add(seq)

    # ------------------------------------------------------------------ predictions
    def _queue_record(self, sp: SessionPrediction) -> str:
        raw = record_json(sp, self.revs.epoch, self.revs.next().rev)
        self._pending.predictions[sp.session_id] = raw
        self._pending.deleted.discard(sp.session_id)
        return raw

    def _publish_changes(self, now_s: float) -> None:
        changed, refreshed = self.core.advance_all(now_s)
        for sp in refreshed:
            self._queue_record(sp)
        for sp in changed:
            self._pending.publish.append(self._queue_record(sp))
            for w in self._watchers:
                if (not w.sessions or sp.session_id in w.sessions) and not w.overflow:
                    try:
                        w.queue.put_nowait(sp)
                    except asyncio.QueueFull:
                        w.overflow = True
                        with contextlib.suppress(asyncio.QueueEmpty):
                            w.queue.get_nowait()
                        w.queue.put_nowait(None)
        if changed or refreshed:
            self._flush_needed.set()

    def predict(self, session_id: str) -> SessionPrediction:
        sp = self.core.predict(session_id, self.clock.now())
        if sp.reason is ReadyReason.UNKNOWN:
            raise NotFound(f"no tool call known for session {session_id!r}")
        return sp

    async def watch(self, session_ids: Sequence[str], initial: bool) -> AsyncIterator[SessionPrediction]:
        w = _Watcher(frozenset(session_ids), asyncio.Queue(self.settings.watch_queue_size))
        self._watchers.append(w)
        try:
            if initial:
                now = self.clock.now()
                for sid in (session_ids or self.core.sessions()):
                    sp = self.core.predict(sid, now)
                    if sp.reason is not ReadyReason.UNKNOWN:
                        yield sp
            while True:
                item = await w.queue.get()
                if item is None:
                    if w.overflow:
                        raise ResourceExhausted("watcher fell behind by more than watch_queue_size changes")
                    return
                yield item
        finally:
            self._watchers.remove(w)

    # ------------------------------------------------------------------ background
    def _take_batch(self) -> WriteBatch:
        p = self._pending
        self._pending = _Pending()
        batch = WriteBatch(p.log, p.predictions, p.deleted, p.publish)
        due = _monotonic() - self._last_snapshot_s >= self.settings.snapshot_interval_s
        big = self._log_len + len(p.log) >= self.settings.snapshot_max_log_events
        if due or big or self._force_snapshot:
            snap = Snapshot()
            dirty = self.core.drain_dirty()
            for sid, state in dirty.sessions.items():
                calls = self._seen.get(sid)
                seen = {cid: s.to_json() for cid, s in calls.items()} if calls else {}
                snap.states[sid] = None if state is None else json.dumps({"core": state, "seen": seen})
            snap.history = {k: json.dumps(v) for k, v in dirty.history.items()}
            snap.history_deleted = set(dirty.history_evicted)
            snap.merge_older(self._snap_pending)
            self._snap_pending = Snapshot()
            batch.snapshot = snap
        return batch

    def _requeue(self, batch: WriteBatch) -> None:
        """A write failed: put its content back in front of what accumulated since."""
        p = self._pending
        p.log[:0] = batch.log
        for sid, raw in batch.predictions.items():
            p.predictions.setdefault(sid, raw)
        p.deleted |= {s for s in batch.predictions_deleted if s not in p.predictions}
        p.publish[:0] = batch.publish
        if batch.snapshot is not None:
            # its log entries were never written: a full state snapshot must go out next
            self._snap_pending.merge_older(batch.snapshot)
            self._force_snapshot = True

    async def flush_once(self) -> bool:
        gen = self._applied_gen
        self._publish_changes(self.clock.now())  # records of every session touched since the last flush
        batch = self._take_batch()
        try:
            await self.store.write(batch, check_epoch=self._written and not self._resyncing)
        except EpochLost:
            self._requeue(batch)
            self.resync_all()
            return False
        except NotReplicated:
            # written, but perhaps only on a master about to be replaced: write everything
            # again (a full snapshot) and acknowledge once a replica confirms that
            self.resync_all()
            return False
        except (RedisError, OSError, RuntimeError):
            # RuntimeError: redis-py's Redis Cluster transaction pipeline queues on a thread-run
            # event loop and raises "bound to a different event loop" when a slot-map reload is
            # under way (a failover, redis_client.transaction); retried like a Redis error, or
            # this loop would die and nothing would be acknowledged again (the fleet fault suite)
            self._requeue(batch)
            return False
        self._written = True
        self._resyncing = False
        if batch.snapshot is not None:
            self._log_len = 0
            self._last_snapshot_s = _monotonic()
            self._force_snapshot = False
        else:
            self._log_len += len(batch.log)
        self._durable_gen = max(self._durable_gen, gen)
        keep = []
        for target, fut in self._waiters:
            if target <= gen:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._waiters = keep
        return True

    async def _flush_loop(self) -> None:
        while True:
            reraise_if_cancelling()
            await self._flush_needed.wait()
            self._flush_needed.clear()
            if not await self.flush_once():
                await asyncio.sleep(self.settings.flush_retry_s)
                self._flush_needed.set()

    def tick(self) -> None:
        """Re-evaluate readiness at the clock's current time (publishes changes)."""
        self._publish_changes(self.clock.now())

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            self.tick()

    async def _maintenance_loop(self) -> None:
        elapsed = 0.0
        while True:
            await asyncio.sleep(1.0)
            elapsed += 1.0
            if elapsed >= self.settings.gc_interval_s:
                elapsed = 0.0
                for sid in self.core.gc(self.clock.now()):
                    self._seen.pop(sid, None)
                    self._pending.predictions.pop(sid, None)
                    self._pending.deleted.add(sid)
                    self._flush_needed.set()
            try:
                present = await self.store.epoch_present()
            except (RedisError, OSError):
                continue
            if not present and self._written and not self._resyncing:
                self.resync_all()

    def resync_all(self) -> None:
        """Redis lost our keys (restart without persistence): republish everything we hold."""
        state = self.core.to_state()
        snap = Snapshot()
        for sid, st in state["sessions"].items():
            calls = self._seen.get(sid)
            seen = {cid: s.to_json() for cid, s in calls.items()} if calls else {}
            snap.states[sid] = json.dumps({"core": st, "seen": seen})
        snap.history = {k: json.dumps(v) for k, v in state["history"].items()}
        self._snap_pending = snap
        self.core.drain_dirty()
        self._force_snapshot = True
        self._resyncing = True
        now = self.clock.now()
        for sid in self.core.sessions():
            self._queue_record(self.core.predict(sid, now))
        self._flush_needed.set()


class PredictorServicer(pb_grpc.PredictorServiceServicer):
    """proto -> engine -> proto; domain errors become status codes in the interceptor."""

    def __init__(self, engine: PredictorEngine) -> None:
        self.engine = engine

    async def StreamToolEvents(
        self, request_iterator: AsyncIterator[pb.StreamToolEventsRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamToolEventsResponse]:
        async for request in request_iterator:
            acks = await self.engine.ingest(request.events)
            yield pb.StreamToolEventsResponse(acks=acks)

    async def ReportToolEvents(
        self, request: pb.ReportToolEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportToolEventsResponse:
        return pb.ReportToolEventsResponse(acks=await self.engine.ingest(request.events))

    async def GetPrediction(
        self, request: pb.GetPredictionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPredictionResponse:
        if not request.session_id:
            raise InvalidArgument("session_id is required")
        return pb.GetPredictionResponse(prediction=prediction_to_proto(self.engine.predict(request.session_id)))

    async def WatchReadiness(
        self, request: pb.WatchReadinessRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchReadinessResponse]:
        async for sp in self.engine.watch(list(request.session_ids), request.initial):
            yield pb.WatchReadinessResponse(prediction=prediction_to_proto(sp))
