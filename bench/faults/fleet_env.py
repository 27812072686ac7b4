"""The fleet under fault injection (``tao check faults --fleet``): on loopback, a Redis Cluster
of 3 masters each with one replica (so a killed master is failed over), N routers, an
active/standby pair of planners and of budget services, one predictor and emulated vLLM
replicas behind ``ReplicaTap``s (which record what each replica computes, for the duplicate
accounting). Every service is a real ``tao serve`` process started by the ``Supervisor`` of a
``services.up.stack.Stack`` (which also starts the replicas), with the cluster's
``redis+cluster://`` seed list as its Redis URL: no fault proxy sits between the services and
Redis (a cluster client follows the nodes' own addresses), the faults here are kill -9s.

Routers run in fleet mode when this checkout's router has the fleet settings
(``fleet``, ``router_id``, ``advertise_url``, ``member_ttl_s``: services/router/settings.py);
otherwise as independent routers on the shared Redis, which the suite reports
(``FleetEnv.router_fleet``).
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
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.faults.env import EnvConfig
from bench.faults.tap import ReplicaTap, TapLog
from services.common import keys
from services.common.ports import free_port
from services.common.testing import RedisClusterProcs, RedisServer, find_redis_binary, redis_cli_binary
from services.up.procs import Child, tao_argv
from services.up.stack import LEADER_SERVICE_NAMES, Stack, StackConfig, grpc_serving, http_ok
from tao.budget.v1 import budget_pb2, budget_pb2_grpc
from tao.router.v1 import router_pb2, router_pb2_grpc

MODEL = "Qwen/Qwen3-32B"
#: the slot every TAO key lives in (``{tao}`` hash tag, services/common/keys.py)
TAO_SLOT_KEY = keys.PREFIX
T = TypeVar("T")


@dataclass
class FleetConfig:
    routers: int = 3
    planners: int = 2
    budgets: int = 2
    replicas: int = 2
    time_scale: float = 20.0
    total_budget: int = 8
    policy: str = "tao"
    #: model seconds a request may be held at a router (15 wall s at scale 20)
    hold_timeout_s: float = 300.0
    #: wall seconds: leader leases of planners and budgets, router member leases
    lease_ttl_s: float = 2.0
    member_ttl_s: float = 2.0
    #: Redis Cluster node timeout: a master unreachable this long is failed (then its replica
    #: is elected); 2 s as the ``redis_cluster`` fixture (shorter risks false failovers on a
    #: loaded 2-core machine)
    node_timeout_ms: int = 2000
    #: run routers in fleet mode (False: independent routers)
    router_fleet: bool = True
    log_dir: Path | None = None
    #: service settings for fast, bounded recovery: bench.faults.env.EnvConfig's (its lease TTLs
    #: are replaced by ``lease_ttl_s``)
    env: dict[str, str] = field(default_factory=lambda: EnvConfig().env)


class FleetEnv:
    """``start()`` then use; always ``stop()``."""

    def __init__(self, config: FleetConfig | None = None) -> None:
        self.config = config or FleetConfig()
        cfg = self.config
        env = dict(cfg.env)
        env["TAO_PLANNER_LEASE_TTL_S"] = str(cfg.lease_ttl_s)
        env["TAO_BUDGET_LEASE_TTL_S"] = str(cfg.lease_ttl_s)
        stack_cfg = StackConfig(replicas=cfg.replicas, time_scale=cfg.time_scale, total_budget=cfg.total_budget,
                                policy=cfg.policy, hold_timeout_s=cfg.hold_timeout_s, env=env)
        if cfg.log_dir is not None:
            stack_cfg.log_dir = cfg.log_dir
        self.stack = Stack(stack_cfg)
        self.router_fleet = cfg.router_fleet
        self.cluster: RedisClusterProcs | None = None
        self.tap_log = TapLog()
        self.taps: list[ReplicaTap] = []
        #: service name -> gRPC port; routers also have an HTTP port
        self.ports: dict[str, int] = {}
        self.http_ports: dict[str, int] = {}
        #: per router name: (killed at, back at or +inf) on time.monotonic
        self.router_down: dict[str, list[tuple[float, float]]] = {}
        self._killed_at: dict[str, float] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-taps", daemon=True)

    # ------------------------------------------------------------------ names

    @property
    def routers(self) -> list[str]:
        return [f"router-{i}" for i in range(self.config.routers)]

    @property
    def planners(self) -> list[str]:
        return [f"planner-{i}" for i in range(self.config.planners)]

    @property
    def budgets(self) -> list[str]:
        return [f"budget-{i}" for i in range(self.config.budgets)]

    @property
    def services(self) -> list[str]:
        return [*self.planners, *self.budgets, "predictor", *self.routers]

    @property
    def router_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.http_ports[r]}" for r in self.routers]

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def redis_url(self) -> str:
        assert self.cluster is not None, "start() first"
        return self.cluster.url

    # ------------------------------------------------------------------ lifecycle

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self, timeout_s: float = 60.0) -> None:
        binary = find_redis_binary()
        cli = redis_cli_binary(binary) if binary else None
        if binary is None or cli is None:
            raise RuntimeError("the fleet suite needs redis-server and redis-cli (apt redis-server)")
        self._thread.start()
        self.cluster = RedisClusterProcs(binary, cli, masters=3, replicas=1, node_timeout_ms=self.config.node_timeout_ms)
        self.cluster.start(timeout_s)
        replica_urls = self.stack.start_replicas(wait=False)
        for i, url in enumerate(replica_urls):
            tap = ReplicaTap(f"vllm-{i}", "127.0.0.1", int(urlparse(url).port or 80), self.tap_log)
            self._on_loop(tap.start())
            self.taps.append(tap)
        routed = [f"vllm-{i}=http://127.0.0.1:{tap.port}" for i, tap in enumerate(self.taps)]
        children: dict[str, Child] = {}
        for name in self.services:
            self.ports[name] = free_port()
            if name.startswith("router-"):
                self.http_ports[name] = free_port()
            children[name] = self._spawn(name, routed)
        self.stack.wait_replicas(timeout_s)
        for name, child in children.items():
            self._wait_up(name, child, timeout_s)
        self.run(self._configure_budget(timeout_s))

    def _spawn(self, name: str, routed: list[str]) -> Child:
        kind = name.split("-", 1)[0]
        cfg = self.config
        env = {f"TAO_{kind.upper()}_TIME_SCALE": str(cfg.time_scale)}
        extra: list[str] = []
        if kind in ("planner", "budget", "predictor"):
            extra += ["--metrics-port", str(free_port())]
        if kind == "planner":
            extra += ["--policy", cfg.policy]
        if kind == "router":
            env["TAO_ROUTER_HOLD_TIMEOUT_S"] = str(cfg.hold_timeout_s)
            port = self.http_ports[name]
            extra += ["--http-port", str(port), "--policy", cfg.policy]
            for url in routed:
                extra += ["--replica", url]
            if self.router_fleet:
                env.update({"TAO_ROUTER_FLEET": "1", "TAO_ROUTER_ROUTER_ID": name,
                            "TAO_ROUTER_ADVERTISE_URL": f"http://127.0.0.1:{port}",
                            "TAO_ROUTER_MEMBER_TTL_S": str(cfg.member_ttl_s)})
        argv = tao_argv("serve", kind, "--port", str(self.ports[name]), "--redis-url", self.redis_url,
                        "--log-level", self.stack.config.log_level, *extra)
        return self.stack.sup.spawn(name, argv, env)

    async def _configure_budget(self, timeout_s: float) -> None:
        leader = await self.wait_leader("budget", timeout_s)
        if leader is None:
            raise RuntimeError(f"no budget service leads after {timeout_s:.0f} s")
        cfg = self.config
        async with grpc.aio.insecure_channel(self.address(leader)) as channel:
            stub = budget_pb2_grpc.BudgetServiceStub(channel)
            await stub.ConfigureTenants(budget_pb2.ConfigureTenantsRequest(
                total_budget=cfg.total_budget,
                tenants=[budget_pb2.TenantConfig(name="default", floor=max(1, cfg.total_budget // 4), weight=1.0)],
            ), timeout=10)
            await stub.SetPolicy(budget_pb2.SetPolicyRequest(policy="dynamic"), timeout=10)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.thaw_all()
        self.stack.stop()
        if self._thread.is_alive():
            for tap in self.taps:
                with contextlib.suppress(Exception):
                    self._on_loop(tap.stop(), 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if self.cluster is not None:
            self.cluster.stop()

    @staticmethod
    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    # ------------------------------------------------------------------ faults

    def kill(self, name: str) -> None:
        """SIGKILL service ``name`` (waited for)."""
        if name.startswith("router-"):
            self._killed_at[name] = time.monotonic()
        self.stack.sup.send_signal(name, signal.SIGKILL)

    def _wait_up(self, name: str, child: Child, timeout_s: float) -> None:
        """Until the server answers SERVING (on the server as a whole: a standby is NOT_SERVING on
        its service name) and a router's HTTP gateway answers too."""
        self.stack.sup.wait_until(child, partial(grpc_serving, self.address(name)), timeout_s, "SERVING")
        if name in self.http_ports:
            url = f"http://127.0.0.1:{self.http_ports[name]}/health"
            self.stack.sup.wait_until(child, partial(http_ok, url), timeout_s, "answering HTTP")

    def restart(self, name: str, timeout_s: float = 30.0) -> None:
        """Start service ``name`` again on its ports; waits until its server answers SERVING (a
        standby planner or budget is SERVING on the server, NOT_SERVING on its service name)."""
        self._wait_up(name, self.stack.sup.respawn(name), timeout_s)
        if name in self._killed_at:
            self.router_down.setdefault(name, []).append((self._killed_at.pop(name), time.monotonic()))

    def down_windows(self) -> dict[str, list[tuple[float, float]]]:
        """Per router, the windows it was down (a router still down: until now)."""
        out = {k: list(v) for k, v in self.router_down.items()}
        for name, at in self._killed_at.items():
            out.setdefault(name, []).append((at, time.monotonic()))
        return out

    def redis_master(self) -> RedisServer:
        """The Redis Cluster master that holds every TAO key (the ``{tao}`` slot)."""
        assert self.cluster is not None
        return self.cluster.slot_owner(TAO_SLOT_KEY)

    def kill_redis_master(self) -> RedisServer:
        node = self.redis_master()
        node.kill(signal.SIGKILL)
        return node

    def wait_redis_failover(self, dead: RedisServer, timeout_s: float = 30.0) -> RedisServer:
        assert self.cluster is not None
        return self.cluster.wait_failover(TAO_SLOT_KEY, dead, timeout_s)

    def freeze(self, name: str) -> None:
        self.stack.sup.send_signal(name, signal.SIGSTOP)

    def thaw_all(self) -> None:
        for child in self.stack.sup.children:
            if child.alive() and child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGCONT)

    def heal(self, timeout_s: float = 60.0) -> None:
        """Back to full strength between scenarios: frozen children run, dead services are
        restarted, killed Redis nodes are started again (they rejoin as replicas)."""
        self.thaw_all()
        for name in self.dead():
            self.restart(name, timeout_s)
        if self.cluster is not None:
            for node in self.cluster.nodes:
                if node.proc is None or node.proc.poll() is not None:
                    node.start()
            self.cluster.wait_healthy(timeout_s)
        for tap in self.taps:
            async def passing(t: ReplicaTap = tap) -> None:
                t.set_mode("pass")

            self._on_loop(passing())

    def dead(self) -> list[str]:
        return [c.name for c in self.stack.sup.dead_children()]

    # ------------------------------------------------------------------ observation

    async def health(self, name: str, service: str = "", timeout_s: float = 1.0) -> str:
        async with grpc.aio.insecure_channel(self.address(name)) as ch:
            try:
                reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                                   timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def leaders(self, kind: str) -> list[str]:
        """The ``kind`` ("planner", "budget") instances SERVING on their service name: the
        leader (what ``tao health HOST:PORT --service tao.planner.v1.PlannerService`` asks)."""
        names = self.planners if kind == "planner" else self.budgets
        service = LEADER_SERVICE_NAMES[kind]
        return [n for n in names if n not in self.dead() and await self.health(n, service) == "SERVING"]

    async def wait_leader(self, kind: str, timeout_s: float, not_: str | None = None) -> str | None:
        """The single leader of ``kind`` (other than ``not_``) once there is exactly one."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [n for n in await self.leaders(kind) if n != not_]
            if len(found) == 1:
                return found[0]
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)

    async def wait_serving(self, timeout_s: float = 30.0) -> dict[str, str]:
        """Every live service SERVING on its server; one leader per active/standby kind."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, str] = {}
        while True:
            status = {n: await self.health(n) for n in self.services}
            for kind in ("planner", "budget"):
                status[f"{kind} leaders"] = str(len(await self.leaders(kind)))
            ok = all(s in ("SERVING", "1") for s in status.values())
            if ok or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.2)

    async def sessions(self, router: str) -> list[router_pb2.SessionInfo]:
        async with grpc.aio.insecure_channel(self.address(router)) as ch:
            reply = await router_pb2_grpc.RouterAdminServiceStub(ch).ListSessions(
                router_pb2.ListSessionsRequest(), timeout=3)
        return list(reply.sessions)

    async def applied_plans(self) -> dict[str, tuple[str, int] | None]:
        """Per live router, the (epoch, revision) of the last plan it applied (through any of
        its live sessions; None when it has none or answers no admin call)."""
        out: dict[str, tuple[str, int] | None] = {}
        dead = set(self.dead())
        for router in self.routers:
            if router in dead:
                continue
            out[router] = None
            try:
                sessions = await self.sessions(router)
                async with grpc.aio.insecure_channel(self.address(router)) as ch:
                    stub = router_pb2_grpc.RouterAdminServiceStub(ch)
                    for s in sessions[:5]:
                        try:
                            reply = await stub.ExplainSession(router_pb2.ExplainSessionRequest(session_id=s.session_id),
                                                              timeout=3)
                        except grpc.aio.AioRpcError:
                            continue
                        if reply.HasField("applied_plan"):
                            out[router] = (reply.applied_plan.epoch, int(reply.applied_plan.revision))
                            break
            except grpc.aio.AioRpcError:
                pass
        return out

