"""Exact prompt lengths (services/router/prompt_length.py): a session's first request is counted
by the replica's ``POST /tokenize`` (``tao vllm-sim`` implements vLLM's with its own tokenizer),
so the held request carries exactly the prompt tokens the replica then reports in ``usage``; a
later request keeps the estimate; ``prompt_length=estimate`` never asks; a replica without the
endpoint (404) or slower than ``tokenize_timeout_s`` leaves the estimate, and the metric says
which source each request used."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from router_harness import MODEL, PLANNED, Router, start_router, wait_for

from services.common import keys
from services.common.records import AssignmentRecord, PlanRecord, dump
from services.router.prompt_length import PromptCounter
from services.router.validation import CHARS_PER_TOKEN
from services.sim.vllm_sim.server import RunningSim

TIMEOUT = aiohttp.ClientTimeout(total=30)
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "You are a careful engineer. " * 20},
            {"role": "user", "content": "Fix test_parse: it fails on 'a,b;c'. " * 10}]
BODY = {"model": MODEL, "max_tokens": 3, "tools": TOOLS, "messages": MESSAGES}


async def publish_empty_plan(router: Router) -> None:
    now = time.time()
    rec = PlanRecord(epoch="planner-A", rev=1, policy="tao", solver="exact", solve_ms=0.1, assignments=(),
                     snapshot_at_unix_s=now, created_at_unix_s=now)
    await router.redis.set(keys.epoch_key("planner"), "planner-A")
    await router.redis.set(keys.PLAN, dump(rec))
    await router.redis.publish(keys.PLAN_CHANNEL, dump(rec))
    await wait_for(lambda: router.rt.plans.applied == 1, "plan applied")


def source_count(router: Router, source: str) -> float:
    value = router.rt.ctx.metrics.get_sample_value("tao_router_prompt_length_estimated_total", {"source": source})
    return value or 0.0


async def held_estimate(router: Router, http: aiohttp.ClientSession, sid: str) -> tuple[int, asyncio.Task[None]]:
    async def go() -> None:
        async with http.post(router.url + "/v1/chat/completions", json=BODY, headers={"x-session-id": sid}) as r:
            assert r.status == 200
            await r.read()
    task = asyncio.create_task(go())
    await wait_for(lambda: any(h.session_id == sid for h in router.rt.core.held.values()), f"{sid} held")
    return next(h.prompt_tokens_estimate for h in router.rt.core.held.values() if h.session_id == sid), task


async def test_first_request_is_counted_by_the_replica(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], policy=PLANNED, plan_stale_s=60.0) as router, \
            aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await publish_empty_plan(router)  # a live planner that admits nothing: requests stay held
        async with http.post(sims[0].base_url + "/tokenize", json={k: BODY[k] for k in ("model", "messages", "tools")}) as r:
            exact = (await r.json())["count"]
        estimate, task = await held_estimate(router, http, "s1")
        assert estimate == exact and source_count(router, "tokenize") == 1
        chars = sum(len(m["content"]) + 16 for m in MESSAGES)
        assert exact != chars // CHARS_PER_TOKEN  # the estimate would have been wrong

        r0 = sorted(router.rt.core.replicas)[0]
        now = time.time()
        rec = PlanRecord(epoch="planner-A", rev=2, policy="tao", solver="exact", solve_ms=0.1,
                         assignments=(AssignmentRecord(session="s1", replica=r0),),
                         snapshot_at_unix_s=now, created_at_unix_s=now)
        await router.redis.set(keys.PLAN, dump(rec))
        await router.redis.publish(keys.PLAN_CHANNEL, dump(rec))
        await task
        assert router.rt.core.sessions["s1"].tokens.last_prompt_tokens == exact  # what the replica reported

        async with http.post(router.url + "/v1/chat/completions", json=BODY, headers={"x-session-id": "s1"}) as r:
            assert r.status == 200
        assert source_count(router, "tokenize") == 1 and source_count(router, "estimate") == 1


async def test_estimate_mode_never_asks(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [s.base_url for s in sims], policy=PLANNED, plan_stale_s=60.0,
                            prompt_length="estimate") as router, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        await publish_empty_plan(router)
        estimate, task = await held_estimate(router, http, "s2")
        chars = sum(len(m["content"]) + 16 for m in MESSAGES)
        assert estimate == chars // CHARS_PER_TOKEN and source_count(router, "tokenize") == 0
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def odd_replicas() -> AsyncIterator[tuple[str, str, str]]:
    """Replicas without /tokenize (404), answering it too late, and behind a key."""
    app = web.Application()

    async def slow(_req: web.Request) -> web.Response:
        await asyncio.sleep(2.0)
        return web.json_response({"count": 1, "max_model_len": 10, "tokens": [1]})

    async def keyed(req: web.Request) -> web.Response:  # a replica behind upstream_api_key
        if req.headers.get("Authorization") != "Bearer k":
            return web.json_response({"error": "unauthorized"}, status=401)
        body = await req.json()  # the template fields of the request reach the count
        n = 6 if body.get("chat_template_kwargs") == {"enable_thinking": False} and body.get("tools") else 5
        return web.json_response({"count": n, "max_model_len": 10, "tokens": [1] * n})

    app.router.add_post("/slow/tokenize", slow)
    app.router.add_post("/keyed/tokenize", keyed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/slow", f"http://127.0.0.1:{port}/keyed"
    finally:
        await runner.cleanup()


async def test_missing_or_slow_tokenize_keeps_the_estimate(odd_replicas: tuple[str, str, str]) -> None:
    missing, slow, keyed = odd_replicas
    counter = PromptCounter("tokenize", 0.2, None, CollectorRegistry(), structlog.get_logger())
    await counter.start()
    try:
        body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
        assert await counter.count(body, True, [missing]) is None
        assert missing in counter._no_endpoint
        t0 = time.perf_counter()
        assert await counter.count(body, True, [slow]) is None
        assert time.perf_counter() - t0 < 1.0  # bounded by the timeout, not the replica
        assert counter.sources["estimate"]._value.get() == 2
        assert await counter.count(body, True, [keyed]) is None  # 401 without the router's key
        assert await counter.count(body, True, [keyed], {"Authorization": "Bearer k"}) == 5
        templated = (b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],'
                     b'"chat_template_kwargs":{"enable_thinking":false}}')
        assert await counter.count(templated, True, [keyed], {"Authorization": "Bearer k"}) == 6

        class Local:  # a tokenizer object as transformers gives one
            def apply_chat_template(self, messages: list[dict[str, str]], **kw: object) -> list[int]:
                return [0] * (len(messages) * 7 + (3 if kw.get("tools") else 0))

            def encode(self, text: str) -> list[int]:
                return [0] * len(text.split())

        counter.set_local(Local())
        assert await counter.count(body, True, [missing]) == 7
        assert await counter.count(b'{"model":"m","prompt":"a b c"}', False, []) == 3
        assert counter.sources["local"]._value.get() == 2
    finally:
        await counter.close()
