"""Admission over real Redis and gRPC: plan fencing (stale epoch, older revision), the local
fallback when the planner is silent, holding (on purpose by the plan: long; nothing can serve
the request: 503 + Retry-After after the short hold timeout), tenant caps from the
budget service, and RouterAdminService with its status codes."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import pytest
from router_harness import MODEL, PLANNED, Router, start_router, wait_for

from services.common import keys
from services.common.records import AllocationRecord, AssignmentRecord, PlanRecord, SessionRecord, dump, load
from services.sim.vllm_sim.server import RunningSim
from tao.common.v1 import common_pb2
from tao.router.v1 import router_pb2, router_pb2_grpc

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 30}], "max_tokens": 3}
TIMEOUT = aiohttp.ClientTimeout(total=30)


async def publish_plan(router: Router, epoch: str, rev: int, assignments: dict[str, str], *,
                       live: bool = True, age_s: float = 0.0) -> None:
    now = time.time()
    rec = PlanRecord(epoch=epoch, rev=rev, policy="tao", solver="exact", solve_ms=0.1,
                     assignments=tuple(AssignmentRecord(session=s, replica=r) for s, r in assignments.items()),
                     snapshot_at_unix_s=now - age_s, created_at_unix_s=now - age_s)
    if live:
        await router.redis.set(keys.epoch_key("planner"), epoch)
    await router.redis.set(keys.PLAN, dump(rec))
    await router.redis.publish(keys.PLAN_CHANNEL, dump(rec))


async def post(http: aiohttp.ClientSession, router: Router, session: str, **headers: str) -> aiohttp.ClientResponse:
    resp = await http.post(router.url + "/v1/chat/completions", json=BODY, headers={"x-session-id": session, **headers})
    await resp.read()
    return resp


def replica_ids(router: Router) -> list[str]:
    return sorted(router.rt.core.replicas)


async def test_plans_are_fenced_by_epoch_and_revision(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], policy=PLANNED, plan_stale_s=60.0) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        r0, r1 = replica_ids(router)
        await publish_plan(router, "planner-A", 1, {})  # a live planner: no local fallback
        await wait_for(lambda: router.rt.plans.applied == 1 and not router.rt.planner_silent(), "first plan")
        first = asyncio.create_task(post(http, router, "s1"))
        await wait_for(lambda: "s1" in router.rt.core.sessions, "s1 held")
        # a plan from a previous planner process (not the live epoch) loses, even with a higher revision
        await router.redis.publish(keys.PLAN_CHANNEL, dump(PlanRecord(
            epoch="planner-OLD", rev=99, policy="tao", solver="exact", solve_ms=0.0,
            assignments=(AssignmentRecord(session="s1", replica=r0),), snapshot_at_unix_s=time.time(),
            created_at_unix_s=time.time())))
        await wait_for(lambda: router.rt.plans.rejected >= 1, "stale epoch rejected")
        await asyncio.sleep(0.1)
        assert not first.done() and not router.rt.core.sessions["s1"].admitted
        await publish_plan(router, "planner-A", 5, {"s1": r1})
        resp = await asyncio.wait_for(first, 10)
        assert resp.status == 200 and resp.headers["x-tao-replica"] == r1
        # an older revision of the live epoch loses
        second = asyncio.create_task(post(http, router, "s2"))
        await wait_for(lambda: "s2" in router.rt.core.sessions, "s2 held")
        rejected = router.rt.plans.rejected
        await publish_plan(router, "planner-A", 4, {"s2": r0})
        await wait_for(lambda: router.rt.plans.rejected > rejected, "older revision rejected")
        await asyncio.sleep(0.1)
        assert not second.done()
        # a restarted planner (new live epoch) starts again at revision 1 and wins
        await publish_plan(router, "planner-B", 1, {"s2": r0})
        resp = await asyncio.wait_for(second, 10)
        assert resp.status == 200 and resp.headers["x-tao-replica"] == r0
        async with grpc.aio.insecure_channel(router.grpc_address) as channel:
            stub = router_pb2_grpc.RouterAdminServiceStub(channel)
            explained = await stub.ExplainSession(router_pb2.ExplainSessionRequest(session_id="s2"))
        assert explained.applied_plan.epoch == "planner-B" and explained.applied_plan.revision == 1
        # the three applied plans (not the two fenced off) in the plan metrics
        async with http.get(router.url + "/metrics") as resp:
            text = await resp.text()
        assert "tao_router_plan_age_seconds_count 3.0" in text
        assert 'tao_router_plan_parts_total{outcome="admitted"} 2.0' in text
        assert 'outcome="rejected"' not in text


async def test_a_request_the_plan_holds_outlasts_the_hold_timeout_up_to_its_bound(
        redis_url: str, sims: list[RunningSim]) -> None:
    """A paused / not yet admitted session under a live planner is held on purpose: past the short
    hold_timeout_s, until plan_hold_timeout_s; then 503 + Retry-After."""
    async with start_router(redis_url, [sims[0].base_url], policy=PLANNED, plan_stale_s=60.0, hold_timeout_s=0.3,
                            plan_hold_timeout_s=1.5, plan_hold_tool_factor=0.0,
                            retry_after_s=7) as router, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await publish_plan(router, "planner-A", 1, {})
        await wait_for(lambda: not router.rt.planner_silent(), "planner alive")
        started = time.monotonic()
        resp = await post(http, router, "waits")
        body = await resp.json()
        assert resp.status == 503 and resp.headers["Retry-After"] == "7"
        assert body["error"]["type"] == "server_error" and "held by the plan past its bound" in body["error"]["message"]
        assert "held: waiting for admission" in body["error"]["message"]
        assert 1.4 < time.monotonic() - started < 6
        core = router.rt.core
        assert core.held == {} and core.phase(core.sessions["waits"]) == "PAUSED"
        assert core.tenant_held.get("default", 0) == 0
        # a single-turn request that times out leaves nothing behind
        resp = await http.post(router.url + "/v1/chat/completions", json=BODY)
        assert resp.status == 503
        assert list(core.sessions) == ["waits"]


async def test_a_request_held_by_the_plan_is_admitted_long_after_the_hold_timeout(
        redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [sims[0].base_url], policy=PLANNED, plan_stale_s=60.0, hold_timeout_s=0.3) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        assert router.rt.settings.plan_hold_timeout_s == 1800.0  # the default
        await publish_plan(router, "planner-A", 1, {})
        await wait_for(lambda: not router.rt.planner_silent(), "planner alive")
        task = asyncio.create_task(post(http, router, "late"))
        await asyncio.sleep(1.2)  # four hold timeouts
        assert not task.done()
        await publish_plan(router, "planner-A", 2, {"late": replica_ids(router)[0]})
        resp = await asyncio.wait_for(task, 10)
        assert resp.status == 200 and float(resp.headers["x-tao-hold-ms"]) > 1000


async def test_a_request_nothing_can_serve_gets_503_after_the_hold_timeout(
        redis_url: str, sims: list[RunningSim]) -> None:
    """Planner silent and the local fallback failing: no live plan, so the short timeout applies
    although the plan hold bound is long."""
    async with start_router(redis_url, [sims[0].base_url], policy=PLANNED, plan_stale_s=0.3, hold_timeout_s=0.5,
                            retry_after_s=3) as router, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        def broken(snapshot: object) -> object:
            raise RuntimeError("fallback policy down")

        router.rt.fallback.plan = broken  # type: ignore[method-assign]
        await asyncio.sleep(0.4)  # past plan_stale_s since start: no plan is live
        started = time.monotonic()
        resp = await post(http, router, "stuck")
        body = await resp.json()
        assert resp.status == 503 and resp.headers["Retry-After"] == "3"
        assert "no live plan" in body["error"]["message"]
        assert 0.45 < time.monotonic() - started < 3


async def test_tao_admits_a_request_nothing_contends_with_at_its_arrival(
        redis_url: str, sims: list[RunningSim]) -> None:
    """``tao`` (CoreConfig.fast_admit "cache"): with a live planner that has planned nothing for
    it, a lone session's request is admitted by the router at once, not held for a plan."""
    async with start_router(redis_url, [s.base_url for s in sims], plan_stale_s=60.0) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        assert router.rt.policy.name == "tao" and router.rt.core.config.fast_admit == "cache"
        await publish_plan(router, "planner-A", 1, {})  # a live planner: no local fallback
        await wait_for(lambda: router.rt.plans.applied == 1 and not router.rt.planner_silent(), "first plan")
        resp = await asyncio.wait_for(post(http, router, "lone"), 10)
        assert resp.status == 200 and router.rt.core.fast_admits == 1
        assert router.rt.core.sessions["lone"].admitted and router.rt.fallback_runs == 0
        resp = await asyncio.wait_for(post(http, router, "lone"), 10)  # its next turn: still admitted
        assert resp.status == 200 and router.rt.core.fast_admits == 1
        async with http.get(router.url + "/metrics") as m:
            text = await m.text()
        assert 'tao_router_unplanned_admissions_total{reason="arrival"} 1.0' in text


