"""Predictor event ingest as an OpenTelemetry span (SDK in-memory exporter): predictor.ingest
under the gRPC instrumentation's SERVER span of ReportToolEvents, in the caller's trace."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_predictor_service import DURABLE, T0, S, e, settings

from services.common.channels import make_channel
from services.common.clock import VirtualClock
from services.common.testing import serve_in_process
from services.predictor.server import PredictorApp
from tao.predictor.v1 import predictor_pb2 as pb
from tao.predictor.v1 import predictor_pb2_grpc as pbg


async def test_event_ingest_span_under_the_rpc(redis_url: str, exporter: InMemorySpanExporter) -> None:
    st = settings(redis_url)
    async with serve_in_process("predictor", PredictorApp(st, VirtualClock(T0)), st) as running:
        async with make_channel(running.address) as ch:  # the traced client channel
            resp = await pbg.PredictorServiceStub(ch).ReportToolEvents(
                pb.ReportToolEventsRequest(events=[e(0, S, "c1", 0, cmd="ls"), e(0, S, "c2", 0, cmd="ls")]),
                timeout=10)
            assert [a.status for a in resp.acks] == [DURABLE, DURABLE]
    spans = exporter.get_finished_spans()
    (ingest,) = [s for s in spans if s.name == "predictor.ingest"]
    assert ingest.attributes["tao.events"] == 2
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER and s.name.endswith("/ReportToolEvents")]
    (client,) = [s for s in spans if s.kind == SpanKind.CLIENT and s.name.endswith("/ReportToolEvents")]
    assert ingest.parent is not None and ingest.parent.span_id == server.context.span_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert ingest.context.trace_id == server.context.trace_id == client.context.trace_id
