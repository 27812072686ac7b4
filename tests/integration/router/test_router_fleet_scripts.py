"""The router fleet's Lua scripts (services/common/fleet.py) on a real redis-server and on a real
3-master Redis Cluster: membership, session claims with fencing revisions and takeover,
fenced session writes, admission slots (Σ held <= cap under random operations, a dead
router's slots reclaimed) and the live epochs the planner and the budget service read."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from services.common import keys
from services.common.fleet import ADOPT, CLAIM, FENCED_SESSIONS, JOIN, LIVE_EPOCHS, RENEW, SLOTS
from services.common.redis_client import make_redis
from services.common.settings import load_settings
from services.common.testing import RedisClusterProcs
from services.router.settings import Settings


@pytest.fixture(params=["single", "cluster"])
async def redis(request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis]:
    if request.param == "single":
        url = request.getfixturevalue("redis_url")
    else:
        cluster: RedisClusterProcs = request.getfixturevalue("redis_cluster")
        url = cluster.url
    client = make_redis(load_settings(Settings, redis_url=url))
    try:
        yield client
    finally:
        await client.aclose()


async def join(r: aioredis.Redis, rid: str, ttl_ms: int, term: int = 0, url: str = "") -> int:
    return int(await r.eval(JOIN, 5, keys.ROUTER_ALIVE, keys.ROUTER_MEMBERS, keys.ROUTER_EPOCHS,
                            keys.term_key("router"), keys.DEMAND, rid, ttl_ms, url or f"http://{rid}", f"p-{rid}", term))


async def claim(r: aioredis.Redis, sid: str, rid: str, settled: bool = True) -> list[object]:
    return list(await r.eval(CLAIM, 4, keys.SESSION_OWNERS, keys.ROUTER_ALIVE, keys.ROUTER_MEMBERS,
                             keys.SESSIONS, sid, rid, "1" if settled else "0"))


async def slots(r: aioredis.Redis, tenant: str, rid: str, want: int, cap: int) -> tuple[int, int, int]:
    out = await r.eval(SLOTS, 2, keys.slots_key(tenant), keys.ROUTER_ALIVE, rid, want, cap)
    return int(out[0]), int(out[1]), int(out[2])


async def wait_dead(r: aioredis.Redis, rid: str) -> None:
    """Until ``rid``'s lease deadline (Redis TIME) has passed."""
    for _ in range(500):
        score = await r.zscore(keys.ROUTER_ALIVE, rid)
        sec, usec = await r.time()
        if score is None or score <= sec * 1000 + usec // 1000:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{rid} never expired")


