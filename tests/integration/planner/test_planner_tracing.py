"""A planner round as OpenTelemetry spans (SDK in-memory exporter): planner.round with its
snapshot read, solve and publish children, the round naming the plan's epoch and revision; a
gRPC call to the planner gets the gRPC instrumentation's SERVER span."""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio as aioredis

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_planner_service import _settings, _write_state

from services.common.testing import serve_in_process
from services.planner.server import PlannerApp
from tao.planner.v1 import planner_pb2, planner_pb2_grpc


async def test_planner_round_spans(redis_url: str, exporter: InMemorySpanExporter) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await _write_state(client)
        app = PlannerApp(_settings(redis_url), autorun=False)
        async with serve_in_process("planner", app, _settings(redis_url)) as running:
            assert app.service is not None
            record = await app.service.plan_once()
            assert record is not None
            async with grpc.aio.insecure_channel(running.address) as channel:
                await planner_pb2_grpc.PlannerServiceStub(channel).GetPlan(planner_pb2.GetPlanRequest(), timeout=5)
    finally:
        await client.aclose()
    spans = exporter.get_finished_spans()
    (round_,) = [s for s in spans if s.name == "planner.round"]
    children = sorted((s for s in spans if s.parent is not None and s.parent.span_id == round_.context.span_id),
                      key=lambda s: s.start_time)
    assert [s.name for s in children] == ["planner.snapshot_read", "planner.solve", "planner.publish"]
    assert all(round_.start_time <= s.start_time and s.end_time <= round_.end_time for s in children)
    assert round_.parent is None  # a round is a trace of its own
    assert round_.attributes["tao.plan.revision"] == record.rev == 1
    assert round_.attributes["tao.plan.epoch"] == record.epoch
    assert children[1].attributes["tao.admitted"] == len(record.assignments) == 2
    rpcs = [s.name for s in spans if s.kind == SpanKind.SERVER]
    assert "/tao.planner.v1.PlannerService/GetPlan" in rpcs, rpcs