async def test_local_fallback_admits_when_the_planner_goes_silent(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], policy=PLANNED, plan_stale_s=0.5) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await publish_plan(router, "planner-A", 1, {})
        await wait_for(lambda: not router.rt.planner_silent(), "planner alive")
        task = asyncio.create_task(post(http, router, "f1"))
        await asyncio.sleep(0.2)
        assert not task.done() and router.rt.fallback_runs == 0
        resp = await asyncio.wait_for(task, 10)  # the planner went quiet: the local TAO policy admits
        assert resp.status == 200 and router.rt.fallback_runs >= 1
        assert router.rt.core.sessions["f1"].admitted


async def test_tenant_caps_from_the_budget_service(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], policy="least_loaded") as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await router.redis.set(keys.epoch_key("budget"), "budget-A")
        alloc = AllocationRecord(epoch="budget-A", rev=1, total=3, caps={"A": 1, "B": 2}, policy="static",
                                 decided_at_unix_s=time.time())
        await router.redis.publish(keys.ALLOCATION_CHANNEL, dump(alloc))
        await wait_for(lambda: router.rt.core.caps == {"A": 1, "B": 2}, "caps applied")
        peak = {"A": 0, "B": 0}
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                for t in peak:
                    peak[t] = max(peak[t], router.rt.core.tenant_in_flight.get(t, 0))
                await asyncio.sleep(0.001)

        sampler = asyncio.create_task(sample())
        body = {**BODY, "max_tokens": 40}
        calls = [http.post(router.url + "/v1/chat/completions", json=body,
                           headers={"x-tao-tenant": t, "x-session-id": f"{t}{i}"})
                 for t in ("A", "B") for i in range(4)]
        responses = await asyncio.gather(*calls)
        stop.set()
        await sampler
        assert [r.status for r in responses] == [200] * 8
        assert peak["A"] == 1 and 1 <= peak["B"] <= 2
        # the budget service goes silent / Redis loses the allocation: the last caps hold
        await router.redis.delete(keys.ALLOCATION)
        await asyncio.sleep(0.3)
        assert router.rt.core.caps == {"A": 1, "B": 2}


