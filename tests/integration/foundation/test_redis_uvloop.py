"""The services' Redis clients on uvloop, the default event loop: a command that meets a
connection whose transport is already closed (the peer reset it mid-traffic, as the fault
suite's ``proxy_redis`` does) is retried on a new connection, as on asyncio's loop. redis-py
before 8.2 alone passes uvloop's RuntimeError on instead (the first test shows the defect the
translation in ``services.common.redis_client`` exists for; pyproject admits redis>=5.0, so the
translation stays); redis-py 8.2 recovers on its own, and the first test then checks that."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.redis_client import make_redis
from services.common.settings import ServiceSettings
from services.common.testing import RedisClusterProcs

uvloop = pytest.importorskip("uvloop")
_REDIS_PY = tuple(int(x) for x in redis.__version__.split(".")[:2])


async def _ping_after_transport_closed(client: aioredis.Redis) -> object:
    """PING, close the pooled connection's transport under the client, PING again."""
    try:
        assert await client.ping()
        pool = client.connection_pool
        (conn,) = pool._available_connections  # the one connection the first PING used
        conn._writer.transport.abort()  # type: ignore[union-attr]
        return await client.ping()
    finally:
        await client.aclose()


def _on_uvloop(make: Callable[[], aioredis.Redis]) -> object:
    async def main() -> object:
        return await _ping_after_transport_closed(make())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def test_redis_py_alone_raises_uvloops_runtime_error_before_8_2(redis_url: str) -> None:
    def plain() -> aioredis.Redis:
        return aioredis.Redis.from_url(redis_url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
                                       retry_on_error=[RedisConnectionError, RedisTimeoutError])
    if _REDIS_PY < (8, 2):
        with pytest.raises(RuntimeError, match="closed"):
            _on_uvloop(plain)
    else:
        assert _on_uvloop(plain) is True


def test_the_services_client_reconnects_on_uvloop(redis_url: str) -> None:
    assert _on_uvloop(lambda: make_redis(ServiceSettings(redis_url=redis_url))) is True


def test_the_services_cluster_client_reconnects_on_uvloop(redis_cluster: RedisClusterProcs) -> None:
    async def main() -> object:
        client = make_redis(ServiceSettings(redis_url=redis_cluster.url))
        try:
            assert await client.set("{tao}uvloop", "1")
            node = client.get_node_from_key("{tao}uvloop")  # type: ignore[attr-defined]
            conn = node._free[0]  # the connection the SET used, back in the node's free list
            conn._writer.transport.abort()
            return await client.get("{tao}uvloop")
        finally:
            await client.aclose()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == "1"
