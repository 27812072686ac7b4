"""The four services on a Redis Cluster (3 masters on loopback) and on a Sentinel-managed master
with a failover mid-workload (docs/architecture.md#redis-cluster-and-sentinel): plans, caps,
session records and predictions flow; every TAO key is in one slot; after ``SENTINEL FAILOVER``
requests keep succeeding, the planner keeps publishing to the new master, and no event the
predictor acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import redis.asyncio as aioredis

from services.budget.server import BudgetApp
from services.budget.settings import Settings as BudgetSettings
from services.budget.settings import TenantSpec
from services.common import keys
from services.common.redis_client import make_redis
from services.common.settings import load_settings
from services.common.testing import RedisClusterProcs, RedisSentinelProcs, serve_in_process
from services.planner.server import PlannerApp
from services.planner.settings import Settings as PlannerSettings
from services.predictor import store as predictor_store
from services.predictor.server import PredictorApp
from services.predictor.settings import Settings as PredictorSettings
from services.router.server import RouterApp
from services.router.settings import Settings as RouterSettings
from services.sim.vllm_sim.server import start_vllm_sim
from tao.predictor.v1 import predictor_pb2 as pb
from tao.predictor.v1 import predictor_pb2_grpc as pbg

MODEL = "Qwen/Qwen3-32B"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "run the test suite " * 20}], "max_tokens": 4}


@dataclass
class Stack:
    planner: PlannerApp
    budget: BudgetApp
    predictor: PredictorApp
    router: RouterApp
    predictor_address: str
    redis: aioredis.Redis
    predictor_settings: PredictorSettings
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.router.base_url


@contextlib.asynccontextmanager
async def _stack(redis_url: str, replica: str, **predictor_kw: Any) -> AsyncIterator[Stack]:
    common: dict[str, Any] = {"redis_url": redis_url, "port": 0, "redis_startup_timeout_s": 10.0,
                              "log_level": "warning"}
    ps = load_settings(PlannerSettings, **common, tick_s=0.2, debounce_s=0.01, lease_ttl_s=2.0)
    bs = load_settings(BudgetSettings, **common, tick_s=0.5, lease_ttl_s=2.0, total_budget=8,
                       tenants=[TenantSpec(name="default")])
    pr = load_settings(PredictorSettings, **common, exploration_probability=0.0, **predictor_kw)
    rs = load_settings(RouterSettings, **common, http_port=0, replicas=[replica], plan_stale_s=1.0,
                       health_interval_s=0.2, flush_interval_s=0.005, plan_poll_s=0.25)
    planner, budget, predictor, router = PlannerApp(ps), BudgetApp(bs), PredictorApp(pr), RouterApp(rs)
    client = make_redis(rs)
    try:
        async with serve_in_process("planner", planner, ps), serve_in_process("budget", budget, bs), \
                serve_in_process("predictor", predictor, pr) as pred, serve_in_process("router", router, rs):
            yield Stack(planner, budget, predictor, router, pred.address, client, pr)
    finally:
        await client.aclose()


async def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def _plans_and_caps_applied(stack: Stack) -> bool:
    rt = stack.router.runtime
    assert rt is not None and stack.planner.service is not None and stack.budget.service is not None
    plan, caps = rt.plans.fence.applied, rt.allocation.fence.applied
    return (plan is not None and plan.epoch == stack.planner.service.epoch and caps is not None
            and caps.epoch == stack.budget.service.epoch)


def _events(session: str, call: str, now: float) -> list[pb.ToolEvent]:
    return [pb.ToolEvent(session_id=session, call_id=call, sequence=0, type=pb.TOOL_EVENT_TYPE_STARTED, tool="bash",
                         command="pytest -x", t_unix_s=now),
            pb.ToolEvent(session_id=session, call_id=call, sequence=1, type=pb.TOOL_EVENT_TYPE_FINISHED, tool="bash",
                         command="pytest -x", t_unix_s=now + 0.01)]


async def test_the_services_run_on_a_redis_cluster_with_every_key_in_one_slot(
        redis_cluster: RedisClusterProcs) -> None:
    async with start_vllm_sim(time_scale=100.0) as sim, _stack(redis_cluster.url, sim.base_url) as stack, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        rt = stack.router.runtime
        assert rt is not None
        await _until(lambda: _plans_and_caps_applied(stack), 15.0, "the router applies the planner's plans and caps")
        placed = set()
        for _ in range(3):
            async with http.post(stack.url + "/v1/chat/completions", json=BODY,
                                 headers={"x-session-id": "c1"}) as resp:
                assert resp.status == 200, await resp.text()
                placed.add(resp.headers["x-tao-replica"])
        assert len(placed) == 1 and rt.fallback_runs == 0
        async with grpc.aio.insecure_channel(stack.predictor_address) as channel:
            reply = await pbg.PredictorServiceStub(channel).ReportToolEvents(
                pb.ReportToolEventsRequest(events=_events("c1", "k1", time.time())), timeout=10)
        assert [a.status for a in reply.acks] == [pb.ACK_STATUS_DURABLE] * 2

        async def recorded() -> bool:
            return bool(await stack.redis.hexists(keys.SESSIONS, "c1")
                        and await stack.redis.hexists(keys.PREDICTIONS, "c1"))

        await _until(recorded, 10.0, "the session record (router pipeline) and prediction (predictor script)")
        written = [keys.SESSIONS, keys.REPLICAS, keys.DEMAND, keys.PLAN, keys.ALLOCATION, keys.BUDGET_CONFIG,
                   keys.PREDICTIONS, keys.lease_key("planner"), keys.lease_key("budget"),
                   keys.term_key("planner"), *(keys.epoch_key(s) for s in ("router", "planner", "predictor", "budget"))]
        assert all([await stack.redis.exists(k) for k in written]), [k for k in written
                                                                     if not await stack.redis.exists(k)]
        # the predictor's event log (its MULTI/EXEC or Lua append) or its state snapshot
        assert await stack.redis.exists(predictor_store.LOG, predictor_store.STATE) >= 1
        others = [keys.rate_limit_key("t"), predictor_store.LOG, predictor_store.STATE, keys.PREDICTOR_HISTORY]
        slots = {await stack.redis.cluster_keyslot(k) for k in [*written, *others]}  # type: ignore[attr-defined]
        assert len(slots) == 1
        # the planner's snapshot (MULTI/EXEC over router, predictor and budget keys) saw the session
        assert stack.planner.service is not None and stack.planner.service.last is not None
        await _until(lambda: _planned(stack, "c1"), 5.0, "a plan made from a snapshot holding c1")


async def _planned(stack: Stack, session: str) -> bool:
    assert stack.planner.service is not None
    last = stack.planner.service.last
    return last is not None and any(s.id == session for s in last.snapshot.sessions)


async def test_sentinel_failover_mid_workload_keeps_services_working_and_acked_events(
        redis_sentinel: RedisSentinelProcs) -> None:
    first_master = redis_sentinel.master_port()
    statuses: list[int] = []
    acked: list[pb.ToolEvent] = []
    acked_after: list[pb.ToolEvent] = []
    failed_over = asyncio.Event()
    stop = asyncio.Event()
    async with start_vllm_sim(time_scale=100.0) as sim, \
            _stack(redis_sentinel.url, sim.base_url, redis_wait_replicas=1, flush_timeout_s=20.0) as stack, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http, \
            grpc.aio.insecure_channel(stack.predictor_address) as channel:
        rt = stack.router.runtime
        assert rt is not None
        await _until(lambda: _plans_and_caps_applied(stack), 15.0, "the router applies the planner's plans and caps")
        predictor = pbg.PredictorServiceStub(channel)

        async def agent(name: str) -> None:
            for i in itertools.count():
                if stop.is_set():
                    return
                async with http.post(stack.url + "/v1/chat/completions", json=BODY,
                                     headers={"x-session-id": name}) as resp:
                    statuses.append(resp.status)
                # one call per predictor session: the dedup window keeps a bounded number of calls
                # per session (dedupe_calls_per_session), and every acknowledged one is checked below
                events = _events(f"{name}.{i}", "call", time.time())
                with contextlib.suppress(grpc.aio.AioRpcError):  # UNAVAILABLE: not acknowledged
                    reply = await predictor.ReportToolEvents(pb.ReportToolEventsRequest(events=events), timeout=25)
                    for ev, ack in zip(events, reply.acks, strict=True):
                        if ack.status == pb.ACK_STATUS_DURABLE:
                            (acked_after if failed_over.is_set() else acked).append(ev)

        agents = [asyncio.create_task(agent(f"a{i}")) for i in range(3)]
        try:
            await _until(lambda: _true(len(acked) >= 6), 20.0, "acknowledged events before the failover")
            plan_before = rt.plans.fence.applied
            new_master = await asyncio.to_thread(redis_sentinel.failover)
            failed_over.set()
            assert new_master != first_master
            await _until(lambda: _true(len(acked_after) >= 6), 30.0, "acknowledged events after the failover")

            async def new_plans() -> bool:
                applied = rt.plans.fence.applied
                return (applied is not None and plan_before is not None and applied.rev > plan_before.rev + 2
                        and await stack.redis.get(keys.epoch_key("planner")) == applied.epoch)

            await _until(new_plans, 15.0, "the planner keeps publishing through the new master")
        finally:
            stop.set()
            await asyncio.gather(*agents, return_exceptions=True)
        assert statuses and all(s == 200 for s in statuses), sorted(set(statuses))
        assert redis_sentinel.master_port() == new_master
        # every acknowledged event is in the new master: a fresh predictor, restored from it,
        # calls each one a duplicate
        fresh = PredictorApp(stack.predictor_settings)
        async with serve_in_process("predictor", fresh, stack.predictor_settings) as running, \
                grpc.aio.insecure_channel(running.address) as ch2:
            events = acked + acked_after
            reply = await pbg.PredictorServiceStub(ch2).ReportToolEvents(
                pb.ReportToolEventsRequest(events=events), timeout=20)
            lost = [f"{e.session_id}/{e.call_id}/{e.sequence}" for e, a in zip(events, reply.acks, strict=True)
                    if a.status != pb.ACK_STATUS_DUPLICATE]
            print(f"sentinel failover: {len(statuses)} requests all 200, {len(events)} acknowledged events "
                  f"({len(acked_after)} after the failover), lost {len(lost)}")
            assert not lost, lost[:5]


async def _true(value: bool) -> bool:
    return value