async def test_admin_rpcs_and_status_codes(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [sims[0].base_url]) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http, \
            grpc.aio.insecure_channel(router.grpc_address) as channel:
        stub = router_pb2_grpc.RouterAdminServiceStub(channel)
        for sid in ("a1", "a2"):
            assert (await post(http, router, sid, **{"x-tao-tenant": "T"})).status == 200
        listed = await stub.ListSessions(router_pb2.ListSessionsRequest())
        assert [s.session_id for s in listed.sessions] == ["a1", "a2"]
        s = listed.sessions[0]
        assert s.tenant == "T" and s.phase == common_pb2.SESSION_PHASE_ACTING and s.admitted and s.requests == 1
        assert s.context_tokens > 0 and s.footprint_tokens > s.context_tokens
        limited = await stub.ListSessions(router_pb2.ListSessionsRequest(limit=1, tenant="T"))
        assert len(limited.sessions) == 1
        none = await stub.ListSessions(router_pb2.ListSessionsRequest(phase=common_pb2.SESSION_PHASE_WAITING))
        assert list(none.sessions) == []
        explained = await stub.ExplainSession(router_pb2.ExplainSessionRequest(session_id="a1"))
        assert "admitted on" in explained.reason

        async def code_of(call: object) -> grpc.StatusCode:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call  # type: ignore[misc]
            return err.value.code()

        assert await code_of(stub.ListSessions(router_pb2.ListSessionsRequest(limit=-1))) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert await code_of(stub.ExplainSession(router_pb2.ExplainSessionRequest(session_id="nope"))) == \
            grpc.StatusCode.NOT_FOUND
        assert await code_of(stub.ReleaseSession(router_pb2.ReleaseSessionRequest(session_id="nope"))) == \
            grpc.StatusCode.NOT_FOUND
        long_body = {**BODY, "max_tokens": 12000, "stream": True}  # ~3 wall s at time scale 100: the release below lands mid-stream even on a loaded machine
        async with http.post(router.url + "/v1/chat/completions", json=long_body,
                             headers={"x-session-id": "a2", "x-tao-tenant": "T"}) as running:
            await running.content.readline()  # the stream has started
            assert router.rt.core.sessions["a2"].in_flight == 1
            assert await code_of(stub.ReleaseSession(router_pb2.ReleaseSessionRequest(session_id="a2"))) == \
                grpc.StatusCode.FAILED_PRECONDITION
            forced = await stub.ReleaseSession(router_pb2.ReleaseSessionRequest(session_id="a2", force=True))
            assert forced.released and "a2" not in router.rt.core.sessions
            rest = await running.read()  # the request in flight completes
            assert running.status == 200 and rest.endswith(b"data: [DONE]\n\n")
        assert router.rt.core.in_flight == {} and "a2" not in router.rt.core.sessions
        assert (await stub.ReleaseSession(router_pb2.ReleaseSessionRequest(session_id="a1"))).released

        replicas = await stub.ListReplicas(router_pb2.ListReplicasRequest())
        (only,) = replicas.replicas
        assert only.healthy and not only.draining and only.kv_capacity_tokens > 0
        assert only.capacity_tokens == int(only.kv_capacity_tokens * 0.95)
        assert await code_of(stub.AddReplica(router_pb2.AddReplicaRequest(url="ftp://x"))) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert await code_of(stub.AddReplica(router_pb2.AddReplicaRequest(id=only.id, url="http://10.9.9.9:1"))) == \
            grpc.StatusCode.ALREADY_EXISTS
        assert await code_of(stub.DrainReplica(router_pb2.DrainReplicaRequest(id="nope"))) == \
            grpc.StatusCode.NOT_FOUND
        added = await stub.AddReplica(router_pb2.AddReplicaRequest(id="second", url=sims[1].base_url))
        assert added.replica.id == "second" and added.replica.url == sims[1].base_url
        await wait_for(lambda: router.rt.core.replicas["second"].healthy, "second replica probed")
        drained = await stub.DrainReplica(router_pb2.DrainReplicaRequest(id=only.id))
        assert drained.replica.draining
        for i in range(3):  # new sessions avoid the draining replica
            resp = await post(http, router, f"new{i}")
            assert resp.status == 200 and resp.headers["x-tao-replica"] == "second"
        again = await stub.AddReplica(router_pb2.AddReplicaRequest(id=only.id, url=sims[0].base_url))
        assert not again.replica.draining


