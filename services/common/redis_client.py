"""One way to build Redis clients: explicit timeouts, bounded retry, ACL user, TLS; a single
server, a Sentinel-managed master, or a Redis Cluster (docs/architecture.md#redis-cluster-and-sentinel).

``redis_url`` forms:

- ``redis://[user:pass@]host:port/db``, ``rediss://...``, ``unix:///path``: one server;
- ``redis+sentinel://[user:pass@]host:port,host:port,.../service_name[/db]`` (``rediss+sentinel``
  for TLS to the master): the master the sentinels name for ``service_name``; after a failover new
  connections go to the new master and commands are retried;
- ``redis+cluster://[user:pass@]host:port,host:port,...`` (``rediss+cluster``): a Redis Cluster
  seeded by those nodes. Every TAO key carries the ``{tao}`` hash tag (``services.common.keys``),
  so every transaction and script touches one slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

if TYPE_CHECKING:
    from services.common.settings import ServiceSettings

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SINGLE_SCHEMES = ("redis", "rediss", "unix")

#: PUBLISH ARGV[2..] on channel ARGV[1]. redis-py refuses PUBLISH inside a Cluster pipeline;
#: as a script it rides in the same pipeline or MULTI on every kind of deployment. KEYS[1] is any
#: ``{tao}`` key, so a Cluster pipeline sends it to the slot of the rest.
PUBLISH_MANY_LUA = "for i = 2, #ARGV do redis.call('PUBLISH', ARGV[1], ARGV[i]) end return #ARGV - 1"


@dataclass(frozen=True)
class RedisTarget:
    """A parsed ``redis_url``."""

    kind: Literal["single", "sentinel", "cluster"]
    tls: bool
    nodes: tuple[tuple[str, int], ...] = ()  # sentinels or cluster seeds
    service_name: str = ""  # sentinel only
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_redis_url(url: str) -> RedisTarget:
    """Validate and split ``url``; raises ValueError with what is wrong."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in (*SINGLE_SCHEMES, *SENTINEL_SCHEMES, *CLUSTER_SCHEMES):
        raise ValueError("must start with redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://, "
                         "redis+cluster:// or rediss+cluster://")
    tls = scheme.startswith("rediss")
    if scheme in SINGLE_SCHEMES:
        return RedisTarget("single", tls)
    parts = urlsplit(url)
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        user, _, pw = creds.partition(":")
        username, password = unquote(user) or None, unquote(pw) if pw else None
    nodes = []
    for item in netloc.split(","):
        host, colon, port_s = item.strip().rpartition(":")
        if not colon or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise ValueError(f"{scheme}:// needs host:port[,host:port...]; got {item!r}")
        nodes.append((host.strip("[]"), int(port_s)))
    path = [p for p in parts.path.split("/") if p]
    if scheme in SENTINEL_SCHEMES:
        if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
            raise ValueError(f"{scheme}:// needs /service_name[/db] after the sentinels")
        return RedisTarget("sentinel", tls, tuple(nodes), path[0], int(path[1]) if len(path) == 2 else 0,
                           username, password)
    if path and path != ["0"]:
        raise ValueError("a Redis Cluster has only database 0")
    return RedisTarget("cluster", tls, tuple(nodes), "", 0, username, password)


