"""`tao serve predictor`: the shared bootstrap around the predictor engine.

Health is SERVING once the state was restored from Redis (snapshot + event log) and Redis
answers. The engine's clock is Unix time (events carry Unix timestamps); tests inject a
``VirtualClock`` on the same timeline.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import grpc

from services.common.bootstrap import ServiceApp, ServiceContext
from services.common.clock import Clock, ScaledClock
from services.predictor.service import PredictorEngine, PredictorMetrics, PredictorServicer
from services.predictor.settings import Settings
from tao.predictor.v1 import predictor_pb2_grpc

__all__ = ["PredictorApp", "Settings", "UnixClock", "add_cli_arguments", "build_app", "settings_overrides"]


class UnixClock:
    """Unix seconds in model time (``ScaledClock.unix``): the timeline of tool events
    (``t_unix_s``); equal to wall Unix time unless ``time_scale`` is set for emulation."""

    def __init__(self, scale: float = 1.0) -> None:
        self._scaled = ScaledClock(scale)

    def now(self) -> float:
        return self._scaled.unix()


class PredictorApp:
    grpc_service_names: Sequence[str] = ("tao.predictor.v1.PredictorService",)

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or UnixClock(settings.time_scale)
        self.engine: PredictorEngine | None = None
        self._restored = False

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        engine = PredictorEngine(self.settings, ctx.redis, self.clock, ctx.epoch, PredictorMetrics(ctx.metrics))
        await engine.restore()
        self._restored = True
        engine.start_background()
        self.engine = engine
        predictor_pb2_grpc.add_PredictorServiceServicer_to_server(PredictorServicer(engine), server)
        ctx.log.info("restored", sessions=len(engine.core.sessions()), history_keys=len(engine.core.history),
                     log_events=engine.restored_events)  # fmt: skip

    async def ready(self) -> bool:
        return self._restored

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.stop()


def build_app(settings: Settings) -> ServiceApp:
    return PredictorApp(settings)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--horizon-s", type=float, default=None, help="readiness horizon (default 1 s)")
    parser.add_argument("--stale-after-s", type=float, default=None, help="prediction staleness (default 30 s)")
    parser.add_argument("--exploration-probability", type=float, default=None,
                        help="per-window exploration chance of overdue calls (0 disables)")


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "horizon_s": args.horizon_s,
        "stale_after_s": args.stale_after_s,
        "exploration_probability": args.exploration_probability,
    }
