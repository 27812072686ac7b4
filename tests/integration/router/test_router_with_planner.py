"""The router with the real planner service over Redis: held requests are admitted by the
planner's plans (not the local fallback), multi-turn sessions stay put, and when the planner
stops the router's local fallback takes over."""

from __future__ import annotations

import aiohttp
import grpc
from router_harness import MODEL, PLANNED, start_router, wait_for

from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.planner.server import PlannerApp
from services.planner.server import Settings as PlannerSettings
from services.sim.vllm_sim.server import RunningSim
from tao.router.v1 import router_pb2, router_pb2_grpc

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "fix the flaky test " * 20}], "max_tokens": 4}


async def test_planner_plans_admit_and_fallback_takes_over_when_it_stops(redis_url: str,
                                                                         sims: list[RunningSim]) -> None:
    planner_settings = load_settings(PlannerSettings, redis_url=redis_url, port=0, tick_s=0.2, debounce_s=0.01)
    planner = PlannerApp(planner_settings)
    async with start_router(redis_url, [s.base_url for s in sims], policy=PLANNED, plan_stale_s=1.0) as router, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with serve_in_process("planner", planner, planner_settings):
            assert planner.service is not None
            await wait_for(lambda: not router.rt.planner_silent(), "planner plans seen")
            placed = set()
            for _ in range(3):
                async with http.post(router.url + "/v1/chat/completions", json=BODY,
                                     headers={"x-session-id": "planned"}) as resp:
                    assert resp.status == 200, await resp.text()
                    placed.add(resp.headers["x-tao-replica"])
            assert len(placed) == 1 and router.rt.fallback_runs == 0
            applied = router.rt.plans.fence.applied
            assert applied is not None and applied.epoch == planner.service.epoch
            async with grpc.aio.insecure_channel(router.grpc_address) as channel:
                stub = router_pb2_grpc.RouterAdminServiceStub(channel)
                explained = await stub.ExplainSession(router_pb2.ExplainSessionRequest(session_id="planned"))
            assert explained.applied_plan.epoch == planner.service.epoch
        # the planner is gone: plans go stale, the local fallback admits new sessions
        await wait_for(router.rt.planner_silent, "planner silent", timeout_s=5)
        async with http.post(router.url + "/v1/chat/completions", json=BODY,
                             headers={"x-session-id": "after"}) as resp:
            assert resp.status == 200
        assert router.rt.fallback_runs >= 1
