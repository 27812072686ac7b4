"""`tao serve budget`: the shared bootstrap around the budget service.

Health is SERVING once the configuration and last allocation have been read back from
Redis (and Redis answers). With ``leader_election`` (the default) the
``tao.budget.v1.BudgetService`` name is SERVING only on the leader; a standby is SERVING on the
server as a whole, ticks nothing, and on takeover reads the configuration and last allocation
back before its first tick. The tick loop starts after that; tests pass ``autotick=False``
and a ``VirtualClock`` and drive ``app.service.tick_once()`` themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from services.budget.service import BudgetService, BudgetServicer
from services.budget.settings import TENANT_FORM, Settings, parse_tenant
from services.common.bootstrap import ServiceApp, ServiceContext
from services.common.clock import Clock, WallClock
from services.common.lease import RedisLease
from tao.budget.v1 import budget_pb2_grpc

__all__ = ["BudgetApp", "Settings", "add_cli_arguments", "build_app", "settings_overrides"]


class BudgetApp:
    grpc_service_names: Sequence[str] = ("tao.budget.v1.BudgetService",)

    def __init__(self, settings: Settings, clock: Clock | None = None,
                 to_unix: Callable[[float], float] | None = None, autotick: bool = True) -> None:
        self.settings = settings
        self._clock = clock
        self._to_unix = to_unix
        self.autotick = autotick
        self.service: BudgetService | None = None
        self.lease: RedisLease | None = None
        self._loop: asyncio.Task[None] | None = None

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        clock: Clock = self._clock or ctx.clock
        to_unix = self._to_unix
        if to_unix is None:
            offset = WallClock.wall() - clock.now()
            to_unix = lambda t: t + offset  # noqa: E731
        lease = RedisLease(ctx.redis, "budget", ttl_s=self.settings.lease_ttl_s, process_epoch=ctx.epoch,
                           log=ctx.log, enabled=self.settings.leader_election)
        self.lease = lease
        svc = BudgetService(self.settings, ctx.redis, ctx.epoch, clock, to_unix, ctx.log, ctx.metrics, lease=lease)
        self.service = svc
        await svc.resume()

        async def on_role(leading: bool) -> None:
            ctx.log.info("budget role", leader=leading, epoch=lease.epoch)
            if leading and svc.resumed:
                await svc.resume()  # the previous leader's configuration and allocation
                if self.autotick:
                    with contextlib.suppress(Exception):
                        await svc.tick_once()

        lease.on_change(on_role)
        await lease.start()
        budget_pb2_grpc.add_BudgetServiceServicer_to_server(BudgetServicer(svc), server)
        if self.autotick:
            self._loop = asyncio.create_task(svc.run(), name="budget-tick")

    async def ready(self) -> bool:
        return self.service is not None and self.service.resumed

    def leading(self) -> bool:
        """Health of the BudgetService name: the leader only (bootstrap's health watch)."""
        return self.lease is not None and self.lease.is_leader()

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        if self.lease is not None:
            await self.lease.stop(release=True)


def build_app(settings: Settings) -> ServiceApp:
    return BudgetApp(settings)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tick-s", type=float, default=None, help="reallocation period (default 2 s)")
    parser.add_argument("--policy", default=None, help="static | dynamic")
    parser.add_argument("--total-budget", type=int, default=None, help="B, when no configuration is stored")
    parser.add_argument("--tenant", action="append", type=parse_tenant, default=None, metavar=TENANT_FORM,
                        help="a tenant (repeat), when no configuration is stored")


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "tick_s": getattr(args, "tick_s", None),
        "policy": getattr(args, "policy", None),
        "total_budget": getattr(args, "total_budget", None),
        "tenants": getattr(args, "tenant", None),
    }
