"""The predictor's durable state in Redis (the predictor is the only writer of these keys).

Layout (``services.common.keys`` plus two keys under ``{tao}:predictor:``):

* ``{tao}:predictor:log`` (list) — every applied event since the last snapshot, compact JSON,
  appended in the same MULTI/EXEC that makes its ack durable;
* ``{tao}:predictor:state`` (hash) — session id -> ``{"core": <core session state>, "seen":
  {call id: [contiguous-up-to, [extra sequences]]}}`` as of the last snapshot;
* ``keys.PREDICTOR_HISTORY`` (hash) — history key -> core history state, as of the last snapshot;
* ``keys.PREDICTIONS`` (hash) — session id -> ``PredictionRecord`` JSON (what readers use);
* ``keys.READINESS_CHANNEL`` — ``PredictionRecord`` JSON on every readiness change;
* ``keys.epoch_key("predictor")`` — the live epoch, re-asserted by every write.

Invariant: state + history as of the last snapshot, with the log replayed on top, equal the
in-memory core as of the last successful write. A snapshot replaces the log atomically
(``DEL log`` in the same transaction), so a restart loads the snapshot and replays the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis.asyncio as aioredis

from services.common import keys
from services.common.redis_client import publish_in, reload_slots, transaction

LOG = f"{keys.PREFIX}:predictor:log"
STATE = f"{keys.PREFIX}:predictor:state"
EPOCH = keys.epoch_key("predictor")


@dataclass
class Snapshot:
    states: dict[str, str | None] = field(default_factory=dict)  # None = delete
    history: dict[str, str] = field(default_factory=dict)
    history_deleted: set[str] = field(default_factory=set)

    def merge_older(self, older: Snapshot) -> None:
        """Fold in a snapshot that failed to write; values already here are newer."""
        for sid, st in older.states.items():
            self.states.setdefault(sid, st)
        for k, v in older.history.items():
            if k not in self.history_deleted:
                self.history.setdefault(k, v)
        self.history_deleted |= {k for k in older.history_deleted if k not in self.history}


@dataclass
class WriteBatch:
    log: list[str] = field(default_factory=list)
    predictions: dict[str, str] = field(default_factory=dict)
    predictions_deleted: set[str] = field(default_factory=set)
    publish: list[str] = field(default_factory=list)
    snapshot: Snapshot | None = None

    @property
    def empty(self) -> bool:
        return not (self.log or self.predictions or self.predictions_deleted or self.publish or self.snapshot)


@dataclass
class Loaded:
    states: dict[str, str]
    history: dict[str, str]
    log: list[str]


# The common write (log + records + publishes, epoch checked) in one round trip. Arguments:
# epoch, channel, then for RPUSH log / HSET records / HDEL records / PUBLISH: a count and
# that many values. unpack() is limited to a few thousand values: chunks of 1000.
_APPEND_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local function chunked(cmd, key, from, count)
  local j = from
  while j < from + count do
    local last = math.min(j + 999, from + count - 1)
    redis.call(cmd, key, unpack(ARGV, j, last))
    j = last + 1
  end
end
local i = 3
local n = tonumber(ARGV[i]); i = i + 1
if n > 0 then chunked('RPUSH', KEYS[2], i, n) end; i = i + n
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then chunked('HSET', KEYS[3], i, n) end; i = i + n
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then chunked('HDEL', KEYS[3], i, n) end; i = i + n
n = tonumber(ARGV[i]); i = i + 1
for j = i, i + n - 1 do redis.call('PUBLISH', ARGV[2], ARGV[j]) end
return 1
"""


