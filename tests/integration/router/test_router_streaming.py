"""Streaming relay through the router over real sockets: client and upstream connections
are kept alive across streams (the [DONE] event and the end of the response go out
together), and a client that vanishes mid-stream makes the replica abort the request."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from router_harness import MODEL, start_router, wait_for

from services.sim.vllm_sim.server import RunningSim

MSG = [{"role": "user", "content": "Trace the failing call and explain it. " * 10}]


def _running(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


async def test_connections_are_reused_and_a_vanished_client_aborts_upstream(
        redis_url: str, sims: list[RunningSim]) -> None:
    sim = sims[0]
    opened = [0]

    async def on_create(*_: Any) -> None:
        opened[0] += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    async with start_router(redis_url, [sim.base_url]) as router, \
            aiohttp.ClientSession(trace_configs=[trace], timeout=aiohttp.ClientTimeout(total=30)) as http:
        url = router.url + "/v1/chat/completions"
        body = {"model": MODEL, "messages": MSG, "max_tokens": 5, "stream": True}
        upstream_before = router.rt.upstream.opened
        for _ in range(4):
            async with http.post(url, json=body, headers={"x-session-id": "keep"}) as resp:
                assert resp.status == 200
                events = 0
                async for line in resp.content:  # stop at [DONE], as SSE clients do
                    if line.startswith(b"data: [DONE]"):
                        break
                    events += line.startswith(b"data: ")
                assert events >= 2
        assert opened[0] == 1  # the response was complete at [DONE]: the connection stayed alive
        assert router.rt.upstream.opened - upstream_before == 1  # one keep-alive connection to the replica

        long_body = {**body, "max_tokens": 50_000, "ignore_eos": True}
        resp = await http.post(url, json=long_body, headers={"x-session-id": "vanishing"})
        for _ in range(4):
            await resp.content.readline()
        resp.close()  # the client goes away mid-stream
        await wait_for(lambda: not router.rt.core.in_flight, "request settled")

        async def replica_idle() -> bool:
            async with http.get(sim.base_url + "/metrics") as m:
                return _running(await m.text()) == 0

        for _ in range(100):
            if await replica_idle():
                break
            await asyncio.sleep(0.05)
        assert await replica_idle(), "the replica kept generating for a client that left"
        assert router.rt.core.sessions["vanishing"].in_flight == 0
