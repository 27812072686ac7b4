"""The official `openai` client against `tao vllm-sim` (sync over a subprocess, async in-process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import openai

from services.sim.vllm_sim.server import RunningSim

LONG_SYSTEM = " ".join(f"rule{i} says do thing{i % 37} carefully" for i in range(400))


def test_sync_client_chat_and_completions(sim_process: Any) -> None:
    client = openai.OpenAI(base_url=sim_process.base_url + "/v1", api_key="none", max_retries=0)
    [model] = client.models.list().data
    assert model.id == "tao-test-model"

    r = client.chat.completions.create(model="tao-test-model", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=7, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details is None
    assert len((r.choices[0].message.content or "").split()) == 7

    chunks = list(client.chat.completions.create(
        model="tao-test-model", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5

    c = client.completions.create(model="tao-test-model", prompt="once upon a time", max_tokens=4,
                                  extra_body={"ignore_eos": True})
    assert c.object == "text_completion" and c.usage is not None and c.usage.completion_tokens == 4
    sc = list(client.completions.create(model="tao-test-model", prompt="once upon a time", max_tokens=4,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True}))
    assert "".join(x.choices[0].text for x in sc if x.choices) == c.choices[0].text
    assert sc[-1].usage is not None and sc[-1].usage.total_tokens == c.usage.total_tokens


def test_second_request_sharing_long_prefix_reports_cached_tokens(sim_process: Any) -> None:
    client = openai.OpenAI(base_url=sim_process.base_url + "/v1", api_key="none", max_retries=0)
    msgs: list[Any] = [{"role": "system", "content": LONG_SYSTEM}]
    first = client.chat.completions.create(model="tao-test-model", messages=[*msgs, {"role": "user", "content": "a"}],
                                           max_tokens=2)
    assert first.usage is not None and first.usage.prompt_tokens > 2000
    assert first.usage.prompt_tokens_details is None
    second = client.chat.completions.create(model="tao-test-model",
                                            messages=[*msgs, {"role": "user", "content": "b"}], max_tokens=2)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 < cached < second.usage.prompt_tokens
    assert cached % 16 == 0 and cached >= second.usage.prompt_tokens - 32


async def test_async_client_multi_turn_hits_previous_turn(sim: RunningSim) -> None:
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
    model = sim.server.model_name
    messages: list[Any] = [{"role": "system", "content": LONG_SYSTEM}]
    prev_total = 0
    for turn in range(3):
        messages.append({"role": "user", "content": f"step {turn}: run the tests and report"})
        stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=40, stream=True,
                                                      stream_options={"include_usage": True},
                                                      extra_body={"ignore_eos": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None and usage.completion_tokens == 40
        if turn == 0:
            assert usage.prompt_tokens_details is None
        else:
            # Everything the previous turn computed (prompt + all outputs but the last) is reused,
            # rounded down to full blocks.
            assert usage.prompt_tokens_details is not None
            assert usage.prompt_tokens_details.cached_tokens == (prev_total - 1) // 16 * 16
        prev_total = usage.prompt_tokens + usage.completion_tokens
        messages.append({"role": "assistant", "content": text})


async def test_64_concurrent_streaming_clients(sim: RunningSim) -> None:
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
    model = sim.server.model_name

    async def one(i: int) -> tuple[int, int]:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"client {i} " * (i + 1)}], max_tokens=30,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        pieces, usage = 0, None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces += len(chunk.choices[0].delta.content.split())
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None
        return pieces, usage.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(64)))
    assert results == [(30, 30)] * 64
    assert sim.engine.num_running == 0 and sim.engine.kv_cache_usage == 0.0


async def test_eos_emulation_and_min_tokens(sim: RunningSim) -> None:
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)
    model = sim.server.model_name
    r = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}],
                                             max_tokens=2000)
    assert r.choices[0].finish_reason == "stop" and r.usage is not None
    n = r.usage.completion_tokens
    assert 8 <= n < 2000
    again = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}],
                                                 max_tokens=2000)
    assert again.choices[0].message.content == r.choices[0].message.content  # deterministic
    forced = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}],
                                                  max_tokens=2000, extra_body={"min_tokens": n + 5})
    assert forced.usage is not None and forced.usage.completion_tokens == n + 5
    capped = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "q"}],
                                                  max_tokens=3)
    assert capped.choices[0].finish_reason == "length"


def test_cli_sigterm_stops_cleanly(sim_spawner: Any) -> None:
    p = sim_spawner.spawn("--profile", "qwen2.5-3b-h200", "--num-gpu-blocks", "4096")
    client = openai.OpenAI(base_url=p.base_url + "/v1", api_key="none", max_retries=0)
    assert client.models.list().data[0].id == "Qwen/Qwen2.5-3B-Instruct"
    assert sim_spawner.stop(p) == 0


def test_cli_rejects_impossible_config() -> None:
    out = subprocess.run([sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", "--num-gpu-blocks", "1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "num_gpu_blocks" in out.stderr
