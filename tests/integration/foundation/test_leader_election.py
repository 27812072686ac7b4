"""Active/standby planner and budget service on one real redis-server
(docs/architecture.md#high-availability): one leader publishes; a standby takes over within
2 x the lease after the leader is SIGKILLed (and at once after a clean stop) under a higher term;
a deposed leader that still believes it leads cannot overwrite its successor, and the router's
feed rejects its plans."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
import redis.asyncio as aioredis
import structlog

from services.budget.convert import BudgetAllocationRecord
from services.budget.server import BudgetApp
from services.budget.settings import Settings as BudgetSettings
from services.budget.settings import TenantSpec
from services.common import keys
from services.common.core.lease import epoch_term, term_epoch
from services.common.errors import Unavailable
from services.common.lease import RedisLease
from services.common.records import load
from services.common.settings import load_settings
from services.common.testing import free_port, health_status, serve_in_process
from services.planner.convert import PlannerPlanRecord
from services.planner.server import PlannerApp
from services.planner.settings import Settings as PlannerSettings
from services.router.feeds import FencedFeed
from tao.budget.v1 import budget_pb2, budget_pb2_grpc

TAO = [sys.executable, "-m", "services.cli"]
PLANNER = "tao.planner.v1.PlannerService"
BUDGET = "tao.budget.v1.BudgetService"


async def _until(predicate: object, timeout_s: float, what: str, step_s: float = 0.02) -> float:
    """Poll an async predicate until true; returns the monotonic time it became true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return time.monotonic()
        await asyncio.sleep(step_s)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _planner_settings(redis_url: str, ttl_s: float) -> PlannerSettings:
    return load_settings(PlannerSettings, redis_url=redis_url, port=0, redis_startup_timeout_s=2.0,
                         lease_ttl_s=ttl_s, tick_s=0.2)


async def test_planner_failover_after_sigkill_is_within_two_leases(redis_url: str,
                                                                   redis_client: aioredis.Redis) -> None:
    ttl_s = 1.5
    ports = [free_port(), free_port()]
    env = {**os.environ, "TAO_PLANNER_LEASE_TTL_S": str(ttl_s), "TAO_PLANNER_TICK_S": "0.2",
           "TAO_PLANNER_LOG_LEVEL": "warning"}
    procs = {port: await asyncio.create_subprocess_exec(
        *TAO, "serve", "planner", "--port", str(port), "--redis-url", redis_url,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env) for port in ports}
    try:
        statuses: dict[int, str] = {}

        async def one_leader() -> bool:
            for port in ports:
                statuses[port] = await health_status(f"127.0.0.1:{port}", PLANNER, timeout_s=0.5)
            overall = [await health_status(f"127.0.0.1:{p}", timeout_s=0.5) for p in ports]
            return (sorted(statuses.values()) == ["NOT_SERVING", "SERVING"] and overall == ["SERVING", "SERVING"]
                    and bool(await redis_client.exists(keys.PLAN)))

        await _until(one_leader, 40.0, "two planners up, exactly one leading (health of PlannerService) and "
                     "its first plan published", 0.1)
        leader = next(p for p, s in statuses.items() if s == "SERVING")
        standby = next(p for p in ports if p != leader)
        first = await redis_client.get(keys.epoch_key("planner"))
        assert first is not None and epoch_term(str(first)) is not None

        procs[leader].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.wait_for(procs[leader].wait(), 10)

        async def new_term_published() -> bool:
            live = await redis_client.get(keys.epoch_key("planner"))
            raw = await redis_client.get(keys.PLAN)
            if live is None or raw is None or live == first:
                return False
            plan = load(PlannerPlanRecord, raw)
            return plan.epoch == live and (epoch_term(str(live)) or 0) > (epoch_term(str(first)) or 0)

        published_at = await _until(new_term_published, 4 * ttl_s, "the standby publishes under a new term")
        failover_s = published_at - killed_at
        print(f"planner failover after SIGKILL: {failover_s:.2f} s (lease {ttl_s} s)")
        assert failover_s <= 2 * ttl_s
        await _until(lambda: _is(f"127.0.0.1:{standby}", PLANNER, "SERVING"), 3.0, "the new leader's health")
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def _is(address: str, service: str, status: str) -> bool:
    return await health_status(address, service, timeout_s=0.5) == status


