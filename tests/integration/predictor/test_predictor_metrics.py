"""The predictor exports its prediction error (``tao_predictor_error_seconds``) for the dashboard."""

from __future__ import annotations

import grpc
import pytest
from test_predictor_service import DURABLE, T0, F, Runner, S, e, settings

from services.common.clock import VirtualClock
from services.common.testing import serve_in_process
from services.predictor.server import PredictorApp


async def test_prediction_error_is_observed_when_a_call_finishes(redis_url: str) -> None:
    clock = VirtualClock(T0)
    st = settings(redis_url)
    app = PredictorApp(st, clock)
    async with serve_in_process("predictor", app, st) as running:
        async with grpc.aio.insecure_channel(running.address) as ch:
            runner = Runner(ch)
            assert [a.status for a in await runner.send([e(0, S, "c1", 0, cmd="sleep 5")])] == [DURABLE]  # Ê 5.05 s
            clock.set(T0 + 5.8)
            await runner.send([e(5.8, F, "c1", 1)])
            await runner.send([e(5.9, F, "c1", 1)])  # a duplicate is not counted twice
            await runner.close()
    assert app.engine is not None and app.engine.metrics is not None
    samples = {(s.name, s.labels.get("evidence")): s.value
               for metric in app.engine.metrics.error.collect() for s in metric.samples}
    counts = {k: v for k, v in samples.items() if k[0] == "tao_predictor_error_seconds_count"}
    sums = {k: v for k, v in samples.items() if k[0] == "tao_predictor_error_seconds_sum"}
    assert sum(counts.values()) == 1
    assert sum(sums.values()) == pytest.approx(0.75, abs=1e-6)
