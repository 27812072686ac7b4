"""``redis_url`` forms (services/common/redis_client.py): one server, Sentinel, Cluster; bad URLs
stop start-up with one line; the client built for each kind is the right class."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from services.common.errors import StartupError
from services.common.redis_client import make_redis, parse_redis_url
from services.common.settings import load_settings
from services.planner.settings import Settings


def test_single_server_urls_pass_through() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://u:p@h:6380/2", "unix:///run/redis.sock"):
        assert parse_redis_url(url).kind == "single"
    assert parse_redis_url("rediss://h:1").tls and not parse_redis_url("redis://h:1").tls


def test_sentinel_url_names_sentinels_service_db_and_credentials() -> None:
    t = parse_redis_url("redis+sentinel://tao:s%40cret@10.0.0.1:26379,[::1]:26380,s3:26381/mymaster/3")
    assert (t.kind, t.tls, t.service_name, t.db) == ("sentinel", False, "mymaster", 3)
    assert t.nodes == (("10.0.0.1", 26379), ("::1", 26380), ("s3", 26381))
    assert (t.username, t.password) == ("tao", "s@cret")
    assert parse_redis_url("rediss+sentinel://a:1/m").tls


def test_cluster_url_names_seeds() -> None:
    t = parse_redis_url("redis+cluster://a:7000,b:7001")
    assert (t.kind, t.nodes, t.db) == ("cluster", (("a", 7000), ("b", 7001)), 0)
    assert parse_redis_url("rediss+cluster://a:7000/0").tls


@pytest.mark.parametrize(("url", "fragment"), [
    ("http://h:1", "must start with"),
    ("h:6379", "must start with"),
    ("redis+sentinel://a:1", "service_name"),
    ("redis+sentinel://a:1/m/x", "service_name"),
    ("redis+sentinel://a/m", "host:port"),
    ("redis+cluster://a:1,b:notaport", "host:port"),
    ("redis+cluster://a:70000", "host:port"),
    ("redis+cluster://a:1/2", "only database 0"),
])
def test_bad_urls_are_refused_with_a_reason(url: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_redis_url(url)
    with pytest.raises(StartupError, match=f"redis_url: .*{fragment}"):
        load_settings(Settings, redis_url=url)


async def test_each_kind_builds_its_client_without_connecting() -> None:
    single = make_redis(load_settings(Settings, redis_url="redis://127.0.0.1:1/0"))
    sentinel = make_redis(load_settings(Settings, redis_url="redis+sentinel://127.0.0.1:1,127.0.0.1:2/m/1",
                                        redis_sentinel_password="sp"))
    cluster = make_redis(load_settings(Settings, redis_url="redis+cluster://127.0.0.1:1,127.0.0.1:2"))
    try:
        assert type(single) is Redis
        assert isinstance(sentinel, Redis) and isinstance(sentinel.connection_pool, SentinelConnectionPool)
        assert sentinel.connection_pool.service_name == "m"
        assert sentinel.connection_pool.connection_kwargs["db"] == 1
        assert isinstance(cluster, RedisCluster)
    finally:
        for client in (single, sentinel, cluster):
            await client.aclose()


def test_every_key_carries_the_hash_tag_and_hashes_to_one_cluster_slot() -> None:
    from redis.crc import key_slot

    from services.common import keys
    from services.predictor import store as predictor_store

    every = [*keys.OWNERS, predictor_store.LOG, predictor_store.STATE, keys.rate_limit_key("tenant-a"),
             *(f(s) for s in ("router", "planner", "predictor", "budget")
               for f in (keys.epoch_key, keys.lease_key, keys.term_key))]
    assert all(k.startswith("{tao}:") for k in every), [k for k in every if not k.startswith("{tao}:")]
    assert {key_slot(k.encode()) for k in every} == {key_slot(b"tao")}
    assert keys.owner_of(keys.lease_key("planner")) == "planner"
