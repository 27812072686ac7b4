"""Following another service's published record (plans from the planner, caps from the
budget service) with epoch fencing (docs/architecture.md#epoch-and-revision-fencing,
``services.common.epoch``).

A feed subscribes to the writer's channel and reads the latest value from its key at start,
after every reconnect and whenever the channel has been quiet for ``poll_s`` (so a missed
message or a wiped Redis costs at most one poll). A value is applied only when its epoch is
the writer's live epoch (``tao:<writer>:epoch``) and its revision is newer than the last
applied one; anything else is counted and dropped. Redis trouble never stops the feed: it
reconnects with backoff and the last applied value stays in force.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import reraise_if_cancelling, stop_tasks
from services.common.epoch import Stamp, StampFence
from services.common.records import Record, RecordError, load

R = TypeVar("R", bound=Record)


class FencedFeed(Generic[R]):
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        writer: str,
        key: str,
        channel: str,
        record: type[R],
        apply: Callable[[R], None],
        seen: Callable[[R], None] | None = None,
        poll_s: float,
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._redis = redis
        self.writer = writer
        self._key = key
        self._channel = channel
        self._record = record
        self._apply = apply
        self._seen = seen
        self._poll_s = poll_s
        self._log = log
        self.fence = StampFence()
        self.applied = 0
        self.rejected = 0
        self.invalid = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.read_key()
        self._task = asyncio.create_task(self._run(), name=f"router-feed-{self.writer}")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task])

    async def read_key(self) -> None:
        try:
            raw = await self._redis.get(self._key)
        except (RedisError, OSError):
            reraise_if_cancelling()
            return
        if raw is not None:
            await self.consider(raw)

    async def consider(self, raw: str | bytes) -> bool:
        """Fence and apply one published value; True when applied."""
        try:
            rec = load(self._record, raw)
        except RecordError as exc:
            self.invalid += 1
            self._log.warning("invalid published value", writer=self.writer, error=str(exc))
            return False
        live: str | None
        try:
            raw_live = await self._redis.get(keys.epoch_key(self.writer))
            live = raw_live.decode() if isinstance(raw_live, bytes) else raw_live
        except (RedisError, OSError):
            reraise_if_cancelling()
            live = None
        if live is not None and rec.epoch == live and self._seen is not None:
            self._seen(rec)
        stamp = Stamp(rec.epoch, rec.rev)
        if not self.fence.admits(stamp, live):
            self.rejected += 1
            return False
        self.fence.mark(stamp)
        self.applied += 1
        self._apply(rec)
        return True

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                try:
                    await pubsub.subscribe(self._channel)
                    await self.read_key()
                    backoff = 0.1
                    while True:
                        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._poll_s)
                        if msg is not None and msg.get("type") == "message":
                            await self.consider(msg["data"])
                        else:
                            await self.read_key()
                finally:
                    with contextlib.suppress(RedisError, OSError):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
            except (RedisError, OSError) as exc:
                reraise_if_cancelling()
                self._log.warning("feed reconnecting", writer=self.writer, error=str(exc).splitlines()[0])
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