async def test_model_time_scale_applies_to_timeouts_and_records(redis_url: str, sims: list[RunningSim]) -> None:
    """Model time (docs/architecture.md#model-time): with time_scale 10 a 5 model-second plan hold bound is 0.5 wall seconds and the
    timestamps the router shares are model Unix seconds (time.time() x 10)."""
    async with start_router(redis_url, [sims[0].base_url], policy=PLANNED, time_scale=10.0, plan_stale_s=600.0,
                            hold_timeout_s=3.0, plan_hold_timeout_s=5.0, plan_hold_tool_factor=0.0) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        now_model = time.time() * 10
        rec = PlanRecord(epoch="p", rev=1, policy="tao", solver="exact", solve_ms=0.0,
                         snapshot_at_unix_s=now_model, created_at_unix_s=now_model)
        await router.redis.set(keys.epoch_key("planner"), "p")
        await router.redis.publish(keys.PLAN_CHANNEL, dump(rec))
        await wait_for(lambda: not router.rt.planner_silent(), "planner alive in model time")
        started = time.monotonic()
        resp = await post(http, router, "scaled")
        assert resp.status == 503 and 0.45 < time.monotonic() - started < 2.5
        await router.flushed()
        stored = load(SessionRecord, await router.redis.hget(keys.SESSIONS, "scaled"))
        assert abs(stored.created_at_unix_s - time.time() * 10) < 30
