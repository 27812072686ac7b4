"""``bench/peers/dynamo_kv.py``'s HTTP front (the ``dynamo:kv`` peer) over two real emulated
replicas, with a recording stand-in for Dynamo's ``KvRouter``: ``ai-dynamo-runtime`` is a peer,
installed only into the peers' venv by ``python -m bench.peers``, never into this package's
environment, so CI cannot run Dynamo itself. The stand-in has ``KvRouter``'s custom-routing API
(``best_worker`` with a request id, ``mark_prefill_complete``, ``free``) and records the calls; what
is checked is the front's side of that contract: the router is asked with the prompt's token ids
exactly as the engine will hash them, the request goes unchanged to the replica it chose, and the
request's lifecycle reaches the router in order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bench.peers import dynamo_kv
from services.sim.vllm_sim.server import RunningSim, start_vllm_sim

MODEL = "Qwen/Qwen3-32B"


class RecordingRouter:
    """``KvRouter``'s custom-routing calls, answering ``choose`` for every request."""

    def __init__(self, choose: int) -> None:
        self.choose = choose
        self.calls: list[tuple[str, Any]] = []

    async def best_worker(self, token_ids: list[int], request_id: str | None = None) -> tuple[int, int, int]:
        self.calls.append(("best_worker", (list(token_ids), request_id)))
        return self.choose, 0, 0

    async def mark_prefill_complete(self, request_id: str) -> None:
        self.calls.append(("mark_prefill_complete", request_id))

    async def free(self, request_id: str) -> None:
        self.calls.append(("free", request_id))


@pytest.fixture
async def replicas() -> AsyncIterator[list[RunningSim]]:
    async with start_vllm_sim(time_scale=200.0, num_gpu_blocks=2000) as a, \
            start_vllm_sim(time_scale=200.0, num_gpu_blocks=2000) as b:
        yield [a, b]


async def _front(router: RecordingRouter, reps: list[RunningSim]) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(dynamo_kv.front_app(router, {11: reps[0].base_url, 22: reps[1].base_url}))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _body(session: str, prompt_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "fix the parser"}], "max_tokens": 5,
            "stream": stream, "tao_synthetic": {"session_id": session, "prompt_tokens": prompt_tokens,
                                                "shared_prefix_id": "sys", "system_prompt_tokens": 256}}


@pytest.mark.parametrize("stream", [False, True])
async def test_the_router_chooses_on_the_engines_token_ids_and_the_request_runs_there(
        replicas: list[RunningSim], stream: bool) -> None:
    router = RecordingRouter(choose=22)
    runner, url = await _front(router, replicas)
    try:
        body = _body("s1", 1500, stream)
        async with aiohttp.ClientSession() as http:
            async with http.post(replicas[0].base_url + "/v1/chat/completions/render", json=body) as resp:
                expected = (await resp.json())["token_ids"]
            async with http.post(url + "/v1/chat/completions", json=body, headers={"x-session-id": "s1"}) as resp:
                assert resp.status == 200
                text = await resp.text()
            async with http.get(url + "/routed") as resp:
                routed = await resp.json()
    finally:
        await runner.cleanup()
    if stream:
        lines = [ln for ln in text.splitlines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and "\"finish_reason\":\"length\"" in lines[-2]
    else:
        assert json.loads(text)["usage"]["prompt_tokens"] == 1500
    assert len(expected) == 1500
    (name, (tokens, rid)), mark, free = router.calls
    assert name == "best_worker" and tokens == expected and rid
    assert mark == ("mark_prefill_complete", rid) and free == ("free", rid)
    assert routed == {replicas[0].base_url: 0, replicas[1].base_url: 1}
    assert replicas[1].engine.generation_tokens_total == 5 and replicas[0].engine.generation_tokens_total == 0


async def test_a_prompt_the_replica_refuses_is_answered_with_its_4xx_and_never_routed(
        replicas: list[RunningSim]) -> None:
    router = RecordingRouter(choose=11)
    runner, url = await _front(router, replicas)
    try:
        async with aiohttp.ClientSession() as http:
            # past max_model_len (2000 blocks of 16 tokens): vLLM's 400, from the render
            async with http.post(url + "/v1/chat/completions", json=_body("big", 40_000, False)) as resp:
                status, err = resp.status, await resp.json()
            async with http.post(url + "/v1/completions", json={"model": MODEL}) as resp:
                missing = resp.status
    finally:
        await runner.cleanup()
    assert status == 400 and err["error"]["code"] == 400, err
    assert missing == 400
    assert router.calls == []
    assert replicas[0].engine.generation_tokens_total == 0 and replicas[1].engine.generation_tokens_total == 0
