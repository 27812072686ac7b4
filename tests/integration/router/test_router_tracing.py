"""OpenTelemetry tracing through the real router (SDK in-memory exporter): the span tree of a
request held by the plan and then admitted (SERVER span continuing the client's traceparent ->
router.hold with the reason and the releasing plan's revision -> router.upstream with a
first_byte event), the replica receiving a traceparent in the client's trace; and with tracing
off (the default), no tracer provider and no traceparent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from router_harness import MODEL, PLANNED, start_router, wait_for

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_router_admission import publish_plan

from services.common import tracing
from services.sim.vllm_sim.server import RunningSim, SimServer, start_vllm_sim

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 30}], "max_tokens": 3, "stream": True}


@pytest.fixture
async def traced_sim(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[RunningSim, list[dict[str, str]]]]:
    """One emulated replica that records the headers of every completion request."""
    seen: list[dict[str, str]] = []
    chat = SimServer.chat

    async def recording_chat(self: SimServer, request: Any) -> Any:
        seen.append(dict(request.headers))
        return await chat(self, request)

    monkeypatch.setattr(SimServer, "chat", recording_chat)
    async with start_vllm_sim(time_scale=100.0) as sim:
        yield sim, seen


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_held_then_admitted_request_span_tree(redis_url: str, exporter: InMemorySpanExporter,
                                                    traced_sim: tuple[RunningSim, list[dict[str, str]]]) -> None:
    sim, seen = traced_sim
    async with start_router(redis_url, [sim.base_url], policy=PLANNED, plan_stale_s=60.0, hold_timeout_s=0.3) as router, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await publish_plan(router, "planner-A", 1, {})  # a live planner that admits nobody yet
        await wait_for(lambda: not router.rt.planner_silent(), "planner alive")

        async def call() -> tuple[int, bytes]:
            async with http.post(router.url + "/v1/chat/completions", json=BODY,
                                 headers={"x-session-id": "traced",
                                          "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}) as resp:
                return resp.status, await resp.read()

        task = asyncio.create_task(call())
        await wait_for(lambda: "traced" in router.rt.core.sessions and router.rt.core.held, "request held")
        await asyncio.sleep(0.1)
        assert not task.done()
        await publish_plan(router, "planner-A", 2, {"traced": sorted(router.rt.core.replicas)[0]})
        status, body = await asyncio.wait_for(task, 10)
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        await wait_for(lambda: any(s.kind == SpanKind.SERVER for s in exporter.get_finished_spans()),
                       "server span ended")

    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER and s.name.startswith("POST")]
    (hold,) = _by_name(spans, "router.hold")
    (upstream,) = _by_name(spans, "router.upstream")
    # the SERVER span continues the client's trace
    assert server.context.trace_id == int(TRACE_ID, 16)
    assert server.parent is not None and server.parent.span_id == int(CLIENT_SPAN, 16) and server.parent.is_remote
    assert server.attributes["tao.session_id"] == "traced" and server.attributes["tao.tenant"] == "default"
    # hold and upstream attempt are children of it, in that order, inside it
    for child in (hold, upstream):
        assert child.context.trace_id == server.context.trace_id
        assert child.parent is not None and child.parent.span_id == server.context.span_id
        assert server.start_time <= child.start_time and child.end_time <= server.end_time
    assert hold.end_time <= upstream.start_time
    assert hold.attributes["tao.hold.kind"] == "plan"
    assert hold.attributes["tao.hold.reason"] == "waiting for admission by the plan"
    assert hold.attributes["tao.plan.revision"] == 2 and hold.attributes["tao.plan.epoch"] == "planner-A"
    assert hold.end_time - hold.start_time >= 0.1e9
    assert upstream.kind == SpanKind.CLIENT and upstream.attributes["tao.attempt"] >= 0
    assert upstream.attributes["http.response.status_code"] == 200
    assert [e.name for e in upstream.events] == ["first_byte"]
    # the replica got a traceparent in the client's trace, its parent the upstream attempt
    (headers,) = seen
    version, trace_id, parent_id, _flags = headers["traceparent"].split("-")
    assert (version, trace_id, int(parent_id, 16)) == ("00", TRACE_ID, upstream.context.span_id)


async def test_tracing_off_by_default_installs_nothing(
        redis_url: str, traced_sim: tuple[RunningSim, list[dict[str, str]]]) -> None:
    sim, seen = traced_sim
    assert tracing.provider() is None and not tracing.enabled()
    async with start_router(redis_url, [sim.base_url]) as router, aiohttp.ClientSession() as http:
        async with http.post(router.url + "/v1/chat/completions", json=BODY,
                             headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}) as resp:
            assert resp.status == 200
            await resp.read()
    # no SDK provider anywhere: the API's global one is still the no-op proxy
    assert tracing.provider() is None
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracing.span("tao.router", "x").__enter__() is None
    # no span was made, so nothing was propagated (the router forwards no client headers)
    (headers,) = seen
    assert "traceparent" not in {k.lower() for k in headers}
