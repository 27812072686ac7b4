"""The one bootstrap every TAO service uses.

``main()`` -> settings -> clients built once and injected -> ``grpc.aio`` server with health
(SERVING only while Redis answers and the app says it is ready), reflection, shared
interceptors and a Prometheus endpoint -> on SIGTERM/SIGINT: health NOT_SERVING,
``server.stop(grace)``, app stop, clients closed.

A service plugs in through ``ServiceApp``; ``services/<svc>/server.py`` exposes
``Settings`` (a ``ServiceSettings`` subclass) and ``build_app(settings) -> ServiceApp``
(optionally ``add_cli_arguments(parser)`` and ``settings_overrides(args) -> dict`` for
service-specific flags of ``tao serve``). Tests start services in-process with
``start_service`` on port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc
import redis.asyncio as aioredis
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from redis.exceptions import RedisError

from services.common import tracing
from services.common.aio import within
from services.common.clock import ScaledClock
from services.common.epoch import new_epoch
from services.common.errors import StartupError
from services.common.extras import MissingExtra
from services.common.interceptors import ServerMetrics, ServiceInterceptor
from services.common.logging import configure_logging, get_logger
from services.common.redis_client import make_redis
from services.common.settings import ServiceSettings

HEALTH_POLL_S = 1.0
#: gRPC health service name that is SERVING from start until graceful shutdown (liveness probes)
LIVENESS_SERVICE = "liveness"
#: how long past the gRPC grace a service app may take to stop its own tasks
APP_STOP_TIMEOUT_S = 5.0


@dataclass
class ServiceContext:
    """Everything a service app gets injected at start."""

    name: str
    settings: ServiceSettings
    redis: aioredis.Redis
    #: model time (ScaledClock(settings.time_scale)): use clock.unix() for shared timestamps
    clock: ScaledClock
    epoch: str
    log: structlog.stdlib.BoundLogger
    metrics: CollectorRegistry
    extras: dict[str, Any] = field(default_factory=dict)


class ServiceApp(Protocol):
    """What a service provides to the bootstrap."""

    #: full proto service names, e.g. ("tao.planner.v1.PlannerService",)
    grpc_service_names: Sequence[str]

    async def start(self, server: grpc.aio.Server, ctx: ServiceContext) -> None:
        """Register servicers on ``server`` (not yet started) and start background tasks."""
        ...

    async def stop(self) -> None:
        """Stop background tasks; called after the gRPC server stopped."""
        ...


class RunningService:
    """A started service; ``stop()`` shuts it down in the documented order."""

    def __init__(
        self,
        name: str,
        settings: ServiceSettings,
        app: ServiceApp,
        server: grpc.aio.Server,
        port: int,
        ctx: ServiceContext,
        health_servicer: health.aio.HealthServicer,
        metrics_runner: web.AppRunner | None,
        metrics_port: int | None,
    ) -> None:
        self.name = name
        self.settings = settings
        self.app = app
        self.server = server
        self.port = port
        self.ctx = ctx
        self.health = health_servicer
        self.metrics_port = metrics_port
        self._metrics_runner = metrics_runner
        self._health_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self.serving = False

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    async def _watch_health(self) -> None:
        """SERVING while Redis answers (and the app's optional ``ready()`` agrees).

        An active/standby app (optional ``leading()``) keeps the server as a whole ("") SERVING
        on a standby but sets its own service names NOT_SERVING there: readiness probes on the
        service name route clients to the leader, liveness on "" keeps the standby alive.
        """
        log = self.ctx.log
        names_serving: bool | None = None
        while True:
            ok = True
            try:
                # One answer within the client's own timeout: the client's retry policy (up to
                # 4 attempts with backoff, right for data operations) would otherwise stretch
                # a frozen or unreachable Redis into ~4 timeouts before health says so.
                await within(self.ctx.redis.ping(), self.settings.redis_timeout_s)
            except (TimeoutError, RedisError, OSError):
                ok = False
            ready_hook = getattr(self.app, "ready", None)
            if ok and ready_hook is not None:
                try:
                    ok = bool(await ready_hook())
                except Exception:  # a failing readiness probe means not ready
                    ok = False
            leading_hook = getattr(self.app, "leading", None)
            names_ok = ok and (leading_hook is None or bool(leading_hook()))
            if ok != self.serving or names_ok != names_serving:
                self.serving, names_serving = ok, names_ok
                on, off = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
                await self.health.set("", on if ok else off)
                for svc in self.app.grpc_service_names:
                    await self.health.set(svc, on if names_ok else off)
                log.info("health", serving=ok, **({} if leading_hook is None else {"leader": names_ok}))
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self, grace_s: float | None = None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings.grace_s if grace_s is None else grace_s
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        try:
            # bounded: a background task that ignores cancellation must not hang shutdown
            stopping = asyncio.ensure_future(self.app.stop())
            done, _ = await asyncio.wait({stopping}, timeout=grace + APP_STOP_TIMEOUT_S)
            if not done:
                self.ctx.log.error("app did not stop in time; abandoning its tasks",
                                   timeout_s=grace + APP_STOP_TIMEOUT_S)
            else:
                stopping.result()
        finally:
            if self._metrics_runner is not None:
                await self._metrics_runner.cleanup()
            await self.ctx.redis.aclose()
        self.ctx.log.info("stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


async def _wait_for_redis(client: aioredis.Redis, settings: ServiceSettings) -> None:
    deadline = asyncio.get_running_loop().time() + settings.redis_startup_timeout_s
    last: BaseException | None = None
    while True:
        try:
            await client.ping()
            return
        except (RedisError, OSError) as exc:
            last = exc
        if asyncio.get_running_loop().time() >= deadline:
            reason = str(last).splitlines()[0] if last else "no answer"
            raise StartupError(f"cannot reach Redis at {settings.redis_url}: {reason}")
        await asyncio.sleep(0.2)


def _server_credentials(settings: ServiceSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    key = settings.tls_key_file.read_bytes()
    cert = settings.tls_cert_file.read_bytes()
    ca = settings.tls_client_ca_file.read_bytes() if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


async def _start_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[web.AppRunner, int]:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise StartupError(f"metrics port {host}:{port} unavailable: {exc.strerror}") from exc
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


async def start_service(
    name: str,
    app: ServiceApp,
    settings: ServiceSettings,
    *,
    redis_client: aioredis.Redis | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> RunningService:
    """Start ``app`` as service ``name``; returns once the port is bound (health may lag)."""
    log = get_logger(name)
    try:
        traced = tracing.configure(name)
    except MissingExtra as exc:
        raise StartupError(str(exc)) from None
    client = redis_client or make_redis(settings)
    try:
        await _wait_for_redis(client, settings)
    except StartupError:
        await client.aclose()
        raise
    registry = CollectorRegistry()
    ctx = ServiceContext(
        name=name, settings=settings, redis=client, clock=ScaledClock(settings.time_scale), epoch=new_epoch(), log=log, metrics=registry
    )
    token = settings.auth_token.get_secret_value() if settings.auth_token else None
    server = grpc.aio.server(
        interceptors=[*tracing.grpc_server_interceptors(),
                      ServiceInterceptor(name, ServerMetrics(registry), token, settings.admin_secret())],
        options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 16 * 1024 * 1024), *options],
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for svc in ("", *app.grpc_service_names):
        await health_servicer.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
    # Liveness (Kubernetes `grpc:` livenessProbe with service "liveness"): SERVING while the process
    # answers, whatever Redis does, so an outage of Redis makes pods unready but never restarts them;
    # NOT_SERVING only once graceful shutdown starts. The readiness name is "" (the server as a whole).
    await health_servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await app.start(server, ctx)
    reflection.enable_server_reflection(
        (*app.grpc_service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    address = f"{settings.host}:{settings.port}"
    creds = _server_credentials(settings)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError as exc:
        port = 0
        log.debug("bind failed", error=str(exc))
    if port == 0:
        await app.stop()
        await client.aclose()
        raise StartupError(f"cannot listen on {address}: port in use or address unavailable")
    await server.start()
    metrics_runner, metrics_port = None, None
    if settings.metrics_port is not None:
        metrics_runner, metrics_port = await _start_metrics(registry, settings.host, settings.metrics_port)
    running = RunningService(name, settings, app, server, port, ctx, health_servicer, metrics_runner, metrics_port)
    running._health_task = asyncio.create_task(running._watch_health(), name=f"{name}-health")
    log.info("serving", address=f"{settings.host}:{port}", epoch=ctx.epoch, metrics_port=metrics_port,
             tls=creds is not None, auth=token is not None, tracing=traced)
    return running


S = TypeVar("S", bound=ServiceSettings)


def event_loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop ``ServiceSettings.event_loop`` names: uvloop's when asked for and installed,
    else asyncio's (``None``)."""
    if kind != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_service(name: str, app_factory: Callable[[S], ServiceApp], settings: S) -> int:
    """Run a service until SIGTERM/SIGINT. Start-up problems print one line and return 2."""
    configure_logging(name, settings.log_level, settings.log_format)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        app = app_factory(settings)
        running = await start_service(name, app, settings)
        print(f"tao {name} listening on {running.address}", flush=True)
        await stop.wait()
        await running.stop()
        return 0

    try:
        with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
            return runner.run(main())
    except StartupError as exc:
        print(f"tao serve {name}: {exc}", file=sys.stderr)
        return 2
