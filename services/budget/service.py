"""The budget service: a periodic tick around the pure core, Redis I/O, and the gRPC servicer.

Per tick: read per-tenant demand (the router's ``TenantDemandRecord``s, fenced by the
router's live epoch, merged with fresher ``ReportDemand`` reports) and engine KV use (the
router's replica records), run the policy, publish the allocation with (epoch, revision)
to ``keys.ALLOCATION``, ``keys.ALLOCATION_CHANNEL`` and every ``WatchAllocations`` stream,
and re-assert the configuration record (a wiped Redis is repopulated within one tick).
Active/standby (docs/architecture.md#high-availability): only the holder of the budget lease
ticks and writes (through the lease's fenced write, stamped with its term's epoch); a standby
answers reads from memory, refuses ConfigureTenants/SetPolicy with UNAVAILABLE, and on takeover
reads the configuration and last allocation back from Redis before its first tick.
Redis trouble never stops the loop: the allocation stays in memory and watchers still get it;
the router keeps the last caps it applied.

Time: ``clock`` drives the ticks and is the core's timeline; ``to_unix`` maps it to Unix
seconds for records. Tests inject a ``VirtualClock`` and call ``tick_once()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

import grpc
import redis.asyncio as aioredis
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from services.budget.convert import (
    BudgetAllocationRecord,
    allocation_from_record,
    allocation_to_proto,
    allocation_to_record,
    config_from_proto,
    config_from_record,
    config_to_record,
    demand_from_proto,
    demand_from_record,
)
from services.budget.core import (
    POLICIES,
    Allocation,
    BudgetConfig,
    BudgetConfigError,
    BudgetState,
    ClusterObservation,
    TenantObservation,
    UnknownPolicyError,
    make_policy,
)
from services.budget.settings import Settings
from services.common import keys, tracing
from services.common.clock import Clock
from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.common.fleet import LIVE_EPOCHS, epoch_counts, merge_demand
from services.common.lease import RedisLease
from services.common.records import BudgetConfigRecord, RecordError, ReplicaRecord, TenantDemandRecord, load
from services.common.redis_client import transaction
from tao.budget.v1 import budget_pb2, budget_pb2_grpc


class BudgetMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry or CollectorRegistry()
        self.cap = Gauge("tao_budget_cap_slots", "Slots held per tenant.", ["tenant"], registry=reg)
        self.limit = Gauge("tao_budget_limit_slots", "Admission limit per tenant.", ["tenant"], registry=reg)
        self.ticks = Counter("tao_budget_ticks", "Reallocation ticks.", registry=reg)
        self.moves = Counter("tao_budget_moves", "Ticks that moved slots to a tenant.", ["tenant"], registry=reg)
        self.holds = Counter("tao_budget_holds", "Ticks that moved nothing.", registry=reg)
        self.redis_errors = Counter("tao_budget_redis_errors", "Failed Redis reads or writes.", registry=reg)


class BudgetService:
    """State and behaviour of the service; all mutations happen under one lock."""

    def __init__(
        self, settings: Settings, redis: aioredis.Redis, epoch: str, clock: Clock,
        to_unix: Callable[[float], float], log: structlog.stdlib.BoundLogger,
        registry: CollectorRegistry | None = None, lease: RedisLease | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        #: writes only while leading; without one, a lone writer that always writes
        self.lease = lease or RedisLease(redis, "budget", ttl_s=settings.lease_ttl_s, process_epoch=epoch,
                                         log=log, enabled=False)
        self.clock = clock
        self.to_unix = to_unix
        self.log = log
        self.metrics = BudgetMetrics(registry)
        self.params = settings.dynamic_params()
        self.config: BudgetConfig | None = None
        self.policy_name = settings.policy
        self.allocation: Allocation | None = None
        self.record: BudgetAllocationRecord | None = None
        self.reported: dict[str, TenantObservation] = {}
        self.resumed = False
        self._config_rev = 0
        self._lock = asyncio.Lock()
        self._watchers: set[asyncio.Queue[BudgetAllocationRecord]] = set()

    @property
    def epoch(self) -> str:
        """The writer epoch: the lease term's epoch while leading."""
        return self.lease.epoch

    def _require_leader(self) -> None:
        if not self.lease.is_leader():
            raise Unavailable("this budget instance is a standby; send it to the leader (health SERVING on "
                              "tao.budget.v1.BudgetService)")

    def from_unix(self, unix_s: float) -> float:
        now = self.clock.now()
        return unix_s - (self.to_unix(now) - now)

    # ------------------------------------------------------------ start-up and loop

    async def resume(self) -> None:
        """Configuration, policy and last allocation from Redis; when none is stored, the one in
        memory (a wiped Redis), else the settings'."""
        raw_cfg = raw_alloc = None
        try:
            raw_cfg = await self.redis.get(keys.BUDGET_CONFIG)
            raw_alloc = await self.redis.get(keys.ALLOCATION)
        except (RedisError, OSError) as exc:
            self.metrics.redis_errors.inc()
            self.log.warning("resume: Redis unreadable, starting from settings", error=str(exc).splitlines()[0])
        if self.config is None:
            # (with one in memory and nothing stored, Redis was wiped under this instance: it
            # keeps what it had, and its next publish re-asserts it)
            self.config = self.settings.initial_config()
        if raw_cfg is not None:
            try:
                rec = load(BudgetConfigRecord, raw_cfg)
                self.config = config_from_record(rec)
                self.policy_name = rec.policy if rec.policy in POLICIES else self.policy_name
                self._config_rev = rec.rev
            except (RecordError, BudgetConfigError) as exc:
                self.log.warning("resume: stored configuration ignored", error=str(exc))
        if raw_alloc is not None and self.config is not None:
            try:
                self.allocation = allocation_from_record(load(BudgetAllocationRecord, raw_alloc))
            except (RecordError, ValueError) as exc:
                self.log.warning("resume: stored allocation ignored", error=str(exc))
        self.resumed = True
        self.log.info("resumed", configured=self.config is not None, policy=self.policy_name,
                      revision=self.allocation.revision if self.allocation else 0)

    async def run(self) -> None:
        """Tick every ``tick_s`` on the clock until cancelled; a failing tick is logged, not fatal."""
        next_s = self.clock.now()
        while True:
            try:
                await self.tick_once()
            except Exception as exc:  # never let one bad tick stop reallocation
                self.log.error("tick failed", error=repr(exc))
            next_s += self.settings.tick_s
            delay_s = max(0.0, next_s - self.clock.now())
            # the clock runs in model time (ScaledClock): sleep the wall-time equivalent
            wall_seconds = getattr(self.clock, "wall_seconds", None)
            await asyncio.sleep(wall_seconds(delay_s) if wall_seconds is not None else delay_s)

    # ------------------------------------------------------------ ticks

    async def tick_once(self) -> Allocation | None:
        """One reallocation on current observations; None while unconfigured or a standby."""
        if not self.lease.is_leader():
            return None
        async with self._lock:
            with tracing.span("tao.budget", "budget.tick"):
                return await self._reallocate()

    async def _reallocate(self) -> Allocation | None:
        if self.config is None:
            return None
        now = self.clock.now()
        observations, cluster = await self._observe(now)
        state = BudgetState(now, self.config, observations, self.allocation, cluster)
        alloc = make_policy(self.policy_name, self.params).reallocate(state)
        await self._publish(alloc, now)
        return alloc

    async def _observe(self, now_s: float) -> tuple[dict[str, TenantObservation], ClusterObservation]:
        assert self.config is not None
        names = set(self.config.names)
        seen: dict[str, TenantObservation] = {}
        kv: float | None = None
        try:
            # one MULTI/EXEC (Cluster-safe, every key in the {tao} slot): the demand records are
            # fenced by the router epochs of the same instant
            pipe = await transaction(self.redis)
            pipe.get(keys.epoch_key("router"))
            pipe.hgetall(keys.DEMAND)
            pipe.eval(LIVE_EPOCHS, 2, keys.ROUTER_ALIVE, keys.ROUTER_EPOCHS)
            pipe.hgetall(keys.REPLICAS)
            live, raw_demand, fleet_epochs, raw_replicas = await pipe.execute()
            fleet = frozenset(fleet_epochs or ())
        except (RedisError, OSError) as exc:
            self.metrics.redis_errors.inc()
            self.log.warning("demand unreadable", error=str(exc).splitlines()[0])
            raw_demand, raw_replicas, live, fleet = {}, {}, None, frozenset()
        records = []
        for raw in raw_demand.values():
            try:
                rec = load(TenantDemandRecord, raw)
            except RecordError:
                continue
            # a router fleet (docs/architecture.md#router-fleet): every live router's records,
            # summed per tenant; else the sole router's live epoch
            if rec.tenant in names and epoch_counts(rec.epoch, fleet, live):
                records.append(rec)
        for rec in merge_demand(records) if fleet else records:
            seen[rec.tenant] = demand_from_record(rec, self.from_unix)
        if (live is not None or fleet) and seen:
            # the live router reports every tenant it has requests for: a configured tenant it
            # does not mention has none (idle), as of its freshest report
            as_of = max(o.observed_at_s for o in seen.values())
            for name in names - set(seen):
                seen[name] = TenantObservation(name, 0, 0, as_of)
        for name, obs in self.reported.items():
            if name in names and (name not in seen or obs.observed_at_s >= seen[name].observed_at_s):
                seen[name] = obs
        usages = []
        for raw in raw_replicas.values():
            with contextlib.suppress(RecordError):
                rep = load(ReplicaRecord, raw)
                if rep.healthy:
                    usages.append(rep.kv_cache_usage)
        if usages:
            kv = sum(usages) / len(usages)
        return seen, ClusterObservation(kv)

    async def _publish(self, alloc: Allocation, now_s: float) -> None:
        assert self.config is not None
        rec = allocation_to_record(alloc, self.epoch, self.to_unix(now_s), self.config.rate_limits)
        self.allocation, self.record = alloc, rec
        self._count(alloc)
        body = rec.model_dump_json()
        cfg = config_to_record(self.config, self.policy_name, self.epoch, max(1, self._config_rev))
        try:
            written = await self.lease.write(
                [(keys.epoch_key("budget"), self.epoch), (keys.ALLOCATION, body), (keys.BUDGET_CONFIG, cfg.model_dump_json())],
                [(keys.ALLOCATION_CHANNEL, body)])
            if not written:
                self.log.warning("allocation not published: lease lost", revision=alloc.revision)
                return
        except (RedisError, OSError) as exc:
            self.metrics.redis_errors.inc()
            self.log.warning("publish failed; allocation kept in memory", error=str(exc).splitlines()[0],
                             revision=alloc.revision)
        for q in list(self._watchers):
            if q.full():
                q.get_nowait()  # a slow watcher skips to the newest allocations
            q.put_nowait(rec)
        self.log.info("allocation", revision=alloc.revision, caps=dict(alloc.caps), limits=dict(alloc.limits),
                      decisions=[d.describe() for d in alloc.decisions])

    def _count(self, alloc: Allocation) -> None:
        self.metrics.ticks.inc()
        for name, cap in alloc.caps.items():
            self.metrics.cap.labels(name).set(cap)
            self.metrics.limit.labels(name).set(alloc.limits[name])
        for name in alloc.moved_to:
            self.metrics.moves.labels(name).inc()
        if alloc.is_hold:
            self.metrics.holds.inc()

    # ------------------------------------------------------------ commands

    async def configure(self, config: BudgetConfig) -> BudgetAllocationRecord:
        """Replace the tenant set (already validated) and reallocate at once (leader only)."""
        self._require_leader()
        async with self._lock:
            self.config = config
            self._config_rev += 1
            self.reported = {n: o for n, o in self.reported.items() if n in config.names}
            await self._reallocate()
            assert self.record is not None
            return self.record

    async def set_policy(self, name: str) -> str:
        try:
            make_policy(name, self.params)
        except UnknownPolicyError as exc:
            raise InvalidArgument(str(exc)) from exc
        self._require_leader()
        async with self._lock:
            self.policy_name = name
            self._config_rev += 1
            if self.config is not None:
                cfg = config_to_record(self.config, name, self.epoch, self._config_rev)
                try:
                    await self.lease.write([(keys.BUDGET_CONFIG, cfg.model_dump_json())])
                except (RedisError, OSError):
                    self.metrics.redis_errors.inc()
        return name

    def report(self, observations: Mapping[str, TenantObservation]) -> int:
        self.reported.update(observations)
        return len(observations)

    def subscribe(self) -> asyncio.Queue[BudgetAllocationRecord]:
        q: asyncio.Queue[BudgetAllocationRecord] = asyncio.Queue(self.settings.watch_queue_size)
        self._watchers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[BudgetAllocationRecord]) -> None:
        self._watchers.discard(q)


