"""Read one consistent planning snapshot from Redis.

Everything is read in one MULTI/EXEC transaction (sessions, replicas, predictions, the
allocation, tenant demand and the writers' live epochs), so the snapshot is the state at a
single instant. Records of a stale writer epoch and records that do not parse are skipped
and counted; the rest goes through ``convert.snapshot_from_records``. With a router fleet
(docs/architecture.md#router-fleet) the live writer epochs of the routers are read in the same
transaction (``fleet.LIVE_EPOCHS``): any live router's records count, a dead router's do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio as aioredis

from services.common import keys
from services.common.fleet import LIVE_EPOCHS, epoch_counts, fleet_used, merge_demand
from services.common.records import (
    AllocationRecord,
    PredictionRecord,
    Record,
    RecordError,
    ReplicaRecord,
    SessionRecord,
    TenantDemandRecord,
    load,
)
from services.common.redis_client import transaction
from services.planner.convert import snapshot_from_records
from services.planner.core.model import Snapshot
from services.planner.settings import Settings

R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class SnapshotRead:
    snapshot: Snapshot
    read_at_unix_s: float
    skipped: int  # records ignored: stale epoch or unreadable
    router_epoch: str | None


class SnapshotSource:
    """Builds snapshots from the published state; ``unix`` is the model-time Unix clock."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, unix: Callable[[], float]) -> None:
        self.redis = redis
        self.settings = settings
        self.unix = unix

    async def read(self) -> SnapshotRead:
        """Raises ``RedisError``/``OSError`` when Redis cannot be read (the caller skips the round)."""
        # Taken before reading: anything that changes after this instant is newer than the
        # plan's input, which is what the router's revalidation needs (snapshot_at_unix_s).
        now = self.unix()
        pipe = await transaction(self.redis)  # a Cluster-safe MULTI/EXEC (redis_client.transaction)
        pipe.get(keys.epoch_key("router"))
        pipe.get(keys.epoch_key("predictor"))
        pipe.get(keys.epoch_key("budget"))
        pipe.hgetall(keys.SESSIONS)
        pipe.hgetall(keys.REPLICAS)
        pipe.hgetall(keys.PREDICTIONS)
        pipe.get(keys.ALLOCATION)
        pipe.hgetall(keys.DEMAND)
        pipe.eval(LIVE_EPOCHS, 2, keys.ROUTER_ALIVE, keys.ROUTER_EPOCHS)
        (router_epoch, predictor_epoch, budget_epoch, raw_sessions, raw_replicas, raw_preds, raw_alloc, raw_demand,
         fleet_epochs) = await pipe.execute()
        skipped = 0
        # a router fleet (docs/architecture.md#router-fleet): records of every live router's
        # epoch count, a dead router's are dropped (its sessions come back under their new owner's)
        fleet = frozenset(fleet_epochs or ())

        def parse(cls: type[R], raws: dict[str, str], live: str | None, router: bool = False) -> list[R]:
            nonlocal skipped
            out = []
            for raw in raws.values():
                try:
                    rec = load(cls, raw)
                except RecordError:
                    skipped += 1
                    continue
                if not epoch_counts(rec.epoch, fleet if router else frozenset(), live):
                    skipped += 1
                    continue
                out.append(rec)
            return out

        sessions = parse(SessionRecord, raw_sessions, router_epoch, router=True)
        replicas = parse(ReplicaRecord, raw_replicas, router_epoch, router=True)
        predictions = {p.session_id: p for p in parse(PredictionRecord, raw_preds, predictor_epoch)}
        demand = parse(TenantDemandRecord, raw_demand, router_epoch, router=True)
        if fleet:
            # each router counts only its own sessions on a replica: the replica's use is the
            # sum over every live router's admitted sessions (fleet_used)
            demand = merge_demand(demand)
            used = fleet_used(sessions)
            replicas = [r.model_copy(update={"used_tokens": used.get(r.replica_id, 0)}) for r in replicas]
        allocation = None
        if raw_alloc is not None and self.settings.use_tenant_headroom:
            try:
                allocation = load(AllocationRecord, raw_alloc)
            except RecordError:
                skipped += 1
            # The last caps hold while the budget service is away
            # (docs/architecture.md#failure-modes-and-degraded-behaviour); a record of an
            # older budget epoch than the live one is superseded and ignored.
            if allocation is not None and budget_epoch is not None and allocation.epoch != budget_epoch:
                allocation = None
        snapshot = snapshot_from_records(
            now, sessions, replicas, predictions, allocation, demand,
            horizon_s=self.settings.ready_horizon_s, fresh_s=self.settings.prediction_fresh_s,
        )
        return SnapshotRead(snapshot=snapshot, read_at_unix_s=now, skipped=skipped, router_epoch=router_epoch)