class PredictorStore:
    """``wait_replicas`` > 0: a write counts only once that many replicas have it (``WAIT``), so an
    acknowledged event survives a Sentinel failover (docs/architecture.md#redis-cluster-and-sentinel)."""

    def __init__(self, redis: aioredis.Redis, epoch: str, wait_replicas: int = 0, wait_timeout_s: float = 1.0) -> None:
        self.redis = redis
        self.epoch = epoch
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = max(1, round(wait_timeout_s * 1000))
        self._append = redis.register_script(_APPEND_LUA)

    async def _replicated(self) -> None:
        if self.wait_replicas > 0:
            got = int(await self.redis.wait(self.wait_replicas, self.wait_timeout_ms))
            if got < self.wait_replicas:
                raise NotReplicated(f"the write reached {got} of {self.wait_replicas} replicas")

    async def load(self) -> Loaded:
        async with await transaction(self.redis) as pipe:  # Cluster-safe (redis_client.transaction)
            await reload_slots(self.redis)  # entering the pipeline awaited: a reload may be due again
            pipe.hgetall(STATE)
            pipe.hgetall(keys.PREDICTOR_HISTORY)
            pipe.lrange(LOG, 0, -1)
            states, history, log = await pipe.execute()
        return Loaded(dict(states), dict(history), list(log))

    async def write(self, batch: WriteBatch, check_epoch: bool) -> None:
        """Apply ``batch`` atomically (MULTI/EXEC); raises RedisError/OSError on failure.

        With ``check_epoch`` the write happens only if the epoch key still holds our epoch
        (a Lua script, or ``WATCH`` for snapshots, makes it atomic); otherwise ``EpochLost``
        is raised and nothing is written:
        Redis lost our data (restart, FLUSHALL) and appending to it would leave a log without
        its snapshot. The caller then writes a full snapshot with ``check_epoch=False``.
        """
        if check_epoch and batch.snapshot is None:
            args: list[str] = [self.epoch, keys.READINESS_CHANNEL, str(len(batch.log)), *batch.log]
            args.append(str(2 * len(batch.predictions)))
            for field_, value in batch.predictions.items():
                args += (field_, value)
            args += [str(len(batch.predictions_deleted)), *batch.predictions_deleted]
            args += [str(len(batch.publish)), *batch.publish]
            if not await self._append(keys=[EPOCH, LOG, keys.PREDICTIONS], args=args):
                raise EpochLost("the predictor's keys are gone from Redis")
            await self._replicated()
            return
        async with await transaction(self.redis) as pipe:  # Cluster-safe (redis_client.transaction)
            await reload_slots(self.redis)  # entering the pipeline awaited: a reload may be due again
            if check_epoch:
                await pipe.watch(EPOCH)
                if await pipe.get(EPOCH) != self.epoch:
                    raise EpochLost("the predictor's keys are gone from Redis")
                pipe.multi()  # type: ignore[no-untyped-call]
                await reload_slots(self.redis)  # the awaits above may have let a reload fall due
            snap = batch.snapshot
            if snap is not None:
                live = {k: v for k, v in snap.states.items() if v is not None}
                gone = [k for k, v in snap.states.items() if v is None]
                if live:
                    pipe.hset(STATE, mapping=live)  # type: ignore[arg-type]
                if gone:
                    pipe.hdel(STATE, *gone)
                if snap.history:
                    pipe.hset(keys.PREDICTOR_HISTORY, mapping=snap.history)  # type: ignore[arg-type]
                if snap.history_deleted:
                    pipe.hdel(keys.PREDICTOR_HISTORY, *snap.history_deleted)
                pipe.delete(LOG)
            elif batch.log:
                pipe.rpush(LOG, *batch.log)
            if batch.predictions:
                pipe.hset(keys.PREDICTIONS, mapping=batch.predictions)  # type: ignore[arg-type]
            if batch.predictions_deleted:
                pipe.hdel(keys.PREDICTIONS, *batch.predictions_deleted)
            pipe.set(EPOCH, self.epoch)
            publish_in(pipe, EPOCH, keys.READINESS_CHANNEL, list(batch.publish))  # Cluster pipelines refuse PUBLISH
            await pipe.execute()
        await self._replicated()

    async def epoch_present(self) -> bool:
        """False after Redis lost our data (restart without persistence, FLUSHALL)."""
        return bool(await self.redis.get(EPOCH) == self.epoch)


class EpochLost(RuntimeError):
    """Redis no longer holds this writer's epoch: its data is gone."""


class NotReplicated(RuntimeError):
    """The write is on the master but fewer replicas than required confirmed it in time: it may
    be lost in a failover, so it is not acknowledged; the caller rewrites its whole state."""
