"""ThunderAgent API parity (ThunderAgent-org/ThunderAgent, ThunderAgent/app.py): a harness
written for ThunderAgent's proxy sends ``extra_body.program_id`` with the official openai
client, reads ``GET /programs``, ``/health`` and the JSON ``/metrics``, calls
``POST /programs/release`` and gets the same JSON shapes from the router; requests without a
program_id are filed under "default" when ``default_program_id`` says so."""

from __future__ import annotations

import aiohttp
import openai
from router_harness import MODEL, start_router, wait_for

from services.sim.vllm_sim.server import RunningSim

TIMEOUT = aiohttp.ClientTimeout(total=30)
MESSAGES = [{"role": "user", "content": "hello " * 40}]
PROGRAM_KEYS = {"backend", "context_len", "total_tokens", "step_count", "status", "state"}


async def test_programs_health_metrics_release_like_thunderagent(redis_url: str, sims: list[RunningSim]) -> None:
    urls = [s.base_url for s in sims]
    async with start_router(redis_url, urls, policy="thunderagent") as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http, \
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
        for _ in range(2):
            out = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,  # type: ignore[arg-type]
                                                       extra_body={"program_id": "task-1"})
            assert out.choices[0].message.content
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True,  # type: ignore[arg-type]
                                                      extra_body={"program_id": 7})  # ThunderAgent str()s it
        async for _ in stream:  # type: ignore[union-attr]
            pass
        await wait_for(lambda: router.rt.core.sessions.get("7") is not None
                       and router.rt.core.sessions["7"].in_flight == 0, "program 7 done")

        async with http.get(router.url + "/programs") as resp:
            assert resp.status == 200
            progs = await resp.json()
        assert set(progs) == {"task-1", "7"}
        one = progs["task-1"]
        assert set(one) == PROGRAM_KEYS
        assert one["backend"] in urls and one["step_count"] == 2
        assert one["status"] == "acting" and one["state"] == "active"
        assert one["total_tokens"] > 40 and one["context_len"] == one["total_tokens"]
        assert progs["7"]["step_count"] == 1

        async with http.get(router.url + "/health") as resp:
            health = await resp.json()
        assert health["status"] == "ok" and health["programs_count"] == 2
        assert health["acting_count"] == 2 and health["reasoning_count"] == 0 and health["paused_count"] == 0
        assert health["router_mode"] == "tr" and health["scheduling_enabled"] is True
        assert sorted(health["backends"]) == sorted(urls)
        assert sum(b["total"] for b in health["per_backend"].values()) == 2
        assert set(next(iter(health["per_backend"].values()))) == {
            "total", "reasoning", "acting", "paused", "marked_for_pause", "future_paused_tokens"}

        async with http.get(router.url + "/metrics", headers={"Accept": "application/json"}) as resp:
            metrics = await resp.json()
        assert metrics["metrics_enabled"] is True and set(metrics["backends"]) == set(urls)
        backend = metrics["backends"][one["backend"]]
        assert backend["url"] == one["backend"] and backend["active_program_count"] >= 1
        assert backend["acting_program_count"] == backend["active_program_count"]
        assert backend["healthy"] is True and "num_requests_running" in backend["metrics"]
        async with http.get(router.url + "/metrics") as resp:  # Prometheus text stays the default
            assert "tao_router" in await resp.text()

        async with http.get(router.url + "/profiles") as resp:  # ThunderAgent without --profile
            assert resp.status == 400 and "Profiling not enabled" in (await resp.json())["error"]

        async with http.post(router.url + "/programs/release", json={"program_id": "task-1"}) as resp:
            assert await resp.json() == {"program_id": "task-1", "released": True}
        async with http.post(router.url + "/programs/release", json={"program_id": "task-1"}) as resp:
            assert await resp.json() == {"program_id": "task-1", "released": False}
        async with http.post(router.url + "/programs/release", json={}) as resp:
            assert resp.status == 400
        async with http.get(router.url + "/programs") as resp:
            assert set(await resp.json()) == {"7"}


async def test_requests_without_program_id_join_default(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], default_program_id="default") as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http, \
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
        for _ in range(2):
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
        async with http.get(router.url + "/programs") as resp:
            progs = await resp.json()
        assert list(progs) == ["default"] and progs["default"]["step_count"] == 2
        async with http.post(router.url + "/programs/release", json={"program_id": "default"}) as resp:
            assert (await resp.json())["released"] is True


async def test_metrics_as_thunderagent_harnesses_read_them(redis_url: str, sims: list[RunningSim]) -> None:
    """``thunderagent_metrics``: a client that does not ask for Prometheus text (a harness doing
    ``requests.get(url + "/metrics").json()``) gets ThunderAgent's JSON; Prometheus still gets text."""
    urls = [s.base_url for s in sims]
    async with start_router(redis_url, urls, policy="thunderagent", thunderagent_metrics=True) as router, \
            aiohttp.ClientSession() as http:
        async with http.get(router.url + "/metrics") as resp:  # aiohttp sends Accept: */*
            assert set((await resp.json())["backends"]) == set(urls)
        prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        async with http.get(router.url + "/metrics", headers={"Accept": prom}) as resp:
            assert "tao_router" in await resp.text()
