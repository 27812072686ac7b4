"""The agent driver against a fake OpenAI endpoint that holds chosen requests before answering
headers, as a router holding a paused program does (ThunderAgent, TAO):

- the pause wait is the driver's own measurement (to the response headers), so it is the same
  for an endpoint that sends no ``x-tao-hold-ms`` and does not change with the time scale;
- a finished session is released through TAO's endpoint and, where that answers 404,
  through ThunderAgent's ``POST /programs/release``.
"""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import pytest
from aiohttp import web

from services.driver.driver import DriverConfig, TraceDriver
from services.driver.results import metrics_of, pause_threshold_s
from services.sim.workload.trace import Tool, TraceSession, Turn

HOLD_MODEL_S = 20.0  # the fake router holds turn 1 of every session this long (model seconds)


def _sessions(n: int) -> list[TraceSession]:
    tool = Tool(name="bash", command="ls", duration_s=1.0)
    return [TraceSession(session_id=f"s{i}", tenant="default", arrival_s=0.0, system_prompt_tokens=0,
                    turns=(Turn(append_tokens=10, output_tokens=3, tool=tool),
                           Turn(append_tokens=10, output_tokens=3, tool=None)))
            for i in range(n)]


class FakeRouter:
    """Streams 3 tokens; holds turn 1 for HOLD_MODEL_S model seconds before the headers. Knows
    ThunderAgent's release only (``/v1/sessions/{id}/release`` is 404, as on ThunderAgent)."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.released: list[str] = []
        self.tao_release_calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/programs/release", self.release)
        app.router.add_post("/v1/sessions/{sid}/release", self.tao_release)
        return app

    async def tao_release(self, _req: web.Request) -> web.Response:
        self.tao_release_calls += 1
        return web.json_response({"detail": "Not Found"}, status=404)

    async def release(self, req: web.Request) -> web.Response:
        self.released.append((await req.json())["program_id"])
        return web.json_response({"status": "ok"})

    async def chat(self, req: web.Request) -> web.StreamResponse:
        body = json.loads(await req.read())
        assert json.loads(body["metadata"]["tao_synthetic"]) == body["tao_synthetic"]
        if body["messages"][0]["content"].endswith("turn 1"):
            await asyncio.sleep(HOLD_MODEL_S / self.time_scale)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for piece in ("a", "b", "c"):
            await resp.write(b"data: " + json.dumps({"choices": [{"delta": {"content": piece}}]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def _play(time_scale: float) -> tuple[dict[str, Any], FakeRouter]:
    fake = FakeRouter(time_scale)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    # The driver and the fake share this process, which has run the whole suite by now: a full
    # garbage collection of its heap stalls the loop for 100+ ms on a loaded CI machine and
    # makes unheld requests look held (PAUSE_MIN_WALL_S is 0.1 s). That is the test process's
    # noise, not the driver's measurement, so collection waits until the play is over.
    gc.collect()
    gc.disable()
    try:
        driver = TraceDriver(DriverConfig(base_url=f"http://127.0.0.1:{port}", time_scale=time_scale,
                                          concurrency=4, model="m"))
        result = await driver.run(_sessions(4))
    finally:
        gc.enable()
        await runner.cleanup()
    assert result.errors == 0
    return metrics_of(result), fake


@pytest.mark.parametrize("time_scale", [10.0, 40.0])
async def test_pause_wait_measured_by_the_driver_independent_of_time_scale(time_scale: float) -> None:
    metrics, fake = await _play(time_scale)
    # no x-tao-hold-ms header here: the wait is still seen, in model seconds at either scale
    assert metrics["mean_pause_wait_s"] == pytest.approx(HOLD_MODEL_S, rel=0.25)
    assert HOLD_MODEL_S > pause_threshold_s(time_scale)
    # every request's wait, no threshold: half the requests were held
    assert metrics["mean_wait_all_s"] == pytest.approx(HOLD_MODEL_S / 2, rel=0.25)
    # the held requests' TTFT includes the hold; unheld requests are not counted as waits
    assert metrics["mean_ttft_s"] >= HOLD_MODEL_S / 2
    assert sorted(fake.released) == ["s0", "s1", "s2", "s3"] and fake.tao_release_calls == 4
    # per session: each held once (its turn 1), so its longest wait is that hold
    rows = {r["session_id"]: r for r in metrics["per_session"]}
    assert sorted(rows) == ["s0", "s1", "s2", "s3"]
    for r in rows.values():
        assert r["completed"] and r["errors"] == 0 and r["requests"] == 2
        assert r["max_wait_s"] == pytest.approx(HOLD_MODEL_S, rel=0.25)
        assert r["wait_s"] >= r["max_wait_s"] and r["latency_s"] >= r["max_wait_s"]
