"""The budget service over real gRPC and a real Redis, ticked on a virtual clock."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis

from services.budget.convert import BudgetAllocationRecord
from services.budget.server import BudgetApp, Settings
from services.common import keys
from services.common.clock import VirtualClock
from services.common.records import BudgetConfigRecord, TenantDemandRecord, load
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from tao.budget.v1 import budget_pb2, budget_pb2_grpc

ROUTER_EPOCH = "router-epoch-1"
#: the controller without burst reserve or gap lending (the budget-controller study's): an idle
#: tenant donates at once, which is what the drain and resume mechanics below exercise
V0: dict[str, Any] = {"burst_reserve_frac": 0.0, "lend_horizon_s": 0.0}


class Harness:
    def __init__(self, redis_url: str, clock: VirtualClock, **overrides: Any) -> None:
        self.settings = load_settings(Settings, redis_url=redis_url, port=0, redis_startup_timeout_s=2.0,
                                      **overrides)
        self.clock = clock
        self.app = BudgetApp(self.settings, clock=clock, to_unix=lambda t: t, autotick=False)
        self.redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        self._rev = 0

    async def demand(self, **tenants: tuple[int, int]) -> None:
        """Write router demand records: tenant=(waiting, in_flight), as of now."""
        await self.redis.set(keys.epoch_key("router"), ROUTER_EPOCH)
        mapping = {}
        for name, (waiting, in_flight) in tenants.items():
            self._rev += 1
            mapping[name] = TenantDemandRecord(epoch=ROUTER_EPOCH, rev=self._rev, tenant=name, waiting=waiting,
                                               in_flight=in_flight, updated_at_unix_s=self.clock.now()).model_dump_json()
        await self.redis.hset(keys.DEMAND, mapping=mapping)

    async def tick(self) -> dict[str, int]:
        self.clock.advance(self.settings.tick_s)
        assert self.app.service is not None
        alloc = await self.app.service.tick_once()
        assert alloc is not None
        return dict(alloc.caps)


@pytest.fixture
async def harness(redis_url: str) -> AsyncIterator[Harness]:
    h = Harness(redis_url, VirtualClock(time.time()), **V0)
    yield h
    await h.redis.aclose()


def _config(total: int = 96, *tenants: tuple[str, int, float]) -> budget_pb2.ConfigureTenantsRequest:
    tenants = tenants or (("A", 4, 1.0), ("B", 4, 1.0))
    return budget_pb2.ConfigureTenantsRequest(
        total_budget=total, tenants=[budget_pb2.TenantConfig(name=n, floor=f, weight=w) for n, f, w in tenants])


async def test_demand_moves_caps_within_two_ticks_and_sum_stays_b(harness: Harness) -> None:
    async with serve_in_process("budget", harness.app, harness.settings) as running, \
            grpc.aio.insecure_channel(running.address) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetAllocation(budget_pb2.GetAllocationRequest())
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        first = (await stub.ConfigureTenants(_config())).allocation
        assert dict(first.caps) == {"A": 48, "B": 48} and first.total == 96
        watch = stub.WatchAllocations(budget_pb2.WatchAllocationsRequest(include_current=True))
        assert (await watch.read()).allocation.revision.revision == first.revision.revision

        await harness.demand(A=(0, 0), B=(500, 48))  # A idle, B with a backlog
        seen = [await harness.tick(), await harness.tick()]
        assert all(sum(c.values()) == 96 for c in seen)
        assert seen[0]["B"] > 48 and seen[1] == {"A": 4, "B": 92}
        got = (await stub.GetAllocation(budget_pb2.GetAllocationRequest())).allocation
        assert dict(got.caps) == {"A": 4, "B": 92} and got.revision.epoch == first.revision.epoch
        assert any(d.kind == "move" and d.to_tenant == "B" and d.from_tenant == "A" for d in got.decisions)
        streamed = [(await watch.read()).allocation for _ in range(2)]
        assert [dict(a.caps) for a in streamed] == seen
        stored = load(BudgetAllocationRecord, await harness.redis.get(keys.ALLOCATION))
        assert stored.caps == {"A": 4, "B": 92} and stored.rev == got.revision.revision
        assert await harness.redis.get(keys.epoch_key("budget")) == stored.epoch

        # A bursts while B fills all 92 slots: B is drained (not preempted), then A gains
        await harness.demand(A=(36, 4), B=(500, 92))
        caps = await harness.tick()
        assert caps == {"A": 4, "B": 92}
        assert harness.app.service is not None and harness.app.service.record is not None
        assert harness.app.service.record.limits["B"] < 92
        await harness.demand(A=(36, 4), B=(500, harness.app.service.record.limits["B"]))
        caps = await harness.tick()
        assert caps["A"] > 4 and sum(caps.values()) == 96
        watch.cancel()


async def test_bad_configuration_and_policy_change_nothing(harness: Harness) -> None:
    async with serve_in_process("budget", harness.app, harness.settings) as running, \
            grpc.aio.insecure_channel(running.address) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        await stub.ConfigureTenants(_config())
        await harness.demand(A=(0, 0), B=(500, 48))
        await harness.tick()
        before = (await stub.GetAllocation(budget_pb2.GetAllocationRequest())).allocation
        stored_cfg = await harness.redis.get(keys.BUDGET_CONFIG)
        bad = {
            "floors sum to 100, above the total budget 96": _config(96, ("A", 50, 1.0), ("B", 50, 1.0)),
            "total budget must be > 0": _config(0),
            "repeated: A": _config(96, ("A", 0, 1.0), ("A", 0, 1.0)),
            "weight must be > 0": _config(96, ("A", 0, -1.0), ("B", 0, 1.0)),
            "at least one tenant": budget_pb2.ConfigureTenantsRequest(total_budget=8),
            "rate_limit.rpm and rate_limit.tpm must be >= 0": budget_pb2.ConfigureTenantsRequest(
                total_budget=8, tenants=[budget_pb2.TenantConfig(name="A", rate_limit=budget_pb2.RateLimit(rpm=-1))]),
        }
        for message, request in bad.items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ConfigureTenants(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SetPolicy(budget_pb2.SetPolicyRequest(policy="greedy"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "dynamic, static" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ReportDemand(budget_pb2.ReportDemandRequest(
                demand=[budget_pb2.TenantDemand(tenant="A", waiting=1), budget_pb2.TenantDemand(tenant="Z")]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for hold in (-1.0, float("nan"), float("inf")):  # a slot hold sets the lending horizon: must be real
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ReportDemand(budget_pb2.ReportDemandRequest(
                    demand=[budget_pb2.TenantDemand(tenant="A", waiting=1, p99_hold_s=hold)]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "p99_hold_s" in (err.value.details() or "")
        after = (await stub.GetAllocation(budget_pb2.GetAllocationRequest())).allocation
        assert after == before
        assert await harness.redis.get(keys.BUDGET_CONFIG) == stored_cfg
        assert harness.app.service is not None and harness.app.service.reported == {}


async def test_report_demand_static_policy_and_resume_after_restart(redis_url: str) -> None:
    clock = VirtualClock(time.time())
    h = Harness(redis_url, clock, **V0)
    async with serve_in_process("budget", h.app, h.settings) as running, \
            grpc.aio.insecure_channel(running.address) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        await stub.ConfigureTenants(_config())
        reply = await stub.ReportDemand(budget_pb2.ReportDemandRequest(demand=[
            budget_pb2.TenantDemand(tenant="A", waiting=0, in_flight=0),
            budget_pb2.TenantDemand(tenant="B", waiting=300, in_flight=48, p99_latency_s=1.5)]))
        assert reply.accepted == 2
        assert (await h.tick())["B"] == 72  # no router records: ReportDemand alone drives it
        last = (await stub.GetAllocation(budget_pb2.GetAllocationRequest())).allocation
        assert (await stub.SetPolicy(budget_pb2.SetPolicyRequest(policy="static"))).policy == "static"
    assert load(BudgetConfigRecord, await h.redis.get(keys.BUDGET_CONFIG)).policy == "static"
    await h.redis.aclose()

    again = Harness(redis_url, clock, **V0)  # a new process: new epoch, same Redis
    async with serve_in_process("budget", again.app, again.settings):
        svc = again.app.service
        assert svc is not None and svc.config is not None and svc.config.total == 96
        assert svc.policy_name == "static" and svc.allocation is not None
        assert dict(svc.allocation.caps) == dict(last.caps)  # resumed, not re-split
        await again.demand(A=(0, 0), B=(300, 72))
        caps = await again.tick()
        # static: B keeps its 72 busy slots (no preemption) but is drained back toward 48
        assert caps == {"A": 24, "B": 72} and svc.record is not None and svc.record.limits["B"] == 48
        assert svc.record.rev == last.revision.revision + 1 and svc.record.epoch != last.revision.epoch
    await again.redis.aclose()


async def test_wall_clock_loop_ticks_by_itself(redis_url: str) -> None:
    settings = load_settings(Settings, redis_url=redis_url, port=0, tick_s=0.05, total_budget=10,
                             tenants=[{"name": "A", "floor": 1}, {"name": "B", "floor": 1}], **V0)
    app = BudgetApp(settings)
    async with serve_in_process("budget", app, settings) as running, \
            grpc.aio.insecure_channel(running.address) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        await stub.ReportDemand(budget_pb2.ReportDemandRequest(demand=[
            budget_pb2.TenantDemand(tenant="A"), budget_pb2.TenantDemand(tenant="B", waiting=20, in_flight=5)]))
        watch = stub.WatchAllocations(budget_pb2.WatchAllocationsRequest(include_current=True))
        caps: dict[str, int] = {}
        for _ in range(40):
            caps = dict((await watch.read()).allocation.caps)
            if caps == {"A": 2, "B": 8}:
                break
        watch.cancel()
        # steps of ceil(10 / 4) = 3 slots: 5 -> 8; the last slot to B's target 9 is within hysteresis
        assert caps == {"A": 2, "B": 8}


async def test_burst_reserve_gap_lending_and_memory_survive_a_restart(redis_url: str) -> None:
    """Default controller: an idle tenant never seen busy keeps its share; after one complete
    gap it keeps its burst peak plus headroom, and its reserve is lent early in the next gap;
    the memory is in the record, so a restarted service calls the reserve back on time."""
    clock = VirtualClock(time.time())
    h = Harness(redis_url, clock)
    async with serve_in_process("budget", h.app, h.settings) as running, \
            grpc.aio.insecure_channel(running.address) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        await stub.ConfigureTenants(_config())
        await h.demand(A=(0, 0), B=(500, 48))
        assert [await h.tick() for _ in range(3)] == [{"A": 48, "B": 48}] * 3  # A's bursts are unknown
        for a_busy in (True, True, False, False, False, False, False, False):  # then a 12 s gap
            await h.demand(A=(0, 30) if a_busy else (0, 0), B=(500, 48))
            assert await h.tick() == {"A": 48, "B": 48}
        await h.demand(A=(0, 30), B=(500, 48))
        # gap known: A keeps its peak 30 + ceil(1.65 * sqrt(30)) (the Poisson headroom beats 10 %)
        assert await h.tick() == {"A": 40, "B": 56}
        await h.demand(A=(0, 0), B=(500, 56))
        assert await h.tick() == {"A": 16, "B": 80}  # early in the next gap: one step lent
    stored = load(BudgetAllocationRecord, await h.redis.get(keys.ALLOCATION))
    assert stored.min_gap_ms["A"] == 10_000 and stored.burst_peak["A"] == 30 and stored.idle_ms["A"] == 2000
    await h.redis.aclose()

    again = Harness(redis_url, clock)  # restarted: the gap and the idle time come back from Redis
    async with serve_in_process("budget", again.app, again.settings):
        await again.demand(A=(0, 0), B=(500, 80))
        assert await again.tick() == {"A": 4, "B": 92}, "idle 4 s of a 10 s gap: 8 s of it left, still lent"
        await again.demand(A=(0, 0), B=(500, 92))
        assert await again.tick() == {"A": 4, "B": 92}, "B's busy slots are not preempted"
        svc = again.app.service
        assert svc is not None and svc.record is not None
        assert svc.record.limits == {"A": 28, "B": 68}, "idle 6 s of a 10 s gap: the reserve is called back"
        assert set(svc.record.recall_since_ms) == {"A"} and not svc.record.recall_ms, "timing the call-back"
    await again.redis.aclose()
