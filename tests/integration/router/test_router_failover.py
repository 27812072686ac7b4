"""Replica failure: a killed replica (SIGKILL of a `tao vllm-sim` process) fails over before
the first byte, a failure mid-stream ends the stream with a clean error event and [DONE],
and the session goes back to the pool with zero credit on the dead replica."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import openai
import pytest
from router_harness import MODEL, SimProcess, start_router, wait_for

from services.sim.vllm_sim.server import RunningSim

MSG = [{"role": "user", "content": "Refactor the parser module and explain. " * 10}]


@pytest.fixture
def victims() -> Iterator[list[SimProcess]]:
    procs = [SimProcess("--time-scale", "100"), SimProcess("--time-scale", "2")]
    try:
        for p in procs:
            p.wait_listening()
        yield procs
    finally:
        for p in procs:
            p.kill()


def rid(url: str) -> str:
    return url.split("//", 1)[1]


async def test_killed_replica_fails_over_and_mid_stream_failure_ends_cleanly(
        redis_url: str, sims: list[RunningSim], victims: list[SimProcess]) -> None:
    fast, slow = victims
    survivor = sims[0]
    # probes are slow here so the request path, not the prober, discovers the failure
    async with start_router(redis_url, [fast.url, slow.url], health_interval_s=30.0) as router, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        url = router.url + "/v1/chat/completions"
        body = {"model": MODEL, "messages": MSG, "max_tokens": 4}
        async with http.post(url, json=body, headers={"x-session-id": "agent"}) as resp:
            assert resp.status == 200
            first = resp.headers["x-tao-replica"]
        victim = fast if rid(fast.url) == first else slow
        other = slow if victim is fast else fast
        # the survivor joins; the session's replica dies
        router.rt.registry.add("survivor", survivor.base_url)
        await wait_for(lambda: router.rt.core.replicas["survivor"].healthy, "survivor probed")
        victim.kill()
        async with http.post(url, json=body, headers={"x-session-id": "agent"}) as resp:
            assert resp.status == 200, await resp.text()
            moved_to = resp.headers["x-tao-replica"]
        assert moved_to != first
        session = router.rt.core.sessions["agent"]
        assert session.replica == moved_to and all(e.replica != first for e in session.cache)
        assert not router.rt.core.replicas[first].healthy
        assert router.rt.registry.entries[first].breaker.is_open

        # mid-stream: a slow stream on the remaining victim, killed after its first chunks
        await router.rt.registry.probe_all()
        router.rt.registry.drain("survivor")
        long_body = {"model": MODEL, "messages": MSG, "max_tokens": 3000, "stream": True}
        async with http.post(url, json=long_body, headers={"x-session-id": "streamer"}) as resp:
            assert resp.status == 200 and resp.headers["x-tao-replica"] == rid(other.url)
            for _ in range(3):
                await resp.content.readline()
            other.kill()
            rest = (await resp.read()).decode()
        events = [e.strip() for e in rest.split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["type"] == "server_error" and "mid-stream" in error["message"]
        streamer = router.rt.core.sessions["streamer"]
        assert not streamer.admitted and streamer.in_flight == 0
        assert router.rt.core.in_flight == {}
        # the official client turns that event into an APIError
        router.rt.registry.add("survivor", survivor.base_url)
        async with openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
            reply = await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2,
                                                         extra_headers={"x-session-id": "streamer"})
            assert reply.choices[0].message.content


async def test_all_attempts_failing_answers_502_and_frees_everything(redis_url: str) -> None:
    dead = [SimProcess("--time-scale", "100"), SimProcess("--time-scale", "100")]
    try:
        urls = [await asyncio.to_thread(d.wait_listening) for d in dead]
        async with start_router(redis_url, urls, health_interval_s=30.0, policy="round_robin",
                                max_attempts=2) as router, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for d in dead:
                d.kill()
            body = {"model": MODEL, "messages": MSG, "max_tokens": 2}
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                payload = await resp.json()
            # both replicas refuse before the first byte: two attempts, then 502
            assert resp.status == 502 and payload["error"]["code"] == "upstream_failed"
            assert router.rt.metrics.upstream_failures.labels(rid(urls[0]))._value.get() == 1
            core = router.rt.core
            assert core.in_flight == {} and core.held == {} and core.sessions == {}
            assert core.tenant_in_flight.get("default", 0) == 0
            assert not any(r.healthy for r in core.replicas.values())
    finally:
        for d in dead:
            d.kill()
