"""HTTP surface details: errors, /metrics, /health, the tao_synthetic extension, aborts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.sim.engine import synthetic_token_id
from services.sim.vllm_sim.server import RunningSim, start_vllm_sim
from services.sim.vllm_sim.tokenizer import LEXICON


async def _post(sim: RunningSim, path: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        data = raw if raw is not None else json.dumps(body).encode()
        async with s.post(sim.base_url + path, data=data, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json(content_type=None)


CHAT = "/v1/chat/completions"
MSG: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (CHAT, {"max_tokens": 5}, 400, "messages"),
        (CHAT, {"messages": "hi"}, 400, "messages"),
        (CHAT, {"messages": [{"content": "no role"}]}, 400, "messages.0"),
        (CHAT, {"model": "gpt-9", "messages": MSG}, 404, "model"),
        (CHAT, {"messages": MSG, "max_tokens": -3}, 400, "max_tokens"),
        (CHAT, {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
        (CHAT, {"messages": MSG, "max_tokens": 2.5}, 400, "max_tokens"),
        (CHAT, {"messages": MSG, "max_tokens": "ten"}, 400, "max_tokens"),
        (CHAT, {"messages": MSG, "max_tokens": True}, 400, "max_tokens"),
        (CHAT, {"messages": MSG, "max_tokens": 10**9}, 400, "max_tokens"),
        (CHAT, {"messages": MSG, "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
        (CHAT, {"messages": MSG, "n": 3}, 400, "n"),
        (CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options"),
        (CHAT, {"messages": MSG, "stream": "yes"}, 400, "stream"),
        (CHAT, {"messages": [{"role": "user", "content": "w " * 40000}]}, 400, "messages"),
        (CHAT, {"messages": MSG, "tao_synthetic": {"session_id": "s"}}, 400, "tao_synthetic"),
        (CHAT, {"messages": MSG, "tao_synthetic": {"session_id": "s", "prompt_tokens": 40000}}, 400, "messages"),
        (CHAT, [1, 2], 400, None),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"prompt": {"x": 1}}, 400, "prompt"),
        ("/v1/completions", {"prompt": "w " * 40000}, 400, "prompt"),
    ],
)
async def test_bad_inputs_answer_like_vllm(sim: RunningSim, path: str, body: Any, status: int,
                                           param: str | None) -> None:
    got, payload = await _post(sim, path, body)
    assert got == status
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["param"] == param and err["message"]
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert sim.engine.num_waiting == 0 and sim.engine.num_running == 0


async def test_invalid_json_is_400_and_openai_client_raises_typed_errors(sim: RunningSim) -> None:
    status, payload = await _post(sim, CHAT, None, raw=b"{not json")
    assert status == 400 and payload["error"]["type"] == "BadRequestError"
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=MSG)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.chat.completions.create(model=sim.server.model_name,
                                             messages=[{"role": "user", "content": "w " * 40000}])


async def test_health_models_and_metrics(sim: RunningSim) -> None:
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
    await client.chat.completions.create(model=sim.server.model_name, messages=MSG, max_tokens=4,
                                         extra_body={"ignore_eos": True})
    async with aiohttp.ClientSession() as s:
        async with s.get(sim.base_url + "/health") as r:
            assert r.status == 200 and await r.read() == b""
        async with s.get(sim.base_url + "/v1/models") as r:
            models = await r.json()
            assert models["data"][0]["max_model_len"] == 32768
        async with s.get(sim.base_url + "/metrics") as r:
            text = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert int(info["block_size"]) * int(info["num_gpu_blocks"]) == sim.engine.capacity_tokens
    for name, kind in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prefix_cache_queries", "counter"),
                       ("vllm:prefix_cache_hits", "counter"), ("vllm:prompt_tokens", "counter"),
                       ("vllm:generation_tokens", "counter"), ("vllm:num_preemptions", "counter"),
                       ("vllm:request_success", "counter"), ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:inter_token_latency_seconds", "histogram"),
                       ("vllm:e2e_request_latency_seconds", "histogram")]:
        fam = fams[name]
        assert fam.type == kind, name
        assert all(s.labels["model_name"] == sim.server.model_name and s.labels["engine"] == "0"
                   for s in fam.samples), name

    def value(name: str, **labels: str) -> float:
        return next(s.value for f in fams.values() for s in f.samples
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("vllm:request_success_total", finished_reason="length") == 1
    # a series per vLLM finish reason, those never reached at 0 (vllm/v1/metrics/loggers.py)
    assert value("vllm:request_success_total", finished_reason="error") == 0
    assert value("vllm:request_success_total", finished_reason="repetition") == 0
    assert value("vllm:generation_tokens_total") == 4
    # not vLLM's: model seconds spent in engine steps (4 steps of a 32B decode: tens of ms each)
    assert 0.01 < value("tao_vllm_sim_busy_seconds_total") < 5.0
    assert value("vllm:prompt_tokens_total") == value("vllm:prefix_cache_queries_total") > 0
    assert value("vllm:time_to_first_token_seconds_count") == 1
    assert value("vllm:inter_token_latency_seconds_count") == 3


async def test_tao_synthetic_extension(sim: RunningSim) -> None:
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
    model = sim.server.model_name

    async def turn(prompt_tokens: int, max_tokens: int, session: str = "sess-1") -> Any:
        return await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "ignored"}], max_tokens=max_tokens,
            extra_body={"tao_synthetic": {"session_id": session, "prompt_tokens": prompt_tokens,
                                          "shared_prefix_id": "sys-A", "system_prompt_tokens": 1000}})

    r1 = await turn(3000, 50)
    assert r1.usage.prompt_tokens == 3000 and r1.usage.completion_tokens == 50
    assert r1.choices[0].finish_reason == "length" and r1.usage.prompt_tokens_details is None
    words = r1.choices[0].message.content.split()
    assert words[0] == LEXICON[synthetic_token_id("sess-1", 3000) % len(LEXICON)]
    # Next turn = previous prompt + output + 200 appended tokens: all computed blocks hit.
    r2 = await turn(3250, 10)
    assert r2.usage.prompt_tokens_details.cached_tokens == (3000 + 50 - 1) // 16 * 16
    # Another session shares only the full blocks of the 1000-token system prompt.
    r3 = await turn(1500, 5, session="sess-2")
    assert r3.usage.prompt_tokens_details.cached_tokens == 1000 // 16 * 16
    # Completions endpoint accepts the same extension.
    c: Any = await client.completions.create(model=model, prompt="x", max_tokens=3, extra_body={
        "tao_synthetic": {"session_id": "sess-1", "prompt_tokens": 3300, "shared_prefix_id": "sys-A",
                          "system_prompt_tokens": 1000}})
    assert c.usage.prompt_tokens == 3300 and c.usage.prompt_tokens_details.cached_tokens >= 3248


async def test_tao_synthetic_in_metadata(sim: RunningSim) -> None:
    """sglang-router rebuilds each request from its own schema: it drops unknown top-level
    fields (``tao_synthetic``, ``program_id``, ``vllm_xargs``, ``user``) but forwards OpenAI's
    ``metadata`` map, so the extension also travels there as JSON text."""
    spec = {"session_id": "meta-1", "prompt_tokens": 2000, "shared_prefix_id": None, "system_prompt_tokens": 0}
    body = {"messages": MSG, "max_completion_tokens": 4, "ignore_eos": True,
            "metadata": {"tao_synthetic": json.dumps(spec), "other": "kept"}}
    status, payload = await _post(sim, CHAT, body)
    assert status == 200 and payload["usage"]["prompt_tokens"] == 2000
    assert payload["usage"]["completion_tokens"] == 4
    # the top-level field wins over metadata
    status, payload = await _post(sim, CHAT, {**body, "tao_synthetic": {**spec, "prompt_tokens": 2100}})
    assert status == 200 and payload["usage"]["prompt_tokens"] == 2100
    # metadata without the key: an ordinary prompt
    status, payload = await _post(sim, CHAT, {"messages": MSG, "max_tokens": 2, "metadata": {"a": "b"}})
    assert status == 200 and payload["usage"]["prompt_tokens"] < 50
    for bad in ("{not json", 7):
        status, payload = await _post(sim, CHAT, {**body, "metadata": {"tao_synthetic": bad}})
        assert status == 400 and payload["error"]["param"] == "metadata"


async def test_client_disconnect_aborts_request() -> None:
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=5.0) as sim:
        async with aiohttp.ClientSession() as s:
            body = {"messages": MSG, "max_tokens": 5000, "ignore_eos": True, "stream": True}
            async with s.post(sim.base_url + CHAT, json=body) as r:
                assert r.status == 200
                await r.content.readline()  # first chunk arrived
        for _ in range(200):
            if not sim.engine.has_work():
                break
            await asyncio.sleep(0.01)
        assert not sim.engine.has_work() and sim.engine.kv_cache_usage == 0.0
        assert sim.server.metrics.success["abort"]._value.get() == 1


async def test_time_scale_paces_wall_clock() -> None:
    loop = asyncio.get_running_loop()
    async with start_vllm_sim("qwen3-32b-h100x2", port=0, time_scale=4.0) as sim:
        client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
        t0 = loop.time()
        r = await client.chat.completions.create(model=sim.server.model_name, messages=MSG, max_tokens=40,
                                                 extra_body={"ignore_eos": True})
        wall = loop.time() - t0
        assert r.usage is not None and r.usage.completion_tokens == 40
        model_s = sim.engine.busy_time_s
        assert model_s > 0.5  # 40 decode steps of ~15 ms
        assert wall >= 0.9 * model_s / 4.0
        assert wall < model_s / 4.0 + 0.5


async def test_render_endpoints_answer_prompt_token_ids_like_vllm(sim: RunningSim) -> None:
    """vLLM's render API (vllm/entrypoints/serve/render): the prompt's token ids as a
    GenerateRequest, nothing generated. vllm-router asks it for token-level prefix routing
    (cache_aware, program scheduling) and falls back to the request text when it is 404."""
    from services.sim.vllm_sim.tokenizer import apply_chat_template, encode

    status, body = await _post(sim, CHAT + "/render", {"messages": MSG, "max_tokens": 7})
    assert status == 200 and body["token_ids"] == apply_chat_template(MSG)
    assert body["sampling_params"]["max_tokens"] == 7 and body["model"] == sim.server.model_name
    assert body["features"] is None and body["stream"] is False and isinstance(body["request_id"], str)
    syn = {"session_id": "r-1", "prompt_tokens": 3000, "shared_prefix_id": "sys-R", "system_prompt_tokens": 1000}
    for n in (3000, 1200, 3500):  # grows, shrinks, grows again: the cached id text stays exact
        status, body = await _post(sim, CHAT + "/render", {"messages": MSG, "stream": True,
                                                           "tao_synthetic": {**syn, "prompt_tokens": n}})
        assert status == 200 and len(body["token_ids"]) == n
        assert body["token_ids"][0] == synthetic_token_id("sys-R", 0)
        assert body["token_ids"][-1] == synthetic_token_id("r-1", n - 1)
    status, body = await _post(sim, "/v1/completions/render", {"prompt": "hello world", "max_tokens": 2})
    assert status == 200 and isinstance(body, list) and body[0]["token_ids"] == encode("hello world")
    status, body = await _post(sim, CHAT + "/render", {"messages": "x"})
    assert status == 400 and body["error"]["param"] == "messages"
    assert sim.engine.has_work() is False  # nothing was scheduled
