"""The gateway over real HTTP to emulated vLLM replicas, real Redis: the official openai
client (sync and async, streaming and not), sticky multi-turn sessions with growing cache
hits, a ThunderAgent-style client, bad input, models/health/metrics, Redis records."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import openai
import pytest
from router_harness import MODEL, start_router, wait_for

from services.common import keys
from services.common.records import SessionRecord, TenantDemandRecord, load
from services.router.auth import hash_entry
from services.sim.vllm_sim.server import RunningSim

MSG = [{"role": "user", "content": "Summarise the repository layout in one line. " * 20}]


async def test_official_openai_client_sync_and_async_stream_and_not(redis_url: str, sims: list[RunningSim]) -> None:
    async with contextlib.AsyncExitStack() as stack, start_router(redis_url, [s.base_url for s in sims]) as router:
        client = await stack.enter_async_context(
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=20))
        reply = await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8)
        assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens > 0
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=6, stream=True)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and all(c.usage is None for c in chunks)  # usage requested upstream, stripped for us
        chunks = [c async for c in await client.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=6, stream=True, stream_options={"include_usage": True})]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
        done = await client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=5)
        assert done.choices[0].text and done.usage is not None
        streamed = [c async for c in await client.completions.create(
            model=MODEL, prompt="The quick brown fox", max_tokens=5, stream=True)]
        assert "".join(c.choices[0].text for c in streamed if c.choices)

        def sync_calls() -> tuple[str, str]:
            sync = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
            one = sync.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4)
            many = sync.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4, stream=True)
            return one.choices[0].message.content or "", "".join(c.choices[0].delta.content or "" for c in many)

        one, many = await asyncio.to_thread(sync_calls)
        assert one and many
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        # single-turn sessions end with their request
        await router.flushed()
        assert router.rt.core.sessions == {} and await router.redis.hlen(keys.SESSIONS) == 0


async def test_multi_turn_session_sticks_and_cached_tokens_grow(redis_url: str, sims: list[RunningSim]) -> None:
    async with contextlib.AsyncExitStack() as stack, start_router(redis_url, [s.base_url for s in sims]) as router:
        client = await stack.enter_async_context(
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=20))
        messages = list(MSG)
        replicas, cached = [], []
        for turn in range(4):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=16, extra_headers={"x-session-id": "agent-1"})
            reply = raw.parse()
            replicas.append(raw.headers["x-tao-replica"])
            details = reply.usage.prompt_tokens_details if reply.usage else None
            cached.append(details.cached_tokens if details and details.cached_tokens else 0)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"Now step {turn}: run the tests."}]
        assert len(set(replicas)) == 1
        assert cached[0] == 0 and cached[1] > 0 and cached[1] < cached[2] < cached[3]
        await router.flushed()
        record = load(SessionRecord, await router.redis.hget(keys.SESSIONS, "agent-1"))
        assert record.epoch == router.rt.ctx.epoch and record.rev > 0
        assert record.phase == "ACTING" and record.admitted and record.replica == replicas[0]
        assert record.requests == 4 and record.last_cached_tokens == cached[3]
        assert record.cache[0].kind == "cached_tokens" and record.cache[0].replica == replicas[0]
        assert record.footprint_tokens > record.context_tokens > 0 and record.last_ttft_s is not None
        demand = load(TenantDemandRecord, await router.redis.hget(keys.DEMAND, "default"))
        assert demand.in_flight == 0 and demand.waiting == 0 and demand.p99_latency_s > 0
        # the slot hold runs from admission to the response's end: within the latency from arrival
        assert 0 < demand.p99_hold_s <= demand.p99_latency_s


async def test_thunderagent_style_client_and_program_release(redis_url: str, sims: list[RunningSim]) -> None:
    async with contextlib.AsyncExitStack() as stack, start_router(redis_url, [s.base_url for s in sims]) as router:
        client = await stack.enter_async_context(
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=20))
        for _ in range(2):
            await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4,
                                                 extra_body={"program_id": "prog-7"})
        assert router.rt.core.sessions["prog-7"].tokens.requests == 2
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            body = {"model": MODEL, "messages": MSG, "max_tokens": 4, "extra_body": {"program_id": "prog-8"}}
            async with http.post(router.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
            assert "prog-8" in router.rt.core.sessions
            for pid, expected in (("prog-7", True), ("prog-7", False)):
                async with http.post(router.url + "/programs/release", json={"program_id": pid}) as resp:
                    assert resp.status == 200 and await resp.json() == {"program_id": pid, "released": expected}
            async with http.post(router.url + "/programs/release", json={}) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["param"] == "program_id"
            async with http.post(router.url + "/v1/sessions/prog-8/release") as resp:
                assert resp.status == 200 and (await resp.json())["released"] is True
            async with http.post(router.url + "/v1/sessions/prog-8/release") as resp:
                assert resp.status == 404 and (await resp.json())["error"]["code"] == "session_not_found"
        await router.flushed()
        assert await router.redis.hexists(keys.SESSIONS, "prog-7") is False
        assert router.rt.core.sessions == {}


async def _post(http: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str] | None = None
                ) -> tuple[int, dict[str, object]]:
    async with http.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as resp:
        return resp.status, await resp.json()


async def test_bad_input_gets_openai_errors_and_changes_nothing(redis_url: str, sims: list[RunningSim],
                                                                tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"keys": [hash_entry("A", "sk-good", use_scrypt=False)]}))
    async with start_router(redis_url, [sims[0].base_url], api_keys_file=str(keys_file),
                            max_body_bytes=64 * 1024) as router:
        url = router.url + "/v1/chat/completions"
        good = {"Authorization": "Bearer sk-good", "x-session-id": "s-bad"}
        ok = json.dumps({"model": MODEL, "messages": MSG, "max_tokens": 2}).encode()
        cases = [
            (b"{broken", good, 400, "invalid_json"),
            (json.dumps({"model": MODEL, "messages": "hi"}).encode(), good, 400, "invalid_type"),
            (json.dumps({"model": MODEL, "messages": MSG, "max_tokens": "2"}).encode(), good, 400, "invalid_type"),
            (json.dumps({"model": MODEL}).encode(), good, 400, "missing_required_parameter"),
            (json.dumps({"model": "no-such-model", "messages": MSG}).encode(), good, 404, 404),  # vLLM's code
            (json.dumps({"model": MODEL, "messages": MSG, "pad": "x" * 70_000}).encode(), good, 413,
             "request_too_large"),
            (ok, {"Authorization": "Bearer sk-wrong"}, 401, "invalid_api_key"),
            (ok, {}, 401, "invalid_api_key"),
            (ok, {**good, "x-session-id": "s" * 300}, 400, "invalid_value"),
        ]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for data, headers, status, code in cases:
                got, body = await _post(http, url, data, headers)
                assert got == status, (code, body)
                error = body["error"]
                assert isinstance(error, dict) and error["code"] == code
                assert set(error) == {"message", "type", "param", "code"} and error["message"]
            async with http.get(router.url + "/v1/models") as resp:
                assert resp.status == 401
            await router.flushed()
            assert router.rt.core.sessions == {} and router.rt.core.held == {} and router.rt.core.in_flight == {}
            assert await router.redis.hlen(keys.SESSIONS) == 0 and await router.redis.hlen(keys.DEMAND) == 0
            got, body = await _post(http, url, ok, good)
            assert got == 200, body
            assert router.rt.core.sessions["s-bad"].tenant == "A"
            # the same session id cannot be used by another tenant's request... nor without a key
            got, body = await _post(http, url, ok, {"x-session-id": "s-bad"})
            assert got == 401


async def test_health_metrics_and_models_survive_a_dead_replica(redis_url: str, sims: list[RunningSim]) -> None:
    async with start_router(redis_url, [sims[0].base_url, "http://127.0.0.1:9"]) as router:
        await wait_for(lambda: not router.rt.core.replicas["127.0.0.1:9"].healthy and
                       router.rt.core.replicas[sims[0].base_url.split("//")[1]].healthy, "probes")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.get(router.url + "/v1/models") as resp:
                assert resp.status == 200 and [m["id"] for m in (await resp.json())["data"]] == [MODEL]
            async with http.get(router.url + "/health") as resp:
                body = await resp.json()
                assert resp.status == 200 and body["replicas"] == {"healthy": 1, "total": 2}
            for _ in range(3):  # never routed to the dead replica
                async with http.post(router.url + "/v1/chat/completions",
                                     json={"model": MODEL, "messages": MSG, "max_tokens": 2}) as resp:
                    assert resp.status == 200 and resp.headers["x-tao-replica"] != "127.0.0.1:9"
            async with http.get(router.url + "/metrics") as resp:
                text = await resp.text()
        assert 'tao_router_requests_total{code="200",endpoint="/v1/chat/completions"} 3.0' in text
        assert 'tao_router_replica_healthy{replica="127.0.0.1:9"} 0.0' in text
        # an unlabelled histogram prints its buckets before any observation: check the counts,
        # one hold and one time-to-first-byte per forwarded request
        assert "tao_router_hold_seconds_count 3.0" in text
        # holds of minutes to hours stay visible (a paused session is held up to 30 min)
        assert 'tao_router_hold_seconds_bucket{le="3600.0"} 3.0' in text
        assert 'tao_router_hold_seconds_bucket{le="14400.0"} 3.0' in text
        assert "tao_router_ttft_seconds_count 3.0" in text


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
async def test_per_request_policies_route_without_a_planner(redis_url: str, sims: list[RunningSim],
                                                            policy: str) -> None:
    async with contextlib.AsyncExitStack() as stack, \
            start_router(redis_url, [s.base_url for s in sims], policy=policy) as router:
        client = await stack.enter_async_context(
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=20))
        seen = []
        for _ in range(4):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MSG, max_tokens=2, extra_headers={"x-session-id": "rr"})
            seen.append(raw.headers["x-tao-replica"])
        if policy == "round_robin":
            assert len(set(seen)) == 2  # not sticky: alternates
        else:
            assert len(set(seen)) == 1  # Dynamo's cost follows the cache overlap
        assert not router.rt.core.sessions["rr"].admitted
