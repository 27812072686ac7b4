"""ToolReporter against a real predictor that comes and goes (real gRPC, real Redis)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from services.common.settings import load_settings
from services.common.testing import free_port, serve_in_process
from services.predictor.reporter import AsyncToolReporter, ToolReporter
from services.predictor.server import PredictorApp, Settings
from tao.predictor.v1 import predictor_pb2 as pb
from tao.predictor.v1 import predictor_pb2_grpc as pbg


def settings(redis_url: str, port: int) -> Settings:
    return load_settings(Settings, redis_url=redis_url, port=port, log_level="warning", exploration_probability=0.0)


async def prediction(address: str, session_id: str) -> pb.Prediction:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await pbg.PredictorServiceStub(ch).GetPrediction(pb.GetPredictionRequest(session_id=session_id))
        return resp.prediction


async def test_sync_reporter_survives_predictor_down(redis_url: str) -> None:
    port = free_port()
    reporter = ToolReporter(f"127.0.0.1:{port}", backoff_initial_s=0.05, backoff_max_s=0.3)
    try:
        # predictor not running yet: the agent's calls neither block nor fail
        started = time.perf_counter()
        for i in range(50):
            with reporter.tool("s1", "bash", f"sleep 0 # {i}", deadline_s=30) as call:
                call.progress(fraction=0.5)
        with pytest.raises(ValueError, match="agent's own error"), reporter.tool("s1", "bash", "false"):
            raise ValueError("agent's own error")  # propagates untouched; the call is still finished
        assert time.perf_counter() - started < 0.5
        await asyncio.sleep(0.5)
        assert reporter.stats.reconnects >= 1 and not reporter.stats.connected and reporter.pending == 152

        async with serve_in_process("predictor", PredictorApp(settings(redis_url, port)), settings(redis_url, port)) as p:
            assert await asyncio.to_thread(reporter.flush, 10.0)
            assert reporter.stats.durable == 152 and reporter.stats.dropped == 0 and reporter.stats.rejected == 0
            pred = await prediction(p.address, "s1")
            assert pred.completed and pred.ready
            with reporter.tool("s2", "bash", "make") as call:
                call.progress(eta_s=30.0)
            assert await asyncio.to_thread(reporter.flush, 10.0)

        # down again (stopped), then a new process on the same Redis: nothing acked is lost
        with reporter.tool("s3", "bash", "sleep 60", call_id="long"):
            pass
        await asyncio.sleep(0.3)
        assert reporter.pending >= 2
        async with serve_in_process("predictor", PredictorApp(settings(redis_url, port)), settings(redis_url, port)) as p:
            assert await asyncio.to_thread(reporter.flush, 10.0)
            assert (await prediction(p.address, "s3")).call_id == "long"
            assert (await prediction(p.address, "s2")).completed
        assert reporter.stats.reconnects >= 2
    finally:
        reporter.close(timeout_s=0.5)


async def test_async_reporter_heartbeats_coalescing_and_bounded_buffer(redis_url: str) -> None:
    now = [1_800_000_000.0]
    rep = AsyncToolReporter("127.0.0.1:1", clock=lambda: now[0], max_buffer_events=5, heartbeat_s=10.0,
                            progress_min_interval_s=1.0, backoff_initial_s=0.05)  # fmt: skip
    await rep.start()
    try:
        call = rep.tool("s", "bash", "make").start()
        call.progress(fraction=0.1)  # first report goes at once
        call.progress(fraction=0.2)  # within 1 s: coalesced ...
        call.progress(fraction=0.3)  # ... latest wins
        assert rep.pending == 2
        now[0] += 1.5
        await asyncio.sleep(0.3)
        events = list(rep._buffer.values())
        assert [e.fraction for e in events[1:]] == [pytest.approx(0.1), pytest.approx(0.3)]
        now[0] += 11.0  # silence: a heartbeat keeps the prediction fresh
        await asyncio.sleep(0.3)
        beat = list(rep._buffer.values())[-1]
        assert beat.type == pb.TOOL_EVENT_TYPE_PROGRESS and not beat.HasField("fraction") and beat.sequence == 3
        for _ in range(3):
            call.progress(eta_s=1.0)
            now[0] += 2.0
        assert rep.pending == 5 and rep.stats.dropped >= 1  # bounded: oldest progress dropped first
        assert next(iter(rep._buffer.values())).type == pb.TOOL_EVENT_TYPE_STARTED
    finally:
        await rep.close(timeout_s=0.1)
