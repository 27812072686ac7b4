"""One way to build Redis clients: explicit timeouts, bounded retry, ACL user, TLS."""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

if TYPE_CHECKING:
    from services.common.settings import ServiceSettings


def make_redis(settings: ServiceSettings) -> aioredis.Redis:
    """An asyncio Redis client for ``settings.redis_url`` (``redis://`` or ``rediss://``).

    Operations time out after ``redis_timeout_s`` and are retried up to three times with
    exponential backoff on connection errors, so a brief Redis restart is ridden out.
    """
    kwargs: dict[str, object] = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 10,
        "decode_responses": True,
        "client_name": f"tao-{settings.service_name}",
    }
    if settings.redis_username:
        kwargs["username"] = settings.redis_username
    if settings.redis_password is not None:
        kwargs["password"] = settings.redis_password.get_secret_value()
    if settings.redis_url.startswith("rediss://") and settings.redis_ca_file is not None:
        kwargs["ssl_ca_certs"] = str(settings.redis_ca_file)
    return aioredis.Redis.from_url(settings.redis_url, **kwargs)  # type: ignore[arg-type]
