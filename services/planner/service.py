"""The planner service: rounds around the pure core, Redis I/O, and the gRPC servicer.

A round: read a consistent snapshot (``SnapshotSource``), solve it with the configured
policy in a worker thread (off the event loop), publish the plan with (epoch, revision) to
``keys.PLAN``, ``keys.PLAN_CHANNEL`` and every ``WatchPlans`` stream, re-asserting the
planner's live epoch. Rounds are triggered by pool changes the router announces on
``keys.POOL_CHANNEL`` (debounced by ``debounce_s``) and by a periodic ``tick_s`` tick; one
round runs at a time and a trigger during a round causes one more round after it.

Active/standby (docs/architecture.md#high-availability): rounds run and plans are published
only while this instance holds the planner lease (``RedisLease``); a plan is written through the
lease's fenced write (the token is checked in Redis in the same script), stamped with the
epoch of the lease's term, so a deposed leader can neither overwrite the plan nor the live epoch.

Failure handling: Redis unreadable -> the round is skipped (nothing published, the router's
local fallback takes over once plans go stale); publish failing -> the plan is kept in memory
and still goes to watchers; the pool subscription re-subscribes after a Redis restart.
``SolveSnapshot`` solves a given snapshot with a fresh policy instance and publishes nothing.

Time: ``clock.unix()`` (model Unix seconds, docs/architecture.md#model-time) stamps snapshots and records,
``clock.now()`` paces rounds and ``clock.wall_seconds`` converts model seconds for sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import grpc
import redis.asyncio as aioredis
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.exceptions import RedisError

from services.common import keys, tracing
from services.common.aio import reraise_if_cancelling, wait_event, within
from services.common.epoch import RevisionCounter, Stamp
from services.common.errors import InvalidArgument, NotFound
from services.common.lease import RedisLease
from services.planner.convert import (
    PlannerPlanRecord,
    explanation_to_proto,
    plan_to_proto,
    plan_to_record,
    record_to_proto,
    snapshot_from_proto,
)
from services.planner.core import Plan, Policy, Snapshot, UnknownPolicyError, make_policy
from services.planner.core.explain import explain
from services.planner.core.policy import pool_candidates
from services.planner.settings import Settings
from services.planner.snapshot_source import SnapshotSource
from services.planner.timing import timed_plan
from tao.planner.v1 import planner_pb2, planner_pb2_grpc

SCOPE = "tao.planner"  # the tracer of the round's spans


class ModelClock(Protocol):
    def now(self) -> float: ...
    def unix(self) -> float: ...
    def wall_seconds(self, model_s: float) -> float: ...


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry or CollectorRegistry()
        self.rounds = Counter("tao_planner_rounds", "Planning rounds by outcome.", ["outcome"], registry=reg)
        self.solve = Histogram("tao_planner_solve_seconds", "Snapshot-to-plan time of published rounds.",
                               buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                               registry=reg)
        self.pool = Gauge("tao_planner_pool_sessions", "Pool sessions in the last snapshot.", registry=reg)
        self.assigned = Counter("tao_planner_assignments", "Admissions published.", registry=reg)
        self.paused = Counter("tao_planner_pauses", "Pauses published.", registry=reg)
        self.excluded = Counter("tao_planner_excluded_by_rounding",
                                "Placements the DP's rounding excluded (then topped up).", registry=reg)
        self.skipped = Counter("tao_planner_records_skipped", "Stale-epoch or unreadable records.", registry=reg)
        self.redis_errors = Counter("tao_planner_redis_errors", "Failed Redis reads or writes.", registry=reg)


@dataclass(frozen=True)
class Published:
    """A published plan with the snapshot it was made from (for ExplainSession)."""

    plan: Plan
    snapshot: Snapshot
    record: PlannerPlanRecord

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.record.epoch, self.record.rev)


class PlannerService:
    def __init__(self, settings: Settings, redis: aioredis.Redis, epoch: str, clock: ModelClock,
                 log: structlog.stdlib.BoundLogger, registry: CollectorRegistry | None = None,
                 lease: RedisLease | None = None) -> None:
        self.settings = settings
        #: publishes only while leading; without one, a lone writer that always publishes
        self.lease = lease or RedisLease(redis, "planner", ttl_s=settings.lease_ttl_s, process_epoch=epoch,
                                         log=log, enabled=False)
        self.redis = redis
        self.clock = clock
        self.log = log
        self.metrics = PlannerMetrics(registry)
        self.source = SnapshotSource(redis, settings, clock.unix)
        self.policy: Policy = make_policy(settings.policy, engine_profile=settings.engine_profile)
        self.revisions = RevisionCounter(self.lease.epoch)
        self.last: Published | None = None
        self._lock = asyncio.Lock()
        self._kick = asyncio.Event()
        self._watchers: set[asyncio.Queue[PlannerPlanRecord]] = set()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def epoch(self) -> str:
        return self.revisions.epoch

    # ------------------------------------------------------------------ rounds

    async def plan_once(self) -> PlannerPlanRecord | None:
        """One round; returns the published record, or None when the snapshot was unreadable,
        this instance is a standby, or it lost the lease before publishing."""
        async with self._lock:
            if not self.lease.is_leader():
                self.metrics.rounds.labels("standby").inc()
                return None
            with tracing.span(SCOPE, "planner.round") as round_span:
                try:
                    with tracing.span(SCOPE, "planner.snapshot_read"):
                        read = await self.source.read()
                except (RedisError, OSError) as exc:
                    self.metrics.redis_errors.inc()
                    self.metrics.rounds.labels("redis_unreadable").inc()
                    self.log.warning("round skipped: snapshot unreadable", error=str(exc).splitlines()[0])
                    return None
                self.metrics.skipped.inc(read.skipped)
                with tracing.span(SCOPE, "planner.solve") as solve_span:
                    plan = await asyncio.to_thread(timed_plan, self.policy, read.snapshot)
                    if solve_span is not None:
                        solve_span.set_attributes({"tao.solver": plan.solver, "tao.admitted": len(plan.assignments),
                                                   "tao.paused": len(plan.pauses)})
                if not self.lease.is_leader():
                    self.metrics.rounds.labels("standby").inc()
                    return None
                if self.revisions.epoch != self.lease.epoch:  # a new term: a new epoch, revisions from 1
                    self.revisions = RevisionCounter(self.lease.epoch)
                stamp = Stamp(self.revisions.epoch, self.revisions.last + 1)  # taken once published
                pool = len(pool_candidates(read.snapshot))
                record = plan_to_record(plan, stamp, read.read_at_unix_s, self.clock.unix(), pool)
                if round_span is not None:
                    round_span.set_attributes({"tao.plan.epoch": record.epoch, "tao.plan.revision": record.rev,
                                               "tao.pool_sessions": pool})
                with tracing.span(SCOPE, "planner.publish"):
                    if not await self._publish(record):
                        return None
                self.revisions.next()
                self.last = Published(plan, read.snapshot, record)
                self._count(plan, pool)
                return record

    async def _publish(self, record: PlannerPlanRecord) -> bool:
        """Write and announce the plan (fenced by the lease); False when the lease was lost."""
        body = record.model_dump_json()
        try:
            written = await self.lease.write([(keys.epoch_key("planner"), record.epoch), (keys.PLAN, body)],
                                             [(keys.PLAN_CHANNEL, body)])
        except (RedisError, OSError) as exc:
            self.metrics.redis_errors.inc()
            self.metrics.rounds.labels("publish_failed").inc()
            self.log.warning("publish failed; plan kept in memory", error=str(exc).splitlines()[0], revision=record.rev)
        else:
            if not written:
                self.metrics.rounds.labels("deposed").inc()
                return False
            self.metrics.rounds.labels("published").inc()
        for q in list(self._watchers):
            if q.full():
                q.get_nowait()  # a slow watcher skips to the newest plans
            q.put_nowait(record)
        return True

    def _count(self, plan: Plan, pool: int) -> None:
        self.metrics.solve.observe(plan.solve_ms / 1000.0)
        self.metrics.pool.set(pool)
        self.metrics.assigned.inc(len(plan.assignments))
        self.metrics.paused.inc(len(plan.pauses))
        self.metrics.excluded.inc(plan.excluded_by_rounding)
        if plan.assignments or plan.pauses:
            self.log.info("plan", revision=self.revisions.last, solver=plan.solver, solve_ms=round(plan.solve_ms, 2),
                          pool=pool, admitted=len(plan.assignments), paused=len(plan.pauses),
                          objective=list(plan.objective))

    def kick(self) -> None:
        """Ask for a round soon (debounced)."""
        self._kick.set()

    def start_background(self) -> None:
        self._tasks = [asyncio.create_task(self._rounds(), name="planner-rounds"),
                       asyncio.create_task(self._follow_pool(), name="planner-pool")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _rounds(self) -> None:
        """Plan on every debounced kick and at least every ``tick_s``; a failing round is logged."""
        while True:
            reraise_if_cancelling()
            await wait_event(self._kick, self.clock.wall_seconds(self.settings.tick_s))
            if self._kick.is_set() and self.settings.debounce_s > 0:
                await asyncio.sleep(self.clock.wall_seconds(self.settings.debounce_s))
            self._kick.clear()
            try:
                await self.plan_once()
            except Exception as exc:  # a bug in one round must not stop planning
                self.log.error("round failed", error=repr(exc))
                self.metrics.rounds.labels("failed").inc()

    async def _follow_pool(self) -> None:
        """Kick a round on every pool-change message; re-subscribe after Redis trouble."""
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keys.POOL_CHANNEL)
                self.kick()  # whatever changed while we were not listening
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self.kick()
            except (RedisError, OSError) as exc:
                self.metrics.redis_errors.inc()
                self.log.warning("pool subscription lost; retrying", error=str(exc).splitlines()[0])
                await asyncio.sleep(0.5)
            finally:
                # bounded: closing a pubsub whose read was just cancelled can wait on its lock
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    await within(pubsub.aclose(), 2.0)  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ commands

    async def solve(self, snapshot: Snapshot, policy_name: str) -> Plan:
        try:
            policy = make_policy(policy_name or self.settings.policy, engine_profile=self.settings.engine_profile)
        except UnknownPolicyError as exc:
            raise InvalidArgument(str(exc)) from exc
        return await asyncio.to_thread(timed_plan, policy, snapshot)

    def subscribe(self) -> asyncio.Queue[PlannerPlanRecord]:
        q: asyncio.Queue[PlannerPlanRecord] = asyncio.Queue(self.settings.watch_queue_size)
        self._watchers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[PlannerPlanRecord]) -> None:
        self._watchers.discard(q)


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    """proto -> domain -> service -> proto; domain errors become status codes in the interceptor."""

    def __init__(self, svc: PlannerService) -> None:
        self.svc = svc

    async def SolveSnapshot(self, request: planner_pb2.SolveSnapshotRequest,
                            context: grpc.aio.ServicerContext) -> planner_pb2.SolveSnapshotResponse:
        snapshot = snapshot_from_proto(request.snapshot)
        plan = await self.svc.solve(snapshot, request.policy)
        return planner_pb2.SolveSnapshotResponse(plan=plan_to_proto(plan, None, self.svc.clock.unix()))

    async def GetPlan(self, request: planner_pb2.GetPlanRequest,
                      context: grpc.aio.ServicerContext) -> planner_pb2.GetPlanResponse:
        if self.svc.last is None:
            raise NotFound("no plan published yet")
        return planner_pb2.GetPlanResponse(plan=record_to_proto(self.svc.last.record))

    async def WatchPlans(self, request: planner_pb2.WatchPlansRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[planner_pb2.WatchPlansResponse]:
        q = self.svc.subscribe()
        last = 0
        try:
            if request.include_current and self.svc.last is not None:
                last = self.svc.last.record.rev
                yield planner_pb2.WatchPlansResponse(plan=record_to_proto(self.svc.last.record))
            while True:
                rec = await q.get()
                if rec.rev > last:
                    last = rec.rev
                    yield planner_pb2.WatchPlansResponse(plan=record_to_proto(rec))
        finally:
            self.svc.unsubscribe(q)

    async def ExplainSession(self, request: planner_pb2.ExplainSessionRequest,
                             context: grpc.aio.ServicerContext) -> planner_pb2.ExplainSessionResponse:
        last = self.svc.last
        if last is None:
            raise NotFound("no plan published yet")
        if not request.session_id:
            raise InvalidArgument("session_id is required")
        try:
            exp = explain(last.snapshot, last.plan, request.session_id)
        except KeyError:
            raise NotFound(f"session {request.session_id!r} is not in the snapshot of plan "
                           f"{last.record.rev}") from None
        return explanation_to_proto(exp, last.stamp)
