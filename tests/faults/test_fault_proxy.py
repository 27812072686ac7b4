"""The fault proxy itself, against a real Redis: pass, latency, blackhole, reset."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bench.faults.proxy import FaultProxy


async def test_proxy_modes_against_real_redis(redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = await FaultProxy("127.0.0.1", port).start()
    client = aioredis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        assert await client.ping()
        proxy.set_mode("latency", 0.2)
        started = time.monotonic()
        await client.set("k", "v")
        assert time.monotonic() - started >= 0.2
        proxy.set_mode("blackhole")
        with pytest.raises((RedisTimeoutError, RedisConnectionError)):
            await client.get("k")
        proxy.set_mode("reset")
        await asyncio.sleep(0.05)
        with pytest.raises((RedisConnectionError, RedisTimeoutError, ConnectionResetError)):
            await aioredis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)).ping()
        proxy.set_mode("pass")
        fresh = aioredis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        assert await fresh.get("k") == b"v"
        await fresh.aclose()
        with pytest.raises(ValueError):
            proxy.set_mode("flaky")
    finally:
        await client.aclose()
        await proxy.stop()