async def test_membership_claims_takeover_and_fenced_writes(redis: aioredis.Redis) -> None:
    t_a = await join(redis, "a", 60_000)
    t_b = await join(redis, "b", 300)
    assert t_b == t_a + 1 and await join(redis, "a", 60_000, term=t_a) == t_a  # a live member keeps its term
    member = json.loads(await redis.hget(keys.ROUTER_MEMBERS, "b"))
    assert member["url"] == "http://b" and member["epoch"] == f"{t_b:012d}-p-b"
    assert sorted(await redis.eval(LIVE_EPOCHS, 2, keys.ROUTER_ALIVE, keys.ROUTER_EPOCHS)) == sorted(
        [f"{t_a:012d}-p-a", f"{t_b:012d}-p-b"])

    assert await claim(redis, "s1", "b") == [2, 1, ""]  # new session: b owns it, revision 1
    assert await claim(redis, "s1", "b") == [1, 1]
    assert await claim(redis, "s1", "a") == [0, 1, "b", await redis.hget(keys.ROUTER_MEMBERS, "b")]
    # b writes its record under its token; a's write with a forged token is refused
    written = await redis.eval(FENCED_SESSIONS, 2, keys.SESSIONS, keys.SESSION_OWNERS, 1, "s1", "1 b", '{"v": 1}')
    assert written == [] and await redis.hget(keys.SESSIONS, "s1") == '{"v": 1}'
    refused = await redis.eval(FENCED_SESSIONS, 2, keys.SESSIONS, keys.SESSION_OWNERS, 1, "s1", "1 a", '{"v": 2}')
    assert refused == ["s1"] and await redis.hget(keys.SESSIONS, "s1") == '{"v": 1}'

    await wait_dead(redis, "b")  # b stops renewing: a takes s1 over with revision 2 and its record
    # ... but not while a is unsettled (just rejoined, as every router after a Redis outage)
    assert await claim(redis, "s1", "a", settled=False) == [3, 1, "b"]
    assert await redis.hget(keys.SESSION_OWNERS, "s1") == "1 b"
    assert await claim(redis, "s1", "a") == [2, 2, '{"v": 1}']
    assert await redis.eval(RENEW, 1, keys.ROUTER_ALIVE, "b", 300) == 0  # a lapsed lease is not renewed
    assert await claim(redis, "s1", "b") == [-1]  # nor may a dead router claim
    t_b2 = await join(redis, "b", 60_000, term=t_b)
    assert t_b2 > t_b  # rejoining after a lapse is a new term (a new writer epoch)
    assert await claim(redis, "s1", "b") == [0, 2, "a", await redis.hget(keys.ROUTER_MEMBERS, "a")]
    # the deposed owner's late write (its old token) is refused; the owner's delete ends the session
    late = await redis.eval(FENCED_SESSIONS, 2, keys.SESSIONS, keys.SESSION_OWNERS, 1, "s1", "1 b", '{"v": 9}')
    assert late == ["s1"]
    ended = await redis.eval(FENCED_SESSIONS, 2, keys.SESSIONS, keys.SESSION_OWNERS, 0, "s1", "2 a")
    assert ended == [] and not await redis.hexists(keys.SESSIONS, "s1")
    assert not await redis.hexists(keys.SESSION_OWNERS, "s1")
    # sessions of a dead router are adopted in batches, even without a request for them
    await join(redis, "c", 200)
    for sid in ("o1", "o2", "o3"):
        assert (await claim(redis, sid, "c"))[0] == 2
    await redis.hset(keys.SESSIONS, "o1", '{"v": "o1"}')
    assert await redis.eval(ADOPT, 3, keys.SESSION_OWNERS, keys.ROUTER_ALIVE, keys.SESSIONS, "a", 10) == []
    await wait_dead(redis, "c")
    first = await redis.eval(ADOPT, 3, keys.SESSION_OWNERS, keys.ROUTER_ALIVE, keys.SESSIONS, "a", 2)
    rest = await redis.eval(ADOPT, 3, keys.SESSION_OWNERS, keys.ROUTER_ALIVE, keys.SESSIONS, "b", 10)
    assert len(first) == 6 and len(rest) == 3
    adopted = {first[0]: first[1:3], first[3]: first[4:6], rest[0]: rest[1:3]}
    assert adopted["o1"] == [2, '{"v": "o1"}'] and adopted["o2"][0] == 2 and adopted["o3"][1] == ""
    assert await redis.hget(keys.SESSION_OWNERS, rest[0]) == "2 b"
    # a dead router's demand fields go when the next router joins; a live router's stay
    await redis.hset(keys.DEMAND, mapping={"t1@c": "{}", "t2@c": "{}", "t1@a": "{}", "t1@cc": "{}"})
    await join(redis, "d", 60_000)
    assert sorted(await redis.hkeys(keys.DEMAND)) == ["t1@a", "t1@cc"]  # c is dead; "cc" never joined, kept


async def test_slots_never_exceed_the_cap_and_a_dead_routers_slots_return(redis: aioredis.Redis) -> None:
    rng = random.Random(7)
    routers = ["r0", "r1", "r2"]
    for rid in routers:
        await join(redis, rid, 60_000)
    cap = 5
    held = dict.fromkeys(routers, 0)
    for _ in range(300):
        rid = rng.choice(routers)
        if rng.random() < 0.15:
            cap = rng.randint(0, 8)  # the budget moves the cap
        want = rng.randint(0, 6)
        prev = held[rid]
        n, others, _ = await slots(redis, "T", rid, want, cap)
        assert n <= want or n == prev  # never more than asked (unless keeping what it held)
        if want > prev:
            assert n >= prev  # asking for more never takes slots away
        held[rid] = n
        stored = {k: int(v) for k, v in (await redis.hgetall(keys.slots_key("T"))).items() if not k.startswith("~")}
        assert stored == {r: h for r, h in held.items() if h}
        if n > prev:  # whenever an allotment grows, Σ allotments is within the cap
            assert sum(held.values()) <= cap
    # Σ held <= cap once everyone has settled under a fixed cap
    for rid in routers:
        held[rid] = (await slots(redis, "T", rid, 0, 4))[0]
    for rid in routers:
        held[rid] = (await slots(redis, "T", rid, 3, 4))[0]
    assert sum(held.values()) == 4 and max(held.values()) == 3
    n, others, waiters = await slots(redis, "T", "r2", 3, 4)
    assert n == held["r2"] and waiters >= 1  # the others are waiting for slots
    # r0 dies: its slots come back to the live routers
    await join(redis, "dead", 200)
    assert (await slots(redis, "T", "dead", 0, 4))[0] == 0
    dead_rid = max(held, key=lambda r: held[r])
    await redis.zadd(keys.ROUTER_ALIVE, {dead_rid: 0})  # its lease deadline passed
    other = next(r for r in routers if r != dead_rid)
    n, others, _ = await slots(redis, "T", other, 4, 4)
    assert n + others <= 4 and n == 4 - others and dead_rid not in await redis.hgetall(keys.slots_key("T"))
