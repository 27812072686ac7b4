"""Router integration harness: in-process emulated vLLM replicas (``tao vllm-sim``), the
router on port 0 over a real Redis, and a killable replica process for failover tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from services.common.redis_client import make_redis
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from services.router.runtime import RouterRuntime
from services.router.server import RouterApp, Settings

MODEL = "Qwen/Qwen3-32B"
TIME_SCALE = 100.0


@dataclass
class Router:
    app: RouterApp
    grpc_address: str
    redis: aioredis.Redis

    @property
    def url(self) -> str:
        return self.app.base_url

    @property
    def rt(self) -> RouterRuntime:
        assert self.app.runtime is not None
        return self.app.runtime

    async def flushed(self) -> None:
        """Wait until the write-behind store has written everything dirty."""
        await self.rt.store.flush()


#: a gating policy without admission at arrival (CoreConfig.fast_admit ""): every request of a
#: pool session waits for a plan, even one that nothing contends with, which ``tao`` would admit
#: at once; for the tests of plans, holds and the local fallback
PLANNED = "tao-hold"


@contextlib.asynccontextmanager
async def start_router(redis_url: str, replicas: list[str], **overrides: Any) -> AsyncIterator[Router]:
    values: dict[str, Any] = {
        "port": 0, "http_port": 0, "replicas": replicas, "plan_stale_s": 0.3, "health_interval_s": 0.2,
        "redis_startup_timeout_s": 2.0, "flush_interval_s": 0.005, **overrides,
    }
    settings = load_settings(Settings, redis_url=redis_url, **values)
    app = RouterApp(settings)
    client = make_redis(settings)  # any redis_url form (a Cluster's too)
    try:
        async with serve_in_process("router", app, settings) as running:
            router = Router(app, running.address, client)
            await wait_for(lambda: bool(router.rt.models), "router saw no replica model")
            yield router
    finally:
        await client.aclose()


async def wait_for(cond: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out: {what}")
        await asyncio.sleep(0.02)



class SimProcess:
    """``tao vllm-sim`` in its own process, so a test can SIGKILL it."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        self.url = ""

    def wait_listening(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.kill()
            raise RuntimeError(f"vllm-sim did not start: {line!r}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        return self.url

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
