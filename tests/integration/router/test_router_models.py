"""Model-aware placement and the replicas' real block size through the whole stack (issue 16
items 2 and 3): a two-model fleet of emulated vLLM replicas (two per model, real HTTP), the
router over a real Redis, the planner service over real gRPC (or a per-request policy
routing in the router), driven with the official ``openai`` client.

Every answer must come from a replica serving the model the request named (the replica in
``x-tao-replica`` and the ``model`` of the response), a model no replica serves is vLLM's 404,
and the block size a replica exports in ``vllm:cache_config_info`` (32 on one of them) reaches
the router's replica record, Redis and the planner's snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import openai
import pytest
from router_harness import TIME_SCALE, start_router, wait_for

from services.common import keys
from services.common.records import ReplicaRecord, SessionRecord, load
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.planner.convert import snapshot_from_records
from services.planner.server import PlannerApp
from services.planner.server import Settings as PlannerSettings
from services.sim.engine import get_profile
from services.sim.vllm_sim.server import RunningSim, start_vllm_sim

MODEL_A = "org/model-a"
MODEL_B = "org/model-b"
ALIAS_B = "model-b-alias"  # a second --served-model-name of the model-b replicas
SERVED_B = (ALIAS_B, MODEL_B)  # as the router keeps a replica's /v1/models names: sorted
BLOCKS = 4000


@contextlib.asynccontextmanager
async def two_model_fleet() -> AsyncIterator[dict[str, list[RunningSim]]]:
    """Two replicas of model A (block size 16) and two of model B, one of them with 32-token blocks."""
    profile = get_profile("qwen3-32b-h100x2")
    wide = dataclasses.replace(profile, block_size=32)
    async with start_vllm_sim(profile, time_scale=TIME_SCALE, model_name=MODEL_A, num_gpu_blocks=BLOCKS) as a0, \
            start_vllm_sim(profile, time_scale=TIME_SCALE, model_name=MODEL_A, num_gpu_blocks=BLOCKS) as a1, \
            start_vllm_sim(profile, time_scale=TIME_SCALE, model_name=[MODEL_B, ALIAS_B],
                           num_gpu_blocks=BLOCKS) as b0, \
            start_vllm_sim(wide, time_scale=TIME_SCALE, model_name=[MODEL_B, ALIAS_B],
                           num_gpu_blocks=BLOCKS) as b1:
        yield {MODEL_A: [a0, a1], MODEL_B: [b0, b1]}


def _replica_id(sim: RunningSim) -> str:
    return f"{sim.host}:{sim.port}"  # the router names a replica by its URL's host:port


async def _session(client: openai.AsyncOpenAI, sid: str, model: str, turns: int) -> list[tuple[str, str, str]]:
    """(model asked, model answered, replica) for each turn of one agent session."""
    out = []
    messages: list[dict[str, str]] = [{"role": "user", "content": f"task {sid}: fix the flaky test " * 8}]
    for _ in range(turns):
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=4,  # type: ignore[arg-type]
            extra_headers={"x-session-id": sid})
        reply = raw.parse()
        out.append((model, reply.model, raw.headers["x-tao-replica"]))
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": "the test still fails"}]
    return out


@pytest.mark.parametrize("policy", ["tao", "round_robin"])
async def test_two_model_fleet_never_misroutes_and_unknown_model_is_vllms_404(redis_url: str, policy: str) -> None:
    with_planner = policy == "tao"
    planner_settings = load_settings(PlannerSettings, redis_url=redis_url, port=0, tick_s=0.2, debounce_s=0.01)
    planner = PlannerApp(planner_settings)
    async with two_model_fleet() as fleet, contextlib.AsyncExitStack() as stack:
        serving = {_replica_id(s): model for model, sims in fleet.items() for s in sims}
        router = await stack.enter_async_context(
            start_router(redis_url, [s.base_url for sims in fleet.values() for s in sims], policy=policy,
                         plan_stale_s=2.0))
        await wait_for(lambda: all(r.models for r in router.rt.core.replicas.values()), "every replica's models")
        if with_planner:
            await stack.enter_async_context(serve_in_process("planner", planner, planner_settings))
            await wait_for(lambda: not router.rt.planner_silent(), "planner plans seen")
        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        stack.push_async_callback(client.close)

        fallback_runs = router.rt.fallback_runs
        asked = [(f"s{i}", (MODEL_A, MODEL_B, ALIAS_B)[i % 3]) for i in range(12)]
        results = await asyncio.gather(*(_session(client, sid, model, 3) for sid, model in asked))
        turns = [t for r in results for t in r]
        assert len(turns) == 36
        misrouted = [(m, rep) for m, _, rep in turns if serving[rep] != (MODEL_A if m == MODEL_A else MODEL_B)]
        assert misrouted == []
        # vLLM answers with its first served name whichever alias was asked
        assert all(answered == (MODEL_A if m == MODEL_A else MODEL_B) for m, answered, _ in turns)
        assert {serving[rep] for _, _, rep in turns} == {MODEL_A, MODEL_B}
        if with_planner:  # the planner's plans placed them, not the router's local fallback
            assert router.rt.fallback_runs == fallback_runs

        # sessions carry their model into Redis (the planner's input)
        await router.flushed()
        stored = {r.session_id: r for r in (load(SessionRecord, v)
                                           for v in (await router.redis.hgetall(keys.SESSIONS)).values())}
        assert {sid: stored[sid].model for sid, _ in asked} == dict(asked)

        with pytest.raises(openai.NotFoundError) as err:
            await client.chat.completions.create(model="org/no-such-model", max_tokens=4,
                                                 messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 404
        assert err.value.response.json() == {"error": {
            "message": "The model `org/no-such-model` does not exist.", "type": "NotFoundError", "param": "model",
            "code": 404}}
        assert "org/no-such-model" not in {s.model for s in router.rt.core.sessions.values()}


async def test_replica_block_size_reaches_router_redis_and_planner_snapshot(redis_url: str) -> None:
    async with two_model_fleet() as fleet:
        sims = [s for group in fleet.values() for s in group]
        wide = _replica_id(fleet[MODEL_B][1])
        async with start_router(redis_url, [s.base_url for s in sims]) as router:
            core = router.rt.core
            await wait_for(lambda: core.replicas[wide].block_size == 32, "block size 32 scraped")
            assert {rid: r.block_size for rid, r in core.replicas.items()} == {
                _replica_id(s): 32 if _replica_id(s) == wide else 16 for s in sims}
            # KV capacity is num_gpu_blocks x the replica's own block size
            assert core.replicas[wide].kv_capacity_tokens == BLOCKS * 32
            assert core.replicas[_replica_id(fleet[MODEL_A][0])].kv_capacity_tokens == BLOCKS * 16
            assert core.replicas[wide].models == SERVED_B
            await router.flushed()
            records = [load(ReplicaRecord, v) for v in (await router.redis.hgetall(keys.REPLICAS)).values()]
            assert {r.replica_id: (r.block_size, r.models) for r in records}[wide] == (32, SERVED_B)
            snapshot = snapshot_from_records(0.0, [], records, {})
            states = {r.id: r for r in snapshot.replicas}
            assert states[wide].block_size == 32 and states[wide].models == SERVED_B
            assert states[_replica_id(fleet[MODEL_A][0])].block_size == 16
