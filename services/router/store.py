"""Write-behind of the router's records to Redis (the router is their only writer).

The hot path never waits for Redis: core events mark sessions, tenants and replicas dirty
and ``wake()`` the flusher, which waits ``flush_interval_s`` to batch (only ``POOL_FLUSH_S``
when the pool changed: a held request waits for the planner to see it), then writes every
dirty record in one pipeline (HSET sessions/replicas/demand, HDEL ended sessions, SET the
router epoch) and afterwards publishes the ids of sessions whose pool state changed on
``keys.POOL_CHANNEL`` (so the planner reads the new state). Every record carries the
router's epoch and a fresh revision. If Redis fails, the dirty sets are kept and retried;
a Redis that lost our epoch key (restart without persistence) gets everything republished.
At start-up sessions and replicas of a previous router process are read back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog
from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import reraise_if_cancelling, stop_tasks, wait_event, within
from services.common.epoch import RevisionCounter
from services.common.records import (
    RecordError,
    ReplicaRecord,
    SessionRecord,
    TenantDemandRecord,
    dump,
    load,
)
from services.common.redis_client import publish_in
from services.common.stats import percentile
from services.router.core.model import Session, TokenStats

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from services.router.core.state import RouterCore
    from services.router.fleet import RouterFleet
    from services.router.replicas import ReplicaRegistry

POOL_PUBLISH_MAX = 32
POOL_FLUSH_S = 0.002
#: session records serialised between two yields to the event loop (~40 us each): a flush of
#: hundreds of dirty sessions must not stall the requests being relayed
FLUSH_SLICE = 16


class StateStore:
    def __init__(self, redis: aioredis.Redis, core: RouterCore, registry: ReplicaRegistry, epoch: str,
                 to_unix: Callable[[float], float], from_unix: Callable[[float], float], *,
                 flush_interval_s: float, resync_interval_s: float, demand_interval_s: float,
                 log: structlog.stdlib.BoundLogger) -> None:
        self._redis = redis
        self._core = core
        self._registry = registry
        self.revisions = RevisionCounter(epoch)
        self._to_unix = to_unix
        self._from_unix = from_unix
        self._flush_s = flush_interval_s
        self._resync_s = resync_interval_s
        self._demand_s = demand_interval_s
        self._log = log
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()
        self._sessions: set[str] = set()
        self._ended: set[str] = set()
        self._tenants: set[str] = set()
        self._replicas: set[str] = set()
        self._pool: set[str] = set()
        self.latency_s: dict[str, deque[float]] = {}
        self.hold_s: dict[str, deque[float]] = {}
        self.flushes = 0
        self.failures = 0
        self._tasks: list[asyncio.Task[None]] = []
        #: fleet mode: session writes are fenced by ownership, demand is per router (fleet.py)
        self.fleet: RouterFleet | None = None

    # ------------------------------------------------------------------ conversions

    def session_record(self, s: Session) -> SessionRecord:
        u = self._to_unix
        stamp = self.revisions.next()
        return SessionRecord(
            epoch=stamp.epoch, rev=stamp.rev, session_id=s.id, tenant=s.tenant, phase=self._core.phase(s),
            replica=s.replica, admitted=s.admitted, pause_pending=s.pause_pending,
            context_tokens=s.tokens.context_tokens, last_prompt_tokens=s.tokens.last_prompt_tokens,
            last_output_tokens=s.tokens.last_output_tokens, ewma_output_tokens=s.tokens.ewma_output_tokens,
            expected_append_tokens=s.tokens.expected_append_tokens, footprint_tokens=s.footprint_tokens,
            requests=s.tokens.requests, last_cached_tokens=s.last_cached_tokens, last_ttft_s=s.last_ttft_s,
            cache=tuple(replace(e, observed_at_s=u(e.observed_at_s)) for e in s.cache),
            created_at_unix_s=u(s.created_s), updated_at_unix_s=u(s.updated_s),
            waiting_since_unix_s=None if s.waiting_since_s is None else u(s.waiting_since_s),
            acting_since_unix_s=None if s.acting_since_s is None else u(s.acting_since_s),
            model=s.model, prefix_key=s.prefix_key, prefix_tokens=s.prefix_tokens, shared_tokens=s.shared_tokens,
        )

    def session_from_record(self, r: SessionRecord) -> Session:
        f = self._from_unix
        return Session(
            id=r.session_id, tenant=r.tenant, created_s=f(r.created_at_unix_s), updated_s=f(r.updated_at_unix_s),
            placed_s=f(r.updated_at_unix_s), replica=r.replica, admitted=r.admitted and r.replica is not None,
            tokens=TokenStats(r.requests, r.last_prompt_tokens, r.last_output_tokens, r.ewma_output_tokens,
                              float(r.expected_append_tokens)),
            cache=tuple(replace(e, observed_at_s=f(e.observed_at_s)) for e in r.cache),
            acting_since_s=None if r.acting_since_unix_s is None else f(r.acting_since_unix_s),
            last_cached_tokens=r.last_cached_tokens, last_ttft_s=r.last_ttft_s, model=r.model,
            prefix_key=r.prefix_key, prefix_tokens=r.prefix_tokens,
        )

    def replica_record(self, rid: str, now_s: float) -> ReplicaRecord | None:
        rep = self._core.replicas.get(rid)
        if rep is None:
            return None
        stamp = self.revisions.next()
        return ReplicaRecord(
            epoch=stamp.epoch, rev=stamp.rev, replica_id=rid, url=rep.url, healthy=rep.healthy,
            draining=rep.draining, kv_capacity_tokens=rep.kv_capacity_tokens,
            capacity_tokens=self._core.capacity(rid), used_tokens=max(0, self._core.used.get(rid, 0)),
            running=rep.running, waiting=rep.waiting, kv_cache_usage=rep.kv_cache_usage,
            prefix_hit_rate=rep.prefix_hit_rate, models=rep.models, block_size=rep.block_size,
            updated_at_unix_s=self._to_unix(now_s),
        )

    def demand_record(self, tenant: str, now_s: float) -> TenantDemandRecord:
        stamp = self.revisions.next()
        return TenantDemandRecord(
            epoch=stamp.epoch, rev=stamp.rev, tenant=tenant,
            waiting=max(0, self._core.tenant_held.get(tenant, 0)),
            in_flight=max(0, self._core.tenant_in_flight.get(tenant, 0)),
            p99_latency_s=percentile(self.latency_s.get(tenant, ()), 99, method="higher"),
            p99_hold_s=percentile(self.hold_s.get(tenant, ()), 99, method="higher"),
            updated_at_unix_s=self._to_unix(now_s),
        )

    def record_latency(self, tenant: str, seconds: float, hold_s: float | None = None) -> None:
        """One finished request of ``tenant``: its latency from arrival and, when it was
        admitted, how long it held its slot (admission to end); the last 1000 of each."""
        for windows, value in ((self.latency_s, seconds), (self.hold_s, hold_s)):
            if value is None:
                continue
            window = windows.get(tenant)
            if window is None:
                window = windows[tenant] = deque(maxlen=1000)
            window.append(value)

    # ------------------------------------------------------------------ lifecycle

    async def restore(self, now_s: float) -> tuple[list[Session], list[ReplicaRecord]]:
        """Sessions and replicas a previous router process left in Redis (best effort)."""
        try:
            raw_sessions = await self._redis.hgetall(keys.SESSIONS)
            raw_replicas = await self._redis.hgetall(keys.REPLICAS)
        except (RedisError, OSError) as exc:
            self._log.warning("restore skipped", error=str(exc).splitlines()[0])
            return [], []
        sessions, replicas = [], []
        for raw in raw_sessions.values():
            try:
                sessions.append(self.session_from_record(load(SessionRecord, raw)))
            except RecordError as exc:
                self._log.warning("unreadable session record", error=str(exc))
        for raw in raw_replicas.values():
            with contextlib.suppress(RecordError):
                replicas.append(load(ReplicaRecord, raw))
        return sessions, replicas

    def start(self, now: Callable[[], float]) -> None:
        self._now = now
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="router-store-flush"),
            asyncio.create_task(self._periodic(), name="router-store-periodic"),
        ]

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        with contextlib.suppress(RedisError, OSError, asyncio.TimeoutError):
            await within(self.flush(), 2.0)

    def wake(self) -> None:
        self._wake.set()
        if self._core.pool_dirty:
            self._urgent.set()

    def forget(self, session_id: str) -> None:
        """Write ``session_id`` as ended (fleet: a claim that never became a session)."""
        if session_id not in self._core.sessions:
            self._ended.add(session_id)
            self.wake()

    def mark_all(self) -> None:
        self._sessions |= set(self._core.sessions)
        self._replicas |= set(self._core.replicas)
        self._tenants |= set(self._core.tenant_held) | set(self._core.tenant_in_flight)
        self._pool |= {sid for sid, s in self._core.sessions.items() if not s.admitted}
        self.wake()

    async def _flush_loop(self) -> None:
        while True:
            reraise_if_cancelling()
            await self._wake.wait()
            if not self._urgent.is_set():
                await wait_event(self._urgent, self._flush_s)
            await asyncio.sleep(min(POOL_FLUSH_S, self._flush_s))  # gather a burst
            self._wake.clear()
            self._urgent.clear()
            try:
                await self.flush()
            except (RedisError, OSError) as exc:
                reraise_if_cancelling()
                self.failures += 1
                if self.failures % 50 == 1:
                    self._log.warning("redis write failed; will retry", error=str(exc).splitlines()[0])
                await asyncio.sleep(min(1.0, 0.05 * self.failures))
                self._wake.set()

    async def _periodic(self) -> None:
        last_demand = last_resync = 0.0
        loop = asyncio.get_running_loop()
        while True:
            reraise_if_cancelling()
            await asyncio.sleep(min(self._demand_s, self._resync_s) / 2)
            now = loop.time()  # these periods are wall time (I/O pacing)
            if now - last_demand >= self._demand_s:
                last_demand = now
                self._tenants |= set(self._core.tenant_held) | set(self._core.tenant_in_flight)
                self._replicas |= set(self._core.replicas)
                self.wake()
            if now - last_resync >= self._resync_s:
                last_resync = now
                try:
                    live = await (self._redis.get(keys.epoch_key("router")) if self.fleet is None
                                  else self._redis.hget(keys.ROUTER_EPOCHS, self.fleet.rid))
                except (RedisError, OSError):
                    reraise_if_cancelling()
                    continue
                if live != self.revisions.epoch:
                    self._log.info("republishing router state", live_epoch=live)
                    self.mark_all()

    async def flush(self) -> None:
        d = self._core.take_dirty()
        self._sessions |= d.sessions
        self._ended |= d.ended
        self._tenants |= d.tenants
        self._replicas |= d.replicas
        self._pool |= d.pool
        self._sessions -= self._ended - set(self._core.sessions)
        if not (self._sessions or self._ended or self._tenants or self._replicas or self._pool):
            return
        now = self._now()
        # what this flush writes; marks added while it yields stay for the next one
        taken = (set(self._sessions), set(self._ended), set(self._tenants), set(self._replicas), set(self._pool))
        sessions: dict[Any, Any] = {}
        for i, sid in enumerate(taken[0]):
            if i and i % FLUSH_SLICE == 0:
                await asyncio.sleep(0)  # let requests run between slices of serialisation
            s = self._core.sessions.get(sid)
            if s is not None:
                sessions[sid] = dump(self.session_record(s))
        ended = [sid for sid in taken[1] if sid not in self._core.sessions]
        replicas: dict[Any, Any] = {}
        gone_replicas = []
        for rid in taken[3]:
            rec = self.replica_record(rid, now)
            if rec is None:
                gone_replicas.append(rid)
            else:
                replicas[rid] = dump(rec)
        demand: dict[Any, Any] = {t: dump(self.demand_record(t, now)) for t in taken[2]}
        pool = sorted(taken[4])[:POOL_PUBLISH_MAX]
        pipe = self._redis.pipeline(transaction=False)
        fenced = False
        if self.fleet is None:
            pipe.set(keys.epoch_key("router"), self.revisions.epoch)
        else:  # session writes fenced by ownership (its result is the pipeline's first), demand per router
            fenced = self.fleet.queue_sessions(pipe, sessions, ended)
            sessions, ended = {}, []
            demand = {self.fleet.demand_field(t): v for t, v in demand.items()}
        if sessions:
            pipe.hset(keys.SESSIONS, mapping=sessions)
        if ended:
            pipe.hdel(keys.SESSIONS, *ended)
        if replicas:
            pipe.hset(keys.REPLICAS, mapping=replicas)
        if gone_replicas:
            pipe.hdel(keys.REPLICAS, *gone_replicas)
        if demand:
            pipe.hset(keys.DEMAND, mapping=demand)
        publish_in(pipe, keys.SESSIONS, keys.POOL_CHANNEL, pool)  # a script: Cluster pipelines refuse PUBLISH
        results = await pipe.execute()
        if fenced and self.fleet is not None:
            self.fleet.refused(results[0])
            self.fleet.ended_written()
        self.flushes += 1
        self._sessions -= taken[0]
        self._ended -= taken[1]
        self._tenants -= taken[2]
        self._replicas -= taken[3]
        self._pool -= taken[4]
