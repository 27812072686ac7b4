"""Three `tao serve router --fleet` processes on one Redis and two emulated replicas under an
agent workload; one router is killed with SIGKILL mid-run. Every turn of every session is
answered exactly once (clients retry another router on a connection failure, as a load
balancer does), the dead router's sessions are taken over, and at the end every session is
owned by exactly one live router (GET /v1/sessions)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import aiohttp
import pytest
import redis.asyncio as aioredis
from router_harness import MODEL

from services.common import keys
from services.common.ports import free_port
from services.sim.vllm_sim.server import RunningSim

TTL = 1.0
MSG = [{"role": "user", "content": "Fix the failing test in the parser module. " * 6}]


class RouterProcess:
    def __init__(self, redis_url: str, replicas: list[str], rid: str) -> None:
        self.rid = rid
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        args = [sys.executable, "-m", "services.cli", "serve", "router", "--redis-url", redis_url,
                "--port", str(free_port()), "--http-port", str(self.http_port), "--fleet", "--router-id", rid,
                "--member-ttl-s", str(TTL), "--plan-stale-s", "0.3", "--log-level", "warning"]
        for r in replicas:
            args += ["--replica", r]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TAO_ROUTER_FLUSH_INTERVAL_S": "0.005",
               "TAO_ROUTER_HEALTH_INTERVAL_S": "0.2"}
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def routers(redis_url: str, sims: list[RunningSim]) -> Iterator[list[RouterProcess]]:
    procs = [RouterProcess(redis_url, [s.base_url for s in sims], f"r{i}") for i in range(3)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


async def wait_ready(http: aiohttp.ClientSession, r: RouterProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert r.proc.poll() is None, f"router {r.rid} exited"
        try:
            async with http.get(r.url + "/health") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"router {r.rid} never became healthy")


async def test_a_killed_router_loses_no_session_and_no_request(
        redis_url: str, sims: list[RunningSim], routers: list[RouterProcess], redis_client: aioredis.Redis) -> None:
    turns, agents = 6, 9
    answered: dict[tuple[str, int], int] = {}
    retries = 0
    killed_at: float | None = None
    victim = routers[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for r in routers:
            await wait_ready(http, r)
        done = asyncio.Event()
        progress = 0

        async def agent(i: int) -> None:
            nonlocal retries, progress
            sid = f"agent-{i}"
            for turn in range(turns):
                pick = (i + turn) % len(routers)
                deadline = time.monotonic() + 30.0
                while True:
                    r = routers[pick % len(routers)]
                    try:
                        async with http.post(r.url + "/v1/chat/completions", headers={"x-session-id": sid}, json={
                                "model": MODEL, "messages": MSG, "max_tokens": 40}) as resp:
                            body = await resp.json(content_type=None)
                            if resp.status == 200 and body["choices"][0]["message"]["content"]:
                                answered[(sid, turn)] = answered.get((sid, turn), 0) + 1
                                break
                    except (TimeoutError, aiohttp.ClientError):
                        pass
                    retries += 1  # an LB would send it to another router
                    assert time.monotonic() < deadline, f"{sid} turn {turn} never answered"
                    pick += 1
                    await asyncio.sleep(0.05)
                progress += 1
                if progress == agents * turns // 3:
                    done.set()

        workload = asyncio.gather(*(agent(i) for i in range(agents)))
        await done.wait()
        owned_by_victim = {sid for sid, v in (await redis_client.hgetall(keys.SESSION_OWNERS)).items()
                           if v.endswith(" " + victim.rid)}
        victim.kill()
        killed_at = time.monotonic()
        await workload
        took = time.monotonic() - killed_at
        owners = await redis_client.hgetall(keys.SESSION_OWNERS)
        live = {}
        counted = 0  # requests the sessions' state remembers (write-behind: a kill may lose the last)
        for r in routers[1:]:
            async with http.get(r.url + "/v1/sessions") as resp:
                rows = (await resp.json())["data"]
            live[r.rid] = {row["session"] for row in rows}
            counted += sum(row["requests"] for row in rows)
    lost = agents * turns - len(answered)
    duplicated = sum(n - 1 for n in answered.values() if n > 1)
    print(f"fleet kill: lost {lost}, duplicated {duplicated}, client retries {retries}, "
          f"victim owned {len(owned_by_victim)} sessions, workload finished {took:.2f} s after the kill, "
          f"session state counts {counted} of {agents * turns} requests")
    assert lost == 0 and duplicated == 0
    for i in range(agents):
        sid = f"agent-{i}"
        holders = [rid for rid, sessions in live.items() if sid in sessions]
        assert len(holders) == 1, (sid, holders)  # one owner: no double admission
        assert owners[sid].endswith(" " + holders[0])
    for sid in owned_by_victim:  # taken over under a new fencing revision
        assert int(owners[sid].split(" ")[0]) >= 2 and not owners[sid].endswith(" " + victim.rid)


async def test_an_owner_killed_mid_stream_ends_the_forwarded_stream_cleanly(
        routers: list[RouterProcess], redis_client: aioredis.Redis) -> None:
    owner, entry = routers[0], routers[1]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for r in routers:
            await wait_ready(http, r)
        short = {"model": MODEL, "messages": MSG, "max_tokens": 2}
        async with http.post(owner.url + "/v1/chat/completions", json=short, headers={"x-session-id": "long"}) as resp:
            assert resp.status == 200
        assert (await redis_client.hget(keys.SESSION_OWNERS, "long")) == f"1 {owner.rid}"
        body = {"model": MODEL, "messages": MSG, "max_tokens": 3000, "stream": True}
        async with http.post(entry.url + "/v1/chat/completions", json=body, headers={"x-session-id": "long"}) as resp:
            assert resp.status == 200 and resp.headers["x-tao-router"] == owner.rid
            for _ in range(3):
                await resp.content.readline()  # the first events came through the forwarding router
            owner.kill()
            rest = (await resp.read()).decode()
    events = [e.strip() for e in rest.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "mid-stream" in error["message"]