async def test_a_deposed_planner_cannot_overwrite_its_successor_and_routers_reject_its_plans(
        redis_url: str, redis_client: aioredis.Redis) -> None:
    a, b = PlannerApp(_planner_settings(redis_url, 1.0)), PlannerApp(_planner_settings(redis_url, 1.0))
    async with serve_in_process("planner", a, _planner_settings(redis_url, 1.0)):
        assert a.lease is not None and a.service is not None and a.lease.is_leader()
        await _until(lambda: _has(redis_client, keys.PLAN), 5.0, "the first leader publishes")
        old_raw = await redis_client.get(keys.PLAN)
        assert old_raw is not None
        old = load(PlannerPlanRecord, old_raw)
        async with serve_in_process("planner", b, _planner_settings(redis_url, 1.0)):
            assert b.lease is not None and b.service is not None and not b.lease.is_leader()
            # A stalls (a long GC pause, a frozen VM): it stops renewing and planning, and its
            # clock lies, so that it still believes it leads when it wakes up
            await a.service.stop()
            assert a.lease._task is not None
            a.lease._task.cancel()
            await _until(lambda: _true(b.lease is not None and b.lease.is_leader()), 3.0, "B takes over")
            await _until(lambda: _plan_epoch_is(redis_client, b.service.epoch if b.service else ""), 3.0,
                         "B publishes")
            a.lease.core.valid_until = math.inf
            assert a.lease.is_leader()
            new_raw = await redis_client.get(keys.PLAN)
            live = await redis_client.get(keys.epoch_key("planner"))
            assert live == b.service.epoch and (epoch_term(str(live)) or 0) > (epoch_term(old.epoch) or 0)
            # the late round: solved, then refused by Redis (the token no longer matches)
            assert await a.service.plan_once() is None
            assert await redis_client.get(keys.epoch_key("planner")) == live
            assert await redis_client.get(keys.PLAN) in (new_raw, await redis_client.get(keys.PLAN))
            assert load(PlannerPlanRecord, await redis_client.get(keys.PLAN) or "").epoch == live
            assert not a.lease.is_leader()  # the refusal deposed it locally too
            # a router following plans applies B's and rejects A's (e.g. a message delayed in flight)
            applied: list[PlannerPlanRecord] = []
            feed = FencedFeed(redis_client, writer="planner", key=keys.PLAN, channel=keys.PLAN_CHANNEL,
                              record=PlannerPlanRecord, apply=applied.append, poll_s=1.0,
                              log=structlog.get_logger("test"))
            await feed.read_key()
            assert [p.epoch for p in applied] == [live]
            assert not await feed.consider(old_raw)
            late = old.model_copy(update={"rev": old.rev + 1000})
            assert not await feed.consider(late.model_dump_json())
            assert feed.rejected == 2 and len(applied) == 1


async def _true(value: bool) -> bool:
    return value


async def _has(client: aioredis.Redis, key: str) -> bool:
    return bool(await client.exists(key))


async def _plan_epoch_is(client: aioredis.Redis, epoch: str) -> bool:
    raw = await client.get(keys.PLAN)
    return raw is not None and load(PlannerPlanRecord, raw).epoch == epoch


def _budget_settings(redis_url: str) -> BudgetSettings:
    return load_settings(BudgetSettings, redis_url=redis_url, port=0, redis_startup_timeout_s=2.0, lease_ttl_s=1.0,
                         tick_s=0.2, total_budget=8, tenants=[TenantSpec(name="a"), TenantSpec(name="b")])


