"""The operators' view over HTTP: ``GET /v1/sessions/{id}`` explains a held and an admitted
session (with the predictor's prediction read from Redis), ``GET /v1/sessions`` lists them,
bad and unknown ids get OpenAI-style 400 / 404, and ``tao explain`` / ``tao sessions`` print
the same answers."""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import pytest
from router_harness import MODEL, PLANNED, Router, start_router, wait_for

from services.common import keys
from services.common.records import AssignmentRecord, PlanRecord, PredictionRecord, dump
from services.router import explain_cli, sessions_cli
from services.sim.vllm_sim.server import RunningSim

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 30}], "max_tokens": 3}
TIMEOUT = aiohttp.ClientTimeout(total=30)


async def publish_plan(router: Router, rev: int, assignments: dict[str, str]) -> None:
    now = time.time()
    rec = PlanRecord(epoch="planner-A", rev=rev, policy="tao", solver="exact", solve_ms=0.1,
                     assignments=tuple(AssignmentRecord(session=s, replica=r) for s, r in assignments.items()),
                     snapshot_at_unix_s=now, created_at_unix_s=now)
    await router.redis.set(keys.epoch_key("planner"), "planner-A")
    await router.redis.set(keys.PLAN, dump(rec))
    await router.redis.publish(keys.PLAN_CHANNEL, dump(rec))


def cli_args(r: Router, **extra: object) -> argparse.Namespace:
    base = {"router": r.url, "api_key": None, "tenant": None, "json": False, "timeout": 10.0}
    return argparse.Namespace(**{**base, **extra})


async def test_explain_a_held_then_admitted_session(redis_url: str, sims: list[RunningSim],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], policy=PLANNED, plan_stale_s=60.0) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        r0 = sorted(router.rt.core.replicas)[0]
        await publish_plan(router, 1, {})  # a live planner that admits nothing yet
        await wait_for(lambda: router.rt.plans.applied == 1, "first plan")
        call = asyncio.create_task(http.post(router.url + "/v1/chat/completions", json=BODY,
                                             headers={"x-session-id": "s1", "x-tao-tenant": "A"}))
        await wait_for(lambda: any(h.session_id == "s1" for h in router.rt.core.held.values()), "s1 held")

        async with http.get(router.url + "/v1/sessions/s1") as resp:
            assert resp.status == 200
            held = await resp.json()
        assert held["phase"] == "WAITING" and held["held"] is True
        assert held["constraint"] == "plan_order" and "planner rev 1 did not admit it" in held["reason"]
        assert held["plan"]["revision"] == 1 and held["plan"]["epoch"] == "planner-A"
        assert held["readiness"] == {**held["readiness"], "ready": True, "source": "held_request"}
        assert held["queue_position"] == 1 and held["tenant"] == "A"
        assert {c["replica"] for c in held["credits"]} == set(router.rt.core.replicas)
        assert "HELD: it fits on" in held["text"] and "would admit it: the next plan round" in held["text"]

        # tao explain prints the same words; tao sessions the row
        assert await asyncio.to_thread(explain_cli.run, cli_args(router, session="s1")) == 0
        out = capsys.readouterr().out
        assert "\nsession s1 (tenant A): WAITING" in "\n" + out and "HELD" in out
        ns = cli_args(router, phase=None, only_tenant=None)
        assert await asyncio.to_thread(sessions_cli.run, ns) == 0
        lines = capsys.readouterr().out.splitlines()
        listing = lines[next(i for i, line in enumerate(lines) if line.startswith("SESSION ")):]
        assert listing[0].split()[:3] == ["SESSION", "TENANT", "PHASE"]
        assert listing[1].split()[:3] == ["s1", "A", "WAITING"]

        await publish_plan(router, 2, {"s1": r0})
        resp = await call
        assert resp.status == 200
        await resp.read()
        now = router.rt.clock.unix()  # shared timestamps are model time
        pred = PredictionRecord(epoch="pred-1", rev=1, session_id="s1", call_id="c1", tool="bash", ready=False,
                                ready_reason="", expected_duration_s=30.0, remaining_s=25.0, elapsed_s=5.0,
                                evidence="tool_history", started_at_unix_s=now, refreshed_at_unix_s=now,
                                predicted_return_unix_s=now + 25.0)
        await router.redis.hset(keys.PREDICTIONS, "s1", dump(pred))
        async with http.get(router.url + "/v1/sessions/s1") as resp:
            admitted = await resp.json()
        assert admitted["phase"] == "ACTING" and admitted["held"] is False and admitted["replica"] == r0
        assert admitted["constraint"] == "admitted" and "admitted on " + r0 in admitted["reason"]
        credit = {c["replica"]: c for c in admitted["credits"]}
        assert credit[r0]["evidence"] in ("cached_tokens", "volume") and credit[r0]["age_s"] is not None
        rd = admitted["readiness"]
        assert rd["source"] == "prediction" and rd["ready"] is False and rd["prediction"]["tool"] == "bash"
        assert rd["prediction"]["evidence"] == "tool_history"

        async with http.get(router.url + "/v1/sessions", params={"phase": "ACTING"}) as resp:
            rows = (await resp.json())["data"]
        assert [r["session"] for r in rows] == ["s1"]


async def test_bad_and_unknown_session_ids(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims]) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.get(router.url + "/v1/sessions/nope") as resp:
            assert resp.status == 404
            err = (await resp.json())["error"]
        assert err["code"] == "session_not_found" and err["type"] == "invalid_request_error"
        assert err["param"] == "session_id"
        async with http.get(router.url + "/v1/sessions/" + "x" * 300) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "session_id"
        async with http.get(router.url + "/v1/sessions/a%01b") as resp:
            assert resp.status == 400
        async with http.get(router.url + "/v1/sessions", params={"limit": "0"}) as resp:
            assert resp.status == 400
        async with http.get(router.url + "/v1/sessions", params={"phase": "SLEEPING"}) as resp:
            assert resp.status == 400
        assert await asyncio.to_thread(explain_cli.run, cli_args(router, session="nope")) == 1
        gone = cli_args(router, session="x", router="http://127.0.0.1:9", timeout=2.0)
        assert await asyncio.to_thread(explain_cli.run, gone) == 2
