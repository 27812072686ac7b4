"""KV events end to end: two `tao vllm-sim` replicas, one publishing vLLM's KV events over real
ZMQ (loopback TCP), the router subscribed to it over a real Redis. A session's ``kv_events``
credit on the publishing replica is exactly the prompt-prefix blocks its engine holds — a
system prompt another session left there included, and nothing once evicted — and it reaches
the session's Redis record; on the replica without events only usage-derived credit exists."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from router_harness import MODEL, TIME_SCALE, start_router, wait_for

from services.common import keys
from services.common.kv_events import KVEventsConfig
from services.sim.engine.tokens import SyntheticContent
from services.sim.vllm_sim.server import RunningSim, start_vllm_sim

EVENTS = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:*",
                        replay_endpoint="tcp://127.0.0.1:*")
SYS = 256  # shared system prompt tokens (16 blocks)


@pytest.fixture
async def two() -> AsyncIterator[tuple[RunningSim, RunningSim]]:
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=TIME_SCALE, num_gpu_blocks=200,
                              max_model_len=3100, kv_events=EVENTS) as r0, \
            start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=TIME_SCALE, num_gpu_blocks=200,
                           max_model_len=3100) as r1:
        yield r0, r1


def _body(session: str, prompt: int, shared: str | None = None) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            "tao_synthetic": {"session_id": session, "prompt_tokens": prompt, "shared_prefix_id": shared,
                              "system_prompt_tokens": SYS if shared else 0}}


async def _post(url: str, body: dict[str, Any], session: str | None = None) -> None:
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers["x-session-id"] = session
    async with aiohttp.ClientSession() as http, \
            http.post(url + "/v1/chat/completions", data=json.dumps(body), headers=headers) as r:
        assert r.status == 200, await r.text()


async def test_kv_events_credit_is_true_residency(redis_url: str, two: tuple[RunningSim, RunningSim]) -> None:
    r0, r1 = two
    pub = r0.server.runner.kv_publisher
    assert pub is not None
    kv = {"r0": {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint}}
    # another session leaves the shared system prompt on r0 before the router even starts (replayed from 0)
    await _post(r0.base_url, _body("B", 300, "sys"))
    async with start_router(redis_url, [f"r0={r0.base_url}", f"r1={r1.base_url}"], policy="round_robin",
                            kv_events=kv, kv_events_credit=True, kv_refresh_s=0.05) as router:
        rt = router.rt
        assert rt.kv is not None
        await _post(router.url, _body("A", 600, "sys"), session="A")
        content = SyntheticContent("A", "sys", SYS)

        def kv_credit(replica: str) -> int | None:
            s = rt.core.sessions.get("A")
            ev = [e for e in (s.cache if s else ()) if e.replica == replica and e.kind == "kv_events"]
            return ev[0].resident_tokens if ev else None

        def truth() -> int:
            return r0.engine.resident_prefix_blocks(content, 600) * 16

        await wait_for(lambda: kv_credit("r0") == truth(), "A's kv_events credit on r0 == r0's residency")
        assert truth() >= SYS  # at least the system prompt B left there
        placed = rt.core.sessions["A"].replica
        if placed == "r0":
            assert truth() == 600 // 16 * 16  # A's own prompt, every full block
        assert kv_credit("r1") is None  # r1 publishes nothing: usage-derived evidence only
        await router.flushed()
        record = json.loads(await router.redis.hget(keys.SESSIONS, "A") or "{}")
        assert any(c["kind"] == "kv_events" and c["replica"] == "r0" for c in record["cache"])

        # other sessions push everything of A (and the system prompt) out of r0's cache
        for i in range(3):
            await _post(r0.base_url, _body(f"C{i}", 3000))
        await wait_for(lambda: truth() == 0 and kv_credit("r0") == 0, "evicted: A's kv_events credit on r0 is 0")
        assert rt.kv.subscribers["r0"].received > 0 and rt.kv.renders >= 1
        async with aiohttp.ClientSession() as http, http.get(router.url + "/metrics") as r:
            text = await r.text()
        assert 'tao_router_kv_events_synced{replica="r0"} 1.0' in text
        assert 'tao_router_kv_prompt_renders_total{result="ok"}' in text
        assert "tao_router_kv_event_gaps_total" in text


async def test_prompt_ids_from_render_or_tokenize(two: tuple[RunningSim, RunningSim]) -> None:
    """The render API answers the prompt's ids; a vLLM without it (404) is asked ``POST /tokenize``
    with the same messages, and both give the ids the replica computes for that request."""
    from aiohttp import web

    from services.router.core.model import CoreConfig
    from services.router.core.state import RouterCore
    from services.router.kv_events import KvCredit
    from services.sim.vllm_sim.tokenizer import apply_chat_template

    sim = two[1]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there, world"}]
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True}).encode()

    async def tokenize_only(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/render"):
            return web.json_response({"error": {"message": "Not Found", "code": 404}}, status=404)
        async with aiohttp.ClientSession() as http, http.post(sim.base_url + request.path,
                                                              data=await request.read()) as r:
            return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", tokenize_only)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    old = f"http://127.0.0.1:{runner.addresses[0][1]}"
    urls = {"new": sim.base_url, "old": old}
    kv = KvCredit(RouterCore(CoreConfig()), {}, now=lambda: 0.0, base_url=urls.get,
                  headers={"Content-Type": "application/json"}, wake=lambda: None)
    await kv.start()
    try:
        want = apply_chat_template(messages)
        assert await kv.render("new", "/v1/chat/completions", body) == want
        assert await kv.render("old", "/v1/chat/completions", body) == want
        assert await kv.render("gone", "/v1/chat/completions", body) is None
        assert await kv.render("old", "/v1/chat/completions", b"not json") is None
    finally:
        await kv.stop()
        await runner.cleanup()