class BudgetServicer(budget_pb2_grpc.BudgetServiceServicer):
    """proto -> domain -> service -> proto; domain errors become status codes in the interceptor."""

    def __init__(self, svc: BudgetService) -> None:
        self.svc = svc

    async def GetAllocation(self, request: budget_pb2.GetAllocationRequest,
                            context: grpc.aio.ServicerContext) -> budget_pb2.GetAllocationResponse:
        if self.svc.record is None:
            raise NotFound("no allocation yet: configure tenants first")
        return budget_pb2.GetAllocationResponse(allocation=allocation_to_proto(self.svc.record))

    async def WatchAllocations(self, request: budget_pb2.WatchAllocationsRequest,
                               context: grpc.aio.ServicerContext) -> AsyncIterator[budget_pb2.WatchAllocationsResponse]:
        q = self.svc.subscribe()
        last = 0
        try:
            if request.include_current and self.svc.record is not None:
                last = self.svc.record.rev
                yield budget_pb2.WatchAllocationsResponse(allocation=allocation_to_proto(self.svc.record))
            while True:
                rec = await q.get()
                if rec.rev > last:
                    last = rec.rev
                    yield budget_pb2.WatchAllocationsResponse(allocation=allocation_to_proto(rec))
        finally:
            self.svc.unsubscribe(q)

    async def ConfigureTenants(self, request: budget_pb2.ConfigureTenantsRequest,
                               context: grpc.aio.ServicerContext) -> budget_pb2.ConfigureTenantsResponse:
        config = config_from_proto(request)
        rec = await self.svc.configure(config)
        return budget_pb2.ConfigureTenantsResponse(allocation=allocation_to_proto(rec))

    async def SetPolicy(self, request: budget_pb2.SetPolicyRequest,
                        context: grpc.aio.ServicerContext) -> budget_pb2.SetPolicyResponse:
        return budget_pb2.SetPolicyResponse(policy=await self.svc.set_policy(request.policy))

    async def ReportDemand(self, request: budget_pb2.ReportDemandRequest,
                           context: grpc.aio.ServicerContext) -> budget_pb2.ReportDemandResponse:
        known = self.svc.config.names if self.svc.config is not None else ()
        obs = demand_from_proto(request.demand, known, self.svc.clock.now())
        return budget_pb2.ReportDemandResponse(accepted=self.svc.report(obs))
