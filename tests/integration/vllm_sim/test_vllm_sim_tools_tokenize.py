"""The emulated replica's tool calls (services/sim/vllm_sim/tools.py) and ``POST /tokenize``, through the
official openai client and plain HTTP: a request with ``tools`` whose last message is the
user's gets a call of the first tool (non-streamed: ``message.tool_calls``; streamed:
``delta.tool_calls`` fragments that the client's accumulation joins into the same call); after
a ``tool`` message the answer is text. ``/tokenize`` counts exactly the prompt tokens a
completion request with the same messages reports."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai

from services.sim.vllm_sim.server import RunningSim
from services.sim.vllm_sim.tokenizer import split

MODEL = "Qwen/Qwen3-32B"
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "bash", "description": "run a shell command",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "finish", "parameters": {"type": "object", "properties": {}}}},
]
USER: list[Any] = [{"role": "system", "content": "you fix bugs"}, {"role": "user", "content": "pytest -x tests/foo.py"}]


async def test_tool_call_unary_and_streamed(sim: RunningSim) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0) as client:
        out = await client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=64)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "bash"
        assert json.loads(call.function.arguments) == {"command": "pytest -x tests/foo.py"}
        assert out.usage is not None
        assert out.usage.completion_tokens == len(split(call.function.arguments))

        stream = await client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=64,
                                                      stream=True)
        name, args, ids, finish = "", "", set(), None
        async for chunk in stream:
            if not chunk.choices:
                continue
            for tc in chunk.choices[0].delta.tool_calls or []:
                assert tc.index == 0
                ids.add(tc.id) if tc.id else None
                name += (tc.function.name or "") if tc.function else ""
                args += (tc.function.arguments or "") if tc.function else ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and name == "bash" and ids == {call.id}
        assert json.loads(args) == {"command": "pytest -x tests/foo.py"}

        after = [*USER, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "1 passed"}]
        text = await client.chat.completions.create(model=MODEL, messages=after, tools=TOOLS, max_tokens=8)
        assert text.choices[0].finish_reason in ("stop", "length") and not text.choices[0].message.tool_calls
        no_tools = await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8)
        assert not no_tools.choices[0].message.tool_calls


async def test_tokenize_matches_prompt_tokens(sim: RunningSim) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0) as client, \
            aiohttp.ClientSession() as http:
        for tools in (None, TOOLS):
            body: dict[str, Any] = {"model": MODEL, "messages": USER, **({"tools": tools} if tools else {})}
            async with http.post(sim.base_url + "/tokenize", json=body) as resp:
                assert resp.status == 200
                tok = await resp.json()
            assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 32768
            if tools:
                out = await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, tools=tools)
            else:
                out = await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
            assert out.usage is not None and out.usage.prompt_tokens == tok["count"]
        async with http.post(sim.base_url + "/tokenize", json={"prompt": "once upon a time"}) as resp:
            assert (await resp.json())["count"] == 4
        async with http.post(sim.base_url + "/tokenize", json={"model": "other", "prompt": "x"}) as resp:
            assert resp.status == 404
        async with http.post(sim.base_url + "/tokenize", json={"messages": "x"}) as resp:
            assert resp.status == 400 and "error" in await resp.json()