def make_redis(settings: ServiceSettings) -> aioredis.Redis:
    """An asyncio Redis client for ``settings.redis_url`` (any form above).

    Operations time out after ``redis_timeout_s`` and are retried up to three times with
    exponential backoff on connection errors, so a brief Redis restart or a Sentinel failover is
    ridden out. A ``RedisCluster`` is returned typed as ``Redis``: TAO uses only commands, pipelines,
    scripts and pub/sub, which both provide.
    """
    target = parse_redis_url(settings.redis_url)
    # the client options every kind of client takes as keyword arguments (typed per parameter by
    # redis-py 8.2, untyped before)
    kwargs: dict[str, Any] = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 10,
        "decode_responses": True,
        "client_name": f"tao-{settings.service_name}",
    }
    username = settings.redis_username or target.username
    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else target.password
    if username:
        kwargs["username"] = username
    if password is not None:
        kwargs["password"] = password
    if target.tls:
        if target.kind != "single":
            kwargs["ssl"] = True
        if settings.redis_ca_file is not None:
            kwargs["ssl_ca_certs"] = str(settings.redis_ca_file)
    if target.kind == "sentinel":
        sentinel_kwargs: dict[str, object] = {"socket_timeout": settings.redis_timeout_s,
                                              "socket_connect_timeout": settings.redis_timeout_s,
                                              "decode_responses": True}
        if settings.redis_sentinel_password is not None:
            sentinel_kwargs["password"] = settings.redis_sentinel_password.get_secret_value()
        sentinel = Sentinel(list(target.nodes), sentinel_kwargs=sentinel_kwargs, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
        client = cast(aioredis.Redis, sentinel.master_for(target.service_name, db=target.db))
    elif target.kind == "cluster":
        cluster = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes], **kwargs)
        # RedisCluster picks its connection class itself (no parameter): every node it creates
        # later is built from the manager's connection kwargs, the seeds already exist
        manager = cluster.nodes_manager
        manager.connection_kwargs["connection_class"] = loop_neutral(
            manager.connection_kwargs.get("connection_class", Connection))
        for node in manager.startup_nodes.values():
            node.connection_class = loop_neutral(node.connection_class)
        return cast(aioredis.Redis, cluster)
    else:
        client = aioredis.Redis.from_url(settings.redis_url, **kwargs)
    pool = client.connection_pool
    pool.connection_class = loop_neutral(pool.connection_class)
    return client


class _ClosedTransportAsConnectionError:
    """A Redis connection that raises, on uvloop, what it raises on asyncio's loop.

    When the peer resets a connection, uvloop's transport raises ``RuntimeError("unable to
    perform operation on <TCPTransport closed=True ...>; the handler is closed")`` where
    asyncio's raises ``ConnectionError``/``OSError``. redis-py drops the connection either way,
    but passes a RuntimeError on unchanged: outside its retry policy (which would reconnect)
    and outside every ``except (RedisError, OSError)`` of the services, so a health or lease loop
    died of it and a stack on uvloop lost requests after a Redis reset (the fault suite's
    ``proxy_redis``). Only errors about a closed transport or loop are translated."""

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]
        except RuntimeError as exc:
            if "closed" not in str(exc):
                raise
            raise RedisConnectionError(f"Error while writing to Redis: {exc}") from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except RuntimeError as exc:
            if "closed" not in str(exc):
                raise
            raise RedisConnectionError(f"Error while reading from Redis: {exc}") from exc


_LOOP_NEUTRAL: dict[type, type] = {}
C = TypeVar("C", bound=AbstractConnection)


def loop_neutral(cls: type[C]) -> type[C]:
    """``cls`` with ``_ClosedTransportAsConnectionError`` in front (one subclass per class)."""
    if issubclass(cls, _ClosedTransportAsConnectionError):
        return cls
    if cls not in _LOOP_NEUTRAL:
        _LOOP_NEUTRAL[cls] = type(cls.__name__, (_ClosedTransportAsConnectionError, cls), {})
    return _LOOP_NEUTRAL[cls]


async def transaction(redis: aioredis.Redis) -> Pipeline:
    """``redis.pipeline(transaction=True)`` (MULTI/EXEC), safe on a Redis Cluster.

    redis-py's asyncio cluster transaction pipeline (8.1) queues each command by running it on a
    new event loop in a thread that the calling loop joins. When the cluster client is due to
    reload its slot map (a node failed), that thread starts the reload under the client's asyncio
    lock, which a coroutine of the blocked calling loop may hold mid-reload: both wait forever.
    The fleet fault suite hung the leader planner this way when it killed a Redis master. So the
    reload runs here first, on the caller's loop; queueing then does no I/O and no ``await``,
    so nothing can flag another reload before the pipeline is built.
    """
    await reload_slots(redis)
    return redis.pipeline(transaction=True)


async def reload_slots(redis: aioredis.Redis) -> None:
    """On a Redis Cluster client, a slot-map reload that is due, on the caller's loop (call it
    again before queueing into a ``transaction`` pipeline after any ``await``: WATCH)."""
    if isinstance(redis, RedisCluster):
        await redis.initialize()


def publish_in(pipe: Any, slot_key: str, channel: str, messages: list[str]) -> None:
    """Queue PUBLISH of ``messages`` on ``channel`` in ``pipe`` (a pipeline or MULTI of any kind of
    deployment, Cluster included), as one script call routed by ``slot_key``."""
    if messages:
        pipe.eval(PUBLISH_MANY_LUA, 1, slot_key, channel, *messages)
