"""The stack under fault injection: the real processes (``services.up.stack``) with a
``FaultProxy`` between each service and Redis and a ``ReplicaTap`` (a fault proxy that
records what the replica receives) between the router and each replica.

Proxies run on a private event-loop thread so the environment can outlive the event loop
of any one test; ``set_mode`` is thread-safe. Children are killed, frozen and restarted on
their own ports (``kill``/``restart``/``freeze``/``thaw``); windows in which the router was
down are remembered, because only then may a client see a connection cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import grpc
import redis as redis_sync
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.faults.proxy import FaultProxy
from bench.faults.tap import ReplicaTap, TapLog
from services.up.stack import Stack, StackAddresses, StackConfig
from tao.common.v1 import common_pb2
from tao.router.v1 import router_pb2, router_pb2_grpc

SERVICES = ("router", "planner", "predictor", "budget")
MODEL = "Qwen/Qwen3-32B"
T = TypeVar("T")


@dataclass
class EnvConfig:
    replicas: int = 2
    time_scale: float = 20.0
    total_budget: int = 6
    policy: str = "tao"
    #: model seconds a request may be held at the router (15 wall s at scale 20)
    hold_timeout_s: float = 300.0
    log_dir: Path | None = None
    #: router / service settings for fast, bounded recovery (model seconds unless wall-paced;
    #: see services/router/settings.py)
    env: dict[str, str] = field(default_factory=lambda: {
        "TAO_ROUTER_HEALTH_INTERVAL_S": "0.25",      # wall
        "TAO_ROUTER_PROBE_TIMEOUT_S": "0.5",         # wall
        "TAO_ROUTER_RESYNC_INTERVAL_S": "0.5",       # wall
        "TAO_ROUTER_PLAN_POLL_S": "0.25",            # wall
        "TAO_ROUTER_UPSTREAM_READ_TIMEOUT_S": "3",   # wall: a hung replica fails its streams
        "TAO_ROUTER_UPSTREAM_CONNECT_TIMEOUT_S": "1",
        "TAO_ROUTER_REDIS_TIMEOUT_S": "1",
        "TAO_PLANNER_REDIS_TIMEOUT_S": "1",
        "TAO_PREDICTOR_REDIS_TIMEOUT_S": "1",
        "TAO_BUDGET_REDIS_TIMEOUT_S": "1",
        "TAO_PLANNER_LEASE_TTL_S": "2",               # wall: a restarted planner leads within ~2.7 s
        "TAO_BUDGET_LEASE_TTL_S": "2",
    })


class FaultEnv:
    """``start()`` then use; always ``stop()``."""

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config = config or EnvConfig()
        cfg = self.config
        stack_cfg = StackConfig(replicas=cfg.replicas, time_scale=cfg.time_scale, total_budget=cfg.total_budget,
                                policy=cfg.policy, hold_timeout_s=cfg.hold_timeout_s, env=dict(cfg.env))
        if cfg.log_dir is not None:
            stack_cfg.log_dir = cfg.log_dir
        self.stack = Stack(stack_cfg)
        self.tap_log = TapLog()
        self.redis_proxies: dict[str, FaultProxy] = {}
        self.taps: list[ReplicaTap] = []
        self.router_down: list[tuple[float, float]] = []
        self._router_killed_at: float | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxies", daemon=True)
        self.addresses: StackAddresses | None = None
        self.redis_port = 0

    # ------------------------------------------------------------------ lifecycle

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self) -> StackAddresses:
        self._thread.start()
        redis_url = self.stack.start_redis()
        self.redis_port = int(urlparse(redis_url).port or 6379)
        replica_urls = self.stack.start_replicas()
        for name in SERVICES:
            self.redis_proxies[name] = self._on_loop(FaultProxy("127.0.0.1", self.redis_port).start())
        for i, url in enumerate(replica_urls):
            port = int(urlparse(url).port or 80)
            tap = ReplicaTap(f"vllm-{i}", "127.0.0.1", port, self.tap_log)
            self._on_loop(tap.start())
            self.taps.append(tap)
        routed = [f"vllm-{i}=http://127.0.0.1:{tap.port}" for i, tap in enumerate(self.taps)]
        urls = {name: f"redis://127.0.0.1:{p.port}/0" for name, p in self.redis_proxies.items()}
        self.addresses = self.stack.start_services(redis_url, replica_urls, router_replicas=routed, redis_urls=urls)
        return self.addresses

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.thaw_all()
        self.stack.stop()
        if self._thread.is_alive():
            for proxy in [*self.redis_proxies.values(), *self.taps]:
                with contextlib.suppress(Exception):
                    self._on_loop(proxy.stop(), 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    @property
    def addr(self) -> StackAddresses:
        assert self.addresses is not None, "start() first"
        return self.addresses

    # ------------------------------------------------------------------ faults

    def set_mode(self, proxy: FaultProxy, mode: str, latency_s: float | None = None) -> None:
        async def apply() -> None:
            proxy.set_mode(mode, latency_s)

        self._on_loop(apply())

    def set_redis_mode(self, mode: str, latency_s: float | None = None, services: tuple[str, ...] = SERVICES) -> None:
        for name in services:
            self.set_mode(self.redis_proxies[name], mode, latency_s)

    def kill(self, name: str) -> None:
        """SIGKILL child ``name`` (waited for)."""
        if name == "router":
            self._router_killed_at = time.monotonic()
        self.stack.kill(name, signal.SIGKILL)

    def restart(self, name: str, timeout_s: float = 30.0) -> None:
        self.stack.restart(name, timeout_s)
        if name == "router" and self._router_killed_at is not None:
            self.router_down.append((self._router_killed_at, time.monotonic()))
            self._router_killed_at = None

    def freeze(self, name: str) -> None:
        self.stack.kill(name, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        self.stack.kill(name, signal.SIGCONT)

    def thaw_all(self) -> None:
        for child in self.stack.sup.children:
            if child.alive() and child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGCONT)

    def heal(self, timeout_s: float = 30.0) -> None:
        """Back to normal after a test that may have failed half-way: every proxy passes,
        frozen children run, dead ones are restarted."""
        for proxy in [*self.redis_proxies.values(), *self.taps]:
            self.set_mode(proxy, "pass")
        self.thaw_all()
        for name in self.dead():
            self.restart(name, timeout_s)

    def dead(self) -> list[str]:
        return [c.name for c in self.stack.sup.dead_children()]

    # ------------------------------------------------------------------ observation

    def redis(self) -> redis_sync.Redis:
        """A client straight to Redis (not through any proxy)."""
        return redis_sync.Redis(host="127.0.0.1", port=self.redis_port, decode_responses=True, socket_timeout=2)

    def service_address(self, name: str) -> str:
        return getattr(self.addr, "router_admin" if name == "router" else name)

    async def health(self, name: str, timeout_s: float = 1.0) -> str:
        async with grpc.aio.insecure_channel(self.service_address(name)) as ch:
            try:
                reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def wait_serving(self, names: tuple[str, ...] = SERVICES, timeout_s: float = 30.0) -> dict[str, str]:
        """Wait until every service in ``names`` answers SERVING; returns the last statuses."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, str] = {}
        while True:
            status = {n: await self.health(n) for n in names}
            if all(s == "SERVING" for s in status.values()) or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.2)

    async def sessions(self) -> list[router_pb2.SessionInfo]:
        async with grpc.aio.insecure_channel(self.addr.router_admin) as ch:
            reply = await router_pb2_grpc.RouterAdminServiceStub(ch).ListSessions(
                router_pb2.ListSessionsRequest(), timeout=3)
        return list(reply.sessions)

    async def replicas(self) -> list[router_pb2.ReplicaInfo]:
        async with grpc.aio.insecure_channel(self.addr.router_admin) as ch:
            reply = await router_pb2_grpc.RouterAdminServiceStub(ch).ListReplicas(
                router_pb2.ListReplicasRequest(), timeout=3)
        return list(reply.replicas)

    async def applied_plan(self, session_id: str) -> tuple[str, int] | None:
        """(epoch, revision) of the last planner plan the router applied (via ExplainSession)."""
        async with grpc.aio.insecure_channel(self.addr.router_admin) as ch:
            try:
                reply = await router_pb2_grpc.RouterAdminServiceStub(ch).ExplainSession(
                    router_pb2.ExplainSessionRequest(session_id=session_id), timeout=3)
            except grpc.aio.AioRpcError:
                return None
        if not reply.HasField("applied_plan"):
            return None
        return reply.applied_plan.epoch, int(reply.applied_plan.revision)

    async def any_applied_plan(self, wait_s: float = 3.0) -> tuple[str, int] | None:
        """The router's applied plan stamp, read through any live session. The stamp is
        router-wide, but ExplainSession needs a session: between one session's release and
        the next one's first request there may be none (a CI run saw exactly that), so look
        again for up to ``wait_s`` before answering None."""
        deadline = time.monotonic() + wait_s
        while True:
            for s in await self.sessions():
                got = await self.applied_plan(s.session_id)
                if got is not None:
                    return got
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)


PHASE_NAMES = {v: k.removeprefix("SESSION_PHASE_") for k, v in common_pb2.SessionPhase.items()}
