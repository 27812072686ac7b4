"""Router state in Redis: pool-change notifications, epoch/revision on every record, serving
through a Redis outage, republishing after Redis comes back empty, restoring sessions after
a router restart."""

from __future__ import annotations

import asyncio

import aiohttp
from router_harness import MODEL, start_router, wait_for

from services.common import keys
from services.common.records import ReplicaRecord, SessionRecord, load
from services.common.testing import RedisServer
from services.sim.vllm_sim.server import RunningSim

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "plan the change " * 20}], "max_tokens": 3}


async def test_pool_changes_are_published_and_records_carry_epoch(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [sims[0].base_url]) as router, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        pubsub = router.redis.pubsub()
        await pubsub.subscribe(keys.POOL_CHANNEL)
        await pubsub.get_message(timeout=1.0)  # subscribe confirmation
        async with http.post(router.url + "/v1/chat/completions", json=BODY, headers={"x-session-id": "p1"}) as r:
            assert r.status == 200
        seen = set()
        for _ in range(20):
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if msg:
                seen.add(msg["data"])
            if "p1" in seen:
                break
        await pubsub.aclose()
        assert "p1" in seen
        await router.flushed()
        assert await router.redis.get(keys.epoch_key("router")) == router.rt.ctx.epoch
        replica = load(ReplicaRecord, await router.redis.hget(keys.REPLICAS, next(iter(router.rt.core.replicas))))
        assert replica.epoch == router.rt.ctx.epoch and replica.healthy and replica.kv_capacity_tokens > 0
        assert replica.capacity_tokens == int(replica.kv_capacity_tokens * 0.95)
        assert replica.used_tokens == router.rt.core.sessions["p1"].footprint_tokens


async def test_serves_through_a_redis_outage_and_republishes(redis_proc: RedisServer, sims: list[RunningSim]) -> None:
    async with start_router(redis_proc.url, [sims[0].base_url], resync_interval_s=0.2) as router, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        url = router.url + "/v1/chat/completions"
        async with http.post(url, json=BODY, headers={"x-session-id": "keep"}) as r:
            assert r.status == 200
        redis_proc.kill()
        for _ in range(3):  # admitted session: the hot path does not need Redis
            async with http.post(url, json=BODY, headers={"x-session-id": "keep"}) as r:
                assert r.status == 200
        await asyncio.to_thread(redis_proc.start)  # back, empty
        await wait_for(lambda: router.rt.store.flushes > 0, "store flushing")

        async def republished() -> bool:
            raw = await router.redis.hget(keys.SESSIONS, "keep")
            return raw is not None and load(SessionRecord, raw).requests == 4

        deadline = asyncio.get_running_loop().time() + 15
        while not await _safe(republished()):
            assert asyncio.get_running_loop().time() < deadline, "session not republished after Redis restart"
            await asyncio.sleep(0.1)


async def _safe(check: object) -> bool:
    try:
        return bool(await check)  # type: ignore[misc]
    except Exception:
        return False


async def test_sessions_survive_a_router_restart(redis_url: str, sims: list[RunningSim]) -> None:
    urls = [s.base_url for s in sims]
    async with start_router(redis_url, urls) as router, aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(router.url + "/v1/chat/completions", json=BODY,
                                 headers={"x-session-id": "long-lived"}) as r:
                assert r.status == 200
                placed = r.headers["x-tao-replica"]
        first_epoch = router.rt.ctx.epoch
    async with start_router(redis_url, urls) as router, aiohttp.ClientSession() as http:
        s = router.rt.core.sessions["long-lived"]
        assert s.tokens.requests == 2 and s.admitted and s.replica == placed and s.cache
        async with http.post(router.url + "/v1/chat/completions", json=BODY,
                             headers={"x-session-id": "long-lived"}) as r:
            assert r.status == 200 and r.headers["x-tao-replica"] == placed
        await router.flushed()
        record = load(SessionRecord, await router.redis.hget(keys.SESSIONS, "long-lived"))
        assert record.epoch == router.rt.ctx.epoch != first_epoch and record.requests == 3
