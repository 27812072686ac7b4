"""Tool detection from answers (services/router/core/tools.py, tool_events.py): the official
openai client calls tools through the router in front of ``tao vllm-sim`` (which answers a
request carrying ``tools`` with a call of the first one), streamed and not; the router reports
each call to a real predictor service as a tool event (started at the answer's end, finished at
the session's next request), under the history key a ``ToolReporter`` reporting the same
``(tool, command)`` gives; a harness's own reports win over the router's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis
from router_harness import MODEL, Router, start_router, wait_for

from services.common import keys
from services.common.records import PredictionRecord, load
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.predictor.core.events import INFERRED_CALL_PREFIX
from services.predictor.reporter import AsyncToolReporter
from services.predictor.server import PredictorApp
from services.predictor.server import Settings as PredictorSettings
from services.predictor.service import PredictorEngine
from services.sim.vllm_sim.server import RunningSim

COMMAND = "cd /repo && pytest -x tests/test_parse.py"
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def first_turn() -> list[Any]:
    return [{"role": "system", "content": "fix the bug"}, {"role": "user", "content": COMMAND}]


@pytest.fixture
async def predictor(redis_url: str) -> AsyncIterator[tuple[str, PredictorApp]]:
    st = load_settings(PredictorSettings, redis_url=redis_url, port=0, tick_s=0.01, exploration_probability=0.0,
                       redis_startup_timeout_s=5.0, log_level="warning")
    app = PredictorApp(st)
    async with serve_in_process("predictor", app, st) as running:
        yield running.address, app


async def prediction(r: aioredis.Redis, sid: str) -> PredictionRecord | None:
    raw = await r.hget(keys.PREDICTIONS, sid)
    return None if raw is None else load(PredictionRecord, raw)


async def wait_prediction(router: Router, sid: str, want: Any, what: str) -> PredictionRecord:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        rec = await prediction(router.redis, sid)
        if rec is not None and want(rec):
            return rec
        await router.rt.tool_events.reporter.flush(0.2)  # type: ignore[union-attr]
    raise AssertionError(f"timed out: {what}; last {await prediction(router.redis, sid)}")


def samples(engine: PredictorEngine, tool: str, command: str) -> int:
    key = engine.core.estimator.info(tool, command).key_command
    history = engine.core.history.get(key)
    return 0 if history is None else len(history)


async def test_tool_calls_become_tool_events(redis_url: str, sims: list[RunningSim],
                                             predictor: tuple[str, PredictorApp]) -> None:
    address, app = predictor
    assert app.engine is not None
    engine = app.engine
    async with start_router(redis_url, [s.base_url for s in sims], predictor_address=address) as router, \
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
        # non-streamed: the answer's tool call starts a call at the predictor
        msgs = first_turn()
        out = await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=64,
                                                   extra_headers={"x-session-id": "s1"})
        [call] = out.choices[0].message.tool_calls or []
        assert out.choices[0].finish_reason == "tool_calls"
        assert json.loads(call.function.arguments)["command"] == COMMAND  # type: ignore[union-attr]
        rec = await wait_prediction(router, "s1", lambda p: p.call_id.startswith(INFERRED_CALL_PREFIX),
                                    "s1's inferred call")
        assert rec.tool == "bash" and not rec.completed
        assert router.rt.core.phase(router.rt.core.sessions["s1"]) == "ACTING"

        # the next request (streamed) carries the tool's result: the call finished, history learned
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "1 passed"}]
        stream = await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=4,
                                                      stream=True, extra_headers={"x-session-id": "s1"})
        async for chunk in stream:
            assert not (chunk.choices and chunk.choices[0].delta.tool_calls)
        await wait_prediction(router, "s1", lambda p: p.completed, "s1's call finished")
        assert samples(engine, "bash", COMMAND) == 1

        # a streamed answer's tool call is assembled from its delta fragments
        stream = await client.chat.completions.create(model=MODEL, messages=first_turn(), tools=TOOLS,
                                                      max_tokens=64, stream=True, extra_headers={"x-session-id": "s2"})
        async for _ in stream:
            pass
        rec = await wait_prediction(router, "s2", lambda p: p.call_id.startswith(INFERRED_CALL_PREFIX),
                                    "s2's inferred call")
        assert rec.tool == "bash"

        # a ToolReporter reporting the same (tool, command) feeds the same history key
        reporter = AsyncToolReporter(address, runner_id="harness")
        await reporter.start()
        reporter.start_call("h1", "bash", COMMAND).finish()
        assert await reporter.flush(5.0)
        await wait_for(lambda: samples(engine, "bash", COMMAND) == 2, "reporter's sample under the same key")

        # a session whose harness reports its own tools: the router's inferred call is ignored
        reporter.start_call("h2", "bash", "make", call_id="own-1").finish()
        assert await reporter.flush(5.0)
        before = router.rt.tool_events.reporter.stats.duplicates  # type: ignore[union-attr]
        await client.chat.completions.create(model=MODEL, messages=first_turn(), tools=TOOLS, max_tokens=64,
                                             extra_headers={"x-session-id": "h2"})
        await wait_for(lambda: router.rt.tool_events.reporter.stats.duplicates > before,  # type: ignore[union-attr]
                       "inferred call answered as a duplicate")
        own = await prediction(router.redis, "h2")
        assert own is not None and own.call_id == "own-1"
        await reporter.close()
        assert router.rt.ctx.metrics.get_sample_value("tao_router_tool_calls_detected_total") == 3


async def test_answers_without_tools_report_nothing(redis_url: str, sims: list[RunningSim],
                                                    predictor: tuple[str, PredictorApp]) -> None:
    address, _ = predictor
    async with start_router(redis_url, [s.base_url for s in sims], predictor_address=address) as router, \
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
        await client.chat.completions.create(model=MODEL, messages=first_turn(), max_tokens=4,
                                             extra_headers={"x-session-id": "t1"})
        stream = await client.chat.completions.create(model=MODEL, messages=first_turn(), max_tokens=4, stream=True,
                                                      extra_headers={"x-session-id": "t1"})
        async for _ in stream:
            pass
        assert router.rt.ctx.metrics.get_sample_value("tao_router_tool_calls_detected_total") == 0
        assert router.rt.tool_events.reporter is not None and router.rt.tool_events.reporter.stats.queued == 0


async def test_history_from_answers_predicts_the_next_call(redis_url: str, sims: list[RunningSim],
                                                           predictor: tuple[str, PredictorApp]) -> None:
    """Three sessions run the same command for ~0.2 s between answer and next request; the
    fourth session's call is predicted from that history (evidence tool_history, Ê near
    0.2 s), where without it the predictor would say its 5 s default."""
    address, _ = predictor
    async with start_router(redis_url, [s.base_url for s in sims], predictor_address=address) as router, \
            openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as client:
        for i in range(4):
            sid = f"h{i}"
            msgs = first_turn()
            out = await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=64,
                                                       extra_headers={"x-session-id": sid})
            [call] = out.choices[0].message.tool_calls or []
            rec = await wait_prediction(router, sid, lambda p: p.call_id.startswith(INFERRED_CALL_PREFIX),
                                        f"{sid}'s call")
            if i == 3:
                assert rec.evidence == "tool_history" and 0.15 <= rec.expected_duration_s <= 1.0, rec
                return
            assert i > 0 or rec.evidence == "default"
            await asyncio.sleep(0.2)  # the tool runs
            msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
            await client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=2,
                                                 extra_headers={"x-session-id": sid})
            await wait_prediction(router, sid, lambda p: p.completed, f"{sid}'s call finished")
