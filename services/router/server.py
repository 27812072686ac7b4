"""`tao serve router`: the shared bootstrap around the router (see ``services.common.bootstrap``).

The gRPC port serves RouterAdminService (and health, reflection); the OpenAI-compatible
gateway listens on ``http_host:http_port``. gRPC health is SERVING once the HTTP gateway
is listening and Redis answers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import grpc
from aiohttp import web

from services.common.bootstrap import ServiceApp, ServiceContext
from services.common.errors import StartupError
from services.router import ops_metrics
from services.router.admin import RouterAdmin
from services.router.app import Gateway
from services.router.auth import ReloadingAuthenticator
from services.router.runtime import RouterRuntime
from services.router.settings import Settings
from tao.router.v1 import router_pb2_grpc

__all__ = ["RouterApp", "Settings", "add_cli_arguments", "build_app", "settings_overrides"]


class RouterApp:
    grpc_service_names: Sequence[str] = ("tao.router.v1.RouterAdminService",)

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runtime: RouterRuntime | None = None
        self.http_port: int | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.http_host}:{self.http_port}"

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        s = self.settings
        auth = ReloadingAuthenticator(s.api_keys_file, s.api_keys_reload_s, ctx.log) if s.api_keys_file else None
        if auth is None:
            ctx.log.warning("no api_keys_file: dev mode, tenant from header", header=s.dev_tenant_header)
        rt = RouterRuntime(s, ctx)
        self.runtime = rt
        ops_metrics.register(ctx.metrics, rt.core)
        await rt.start()
        runner = web.AppRunner(Gateway(rt, auth).build(), access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, s.http_host, s.http_port, backlog=1024)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            await rt.stop()
            raise StartupError(f"cannot listen on http://{s.http_host}:{s.http_port}: {exc.strerror}") from exc
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or []
        self.http_port = int(sockets[0].getsockname()[1]) if sockets else s.http_port
        if rt.fleet is not None:
            if not s.advertise_url and s.http_host in ("0.0.0.0", "::", ""):
                ctx.log.warning("fleet: other routers will forward to a wildcard address; set advertise_url",
                                url=self.base_url)
            await rt.fleet.advertise(s.advertise_url or self.base_url)
        router_pb2_grpc.add_RouterAdminServiceServicer_to_server(RouterAdmin(rt), server)
        ctx.log.info("gateway listening", url=self.base_url, policy=s.policy, replicas=len(rt.registry.entries))
        print(f"tao router gateway on {self.base_url}", file=sys.stderr, flush=True)

    async def ready(self) -> bool:
        return self._runner is not None

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.runtime is not None:
            await self.runtime.stop()


def build_app(settings: Settings) -> ServiceApp:
    return RouterApp(settings)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replica", action="append", default=None, metavar="URL",
                        help="vLLM replica base URL or ID=URL (repeatable)")
    parser.add_argument("--http-host", default=None, help="gateway bind address")
    parser.add_argument("--http-port", type=int, default=None, help="gateway port (0 picks one)")
    parser.add_argument("--policy", default=None, help="placement policy (default tao)")
    parser.add_argument("--fallback-policy", default=None, help="local policy when the planner is silent")
    parser.add_argument("--api-keys-file", default=None, help="hashed API keys (YAML/JSON); unset = dev mode")
    parser.add_argument("--hold-timeout-s", type=float, default=None,
                        help="held this long while nothing can serve it -> 503 (overload, failure)")
    parser.add_argument("--plan-hold-timeout-s", type=float, default=None,
                        help="held by the plan on purpose (paused session) at most this long -> 503")
    parser.add_argument("--plan-stale-s", type=float, default=None, help="planner counts as silent after this")
    parser.add_argument("--kv-capacity-tokens", type=int, default=None,
                        help="KV tokens of replicas that do not export vllm:cache_config_info")
    parser.add_argument("--fleet", action="store_true", default=None,
                        help="one of several routers on the same Redis (session ownership, forwarding)")
    parser.add_argument("--router-id", default=None, help="this router's fleet id (default random)")
    parser.add_argument("--advertise-url", default=None,
                        help="URL other fleet routers forward to (default http://HOST:PORT)")
    parser.add_argument("--member-ttl-s", type=float, default=None, help="fleet member lease (wall s)")


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "replicas": args.replica,
        "http_host": args.http_host,
        "http_port": args.http_port,
        "policy": args.policy,
        "fallback_policy": args.fallback_policy,
        "api_keys_file": args.api_keys_file,
        "hold_timeout_s": args.hold_timeout_s,
        "plan_hold_timeout_s": args.plan_hold_timeout_s,
        "plan_stale_s": args.plan_stale_s,
        "replica_kv_capacity_tokens": args.kv_capacity_tokens,
        "fleet": args.fleet,
        "router_id": args.router_id,
        "advertise_url": args.advertise_url,
        "member_ttl_s": args.member_ttl_s,
    }