async def test_budget_standby_refuses_writes_and_takes_over_at_once_after_a_clean_stop(
        redis_url: str, redis_client: aioredis.Redis) -> None:
    a, b = BudgetApp(_budget_settings(redis_url)), BudgetApp(_budget_settings(redis_url))
    async with serve_in_process("budget", a, _budget_settings(redis_url)) as ra:
        assert a.service is not None and a.lease is not None and a.lease.is_leader()
        async with grpc.aio.insecure_channel(ra.address) as channel:
            await budget_pb2_grpc.BudgetServiceStub(channel).ConfigureTenants(budget_pb2.ConfigureTenantsRequest(
                total_budget=12, tenants=[budget_pb2.TenantConfig(name="x", weight=1.0)]), timeout=5)
        first = await redis_client.get(keys.epoch_key("budget"))
        async with serve_in_process("budget", b, _budget_settings(redis_url)) as rb:
            assert b.service is not None and b.lease is not None and not b.lease.is_leader()
            assert await b.service.tick_once() is None  # a standby computes and writes nothing
            with pytest.raises(Unavailable):
                await b.service.set_policy("static")
            async with grpc.aio.insecure_channel(rb.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await budget_pb2_grpc.BudgetServiceStub(channel).ConfigureTenants(
                        budget_pb2.ConfigureTenantsRequest(total_budget=3, tenants=[budget_pb2.TenantConfig(name="y")]),
                        timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            await _until(lambda: _is(rb.address, BUDGET, "NOT_SERVING"), 3.0, "standby: BudgetService NOT_SERVING")
            assert await health_status(rb.address) == "SERVING"  # the process itself is healthy
            await ra.stop(grace_s=0.2)  # a clean stop releases the lease
            stopped_at = time.monotonic()

            async def b_published() -> bool:
                raw = await redis_client.get(keys.ALLOCATION)
                live = await redis_client.get(keys.epoch_key("budget"))
                return raw is not None and live != first and load(BudgetAllocationRecord, raw).epoch == live

            took_over = await _until(b_published, 3.0, "B publishes after A's clean stop")
            print(f"budget takeover after a clean stop: {took_over - stopped_at:.2f} s")
            assert took_over - stopped_at <= 1.0  # the next acquire attempt (ttl/3), not a whole ttl
            live = await redis_client.get(keys.epoch_key("budget"))
            assert live is not None and first is not None
            assert (epoch_term(str(live)) or 0) > (epoch_term(str(first)) or 0)
            # B resumed A's configuration from Redis, not its own settings (total 8, tenants a, b)
            assert b.service.config is not None and b.service.config.total == 12
            assert list(b.service.config.names) == ["x"]
            await _until(lambda: _is(rb.address, BUDGET, "SERVING"), 3.0, "leader: BudgetService SERVING")


async def test_lease_terms_mutual_exclusion_and_fenced_writes(redis_client: aioredis.Redis) -> None:
    now = [0.0]
    log = structlog.get_logger("test")
    a = RedisLease(redis_client, "probe", ttl_s=1.0, process_epoch="aaaa", log=log, monotonic=lambda: now[0])
    b = RedisLease(redis_client, "probe", ttl_s=1.0, process_epoch="bbbb", log=log, monotonic=lambda: now[0])
    await a.step()
    await b.step()
    assert a.is_leader() and not b.is_leader() and a.epoch == term_epoch(1, "aaaa")
    assert await a.write([(keys.epoch_key("probe"), a.epoch)], [("probe-channel", "x")])
    assert not await b.write([(keys.epoch_key("probe"), b.epoch)])  # a standby never writes
    # A stalls past its TTL (the key expires in Redis) and no one takes over: it wins the lease
    # back in the same term, so its epoch and revisions just continue
    await redis_client.delete(keys.lease_key("probe"))
    now[0] = 0.5
    await a.step()  # the renew finds the key gone: deposed ...
    assert not a.is_leader()
    await a.step()  # ... and re-acquires at once, same term
    assert a.is_leader() and a.core.term == 1 and a.epoch == term_epoch(1, "aaaa")
    # A dies without releasing: B takes over after the TTL under a higher term
    await redis_client.pexpire(keys.lease_key("probe"), 1)
    await _until(lambda: _not(_has(redis_client, keys.lease_key("probe"))), 2.0, "the key expires")
    now[0] = 10.0
    await b.step()
    assert b.is_leader() and b.core.term == 2 and b.epoch == term_epoch(2, "bbbb")
    # A, still believing it leads (its clock lies), is refused by Redis and steps down
    a.core.valid_until = math.inf
    assert not await a.write([(keys.epoch_key("probe"), a.epoch)])
    assert not a.is_leader() and await redis_client.get(keys.epoch_key("probe")) == term_epoch(1, "aaaa")
    assert await b.write([(keys.epoch_key("probe"), b.epoch)])
    await a.stop()  # releasing a lease it does not hold deletes nothing
    assert await redis_client.get(keys.lease_key("probe")) == b.token
    await b.stop()
    assert not await redis_client.exists(keys.lease_key("probe"))


async def _not(awaitable: object) -> bool:
    return not await awaitable  # type: ignore[misc]
