"""`tao serve planner`: the shared bootstrap around the planner service.

Exposes what ``services/common/serve_cli.py`` needs: ``Settings``, ``build_app(settings)``,
``add_cli_arguments(parser)`` and ``settings_overrides(args)``. Health is SERVING once the
service is started and Redis answers; with ``leader_election`` (the default) the
``tao.planner.v1.PlannerService`` name is SERVING only on the leader (a standby is NOT_SERVING
there, so readiness routes clients to the leader, and SERVING on the server as a whole). Tests pass ``autorun=False`` and call
``app.service.plan_once()`` themselves.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import grpc

from services.common.bootstrap import ServiceApp, ServiceContext
from services.common.lease import RedisLease
from services.planner.core import POLICIES
from services.planner.service import ModelClock, PlannerService, PlannerServicer
from services.planner.settings import Settings
from tao.planner.v1 import planner_pb2_grpc

__all__ = ["PlannerApp", "Settings", "add_cli_arguments", "build_app", "settings_overrides"]


class PlannerApp:
    grpc_service_names: Sequence[str] = ("tao.planner.v1.PlannerService",)

    def __init__(self, settings: Settings, clock: ModelClock | None = None, autorun: bool = True) -> None:
        self.settings = settings
        self._clock = clock
        self.autorun = autorun
        self.service: PlannerService | None = None
        self.lease: RedisLease | None = None

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        lease = RedisLease(ctx.redis, "planner", ttl_s=self.settings.lease_ttl_s, process_epoch=ctx.epoch,
                           log=ctx.log, enabled=self.settings.leader_election)
        self.lease = lease
        svc = PlannerService(self.settings, ctx.redis, ctx.epoch, self._clock or ctx.clock, ctx.log, ctx.metrics,
                             lease=lease)
        self.service = svc

        async def on_role(leading: bool) -> None:
            ctx.log.info("planner role", leader=leading, epoch=lease.epoch)
            if leading:
                svc.kick()  # plan at once under the new term

        lease.on_change(on_role)
        await lease.start()
        planner_pb2_grpc.add_PlannerServiceServicer_to_server(PlannerServicer(svc), server)
        if self.autorun:
            svc.start_background()
        ctx.log.info("planner started", policy=self.settings.policy, tick_s=self.settings.tick_s)

    async def ready(self) -> bool:
        return self.service is not None

    def leading(self) -> bool:
        """Health of the PlannerService name: the leader only (bootstrap's health watch)."""
        return self.lease is not None and self.lease.is_leader()

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
        if self.lease is not None:
            await self.lease.stop(release=True)


def build_app(settings: Settings) -> ServiceApp:
    return PlannerApp(settings)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help=f"placement policy: {', '.join(sorted(POLICIES))}")
    parser.add_argument("--tick-s", type=float, default=None, help="periodic re-plan period (default 1 s)")
    parser.add_argument("--debounce-s", type=float, default=None, help="pool-change debounce (default 0.05 s)")
    parser.add_argument("--engine-profile", default=None,
                        help="engine profile whose prefill/decode time fits the policy uses (default: qwen3-32b-h100x2's)")


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "policy": getattr(args, "policy", None),
        "tick_s": getattr(args, "tick_s", None),
        "debounce_s": getattr(args, "debounce_s", None),
        "engine_profile": getattr(args, "engine_profile", None),
    }
