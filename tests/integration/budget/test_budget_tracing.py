"""A budget tick as an OpenTelemetry span (SDK in-memory exporter)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_budget_service import V0, Harness, _config

from services.common.clock import VirtualClock
from services.common.testing import serve_in_process
from tao.budget.v1 import budget_pb2_grpc


@pytest.fixture
async def harness(redis_url: str) -> AsyncIterator[Harness]:
    import time

    h = Harness(redis_url, VirtualClock(time.time()), **V0)
    yield h
    await h.redis.aclose()


async def test_budget_tick_span(harness: Harness, exporter: InMemorySpanExporter) -> None:
    async with serve_in_process("budget", harness.app, harness.settings) as running, \
            grpc.aio.insecure_channel(running.address) as channel:
        await budget_pb2_grpc.BudgetServiceStub(channel).ConfigureTenants(_config())
        await harness.demand(A=(10, 4), B=(0, 0))
        exporter.clear()
        await harness.tick()
    ticks = [s for s in exporter.get_finished_spans() if s.name == "budget.tick"]
    assert len(ticks) == 1 and ticks[0].parent is None and ticks[0].end_time > ticks[0].start_time
