"""Fleet-wide per-tenant rate limits in Redis (the rules: ``core/ratelimit.py``).

Every router of a fleet checks a tenant's request against the same two GCRA buckets under
``keys.rate_limit_key(tenant)`` (a hash ``{r: TAT requests, t: TAT tokens}`` in integer
microseconds) with one Lua script, so the check and the debit of both buckets are one atomic
step however many routers share the tenant; a refused request changes nothing. The clock is
the caller's (``now_unix_s``: the router's shared Unix clock, model time), passed into the
script rather than Redis ``TIME``, so tests drive it and an emulated stack scales it; routers
of one fleet must keep their clocks in sync (NTP), as for every shared timestamp.

Redis down or slow (more than ``timeout_s``): the request passes without headers (fail
open; the concurrency caps still hold) and the router logs it at most every 10 s.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import within
from services.common.core.ratelimit import RateLimit
from services.router.core.ratelimit import WINDOW_US, RateDecision, gcra, token_cost

# KEYS[1] the tenant's hash; ARGV: now_us, window_us, rpm, tpm, cost
# returns {allowed, exceeded, level_requests_us, level_tokens_us, retry_after_us}
GCRA_LUA = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local rpm = tonumber(ARGV[3])
local tpm = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local st = redis.call('HMGET', key, 'r', 't')
local tat_r = tonumber(st[1]) or now
local tat_t = tonumber(st[2]) or now
if tat_r < now then tat_r = now end
if tat_t < now then tat_t = now end
local new_r, new_t = tat_r, tat_t
local wait_r, wait_t = 0, 0
if rpm > 0 then
  new_r = tat_r + window / rpm
  local over = new_r - now - window
  if over > 0 then wait_r = math.ceil(over) end
end
if tpm > 0 and cost > 0 then
  new_t = tat_t + cost * window / tpm
  local over = new_t - now - window
  if over > 0 then wait_t = math.ceil(over) end
end
if wait_r > 0 or wait_t > 0 then
  local which = 'tokens'
  if wait_r > 0 then which = 'requests' end
  local wait = wait_r
  if wait_t > wait then wait = wait_t end
  return {0, which, string.format('%.0f', tat_r - now), string.format('%.0f', tat_t - now), string.format('%.0f', wait)}
end
local r = string.format('%.0f', new_r)
local t = string.format('%.0f', new_t)
redis.call('HSET', key, 'r', r, 't', t)
local ttl_us = math.max(tonumber(r), tonumber(t)) - now
redis.call('PEXPIRE', key, math.ceil(ttl_us / 1000) + 1000)
return {1, '', string.format('%.0f', tonumber(r) - now), string.format('%.0f', tonumber(t) - now), '0'}
"""

LOG_EVERY_S = 10.0


class RateLimiter:
    def __init__(self, redis: aioredis.Redis, registry: CollectorRegistry | None = None, timeout_s: float = 0.25,
                 log: Any = None) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self.log = log
        self._script = redis.register_script(GCRA_LUA)
        self._last_log = -LOG_EVERY_S
        self.refused = Counter("tao_router_rate_limited", "Requests refused with 429 by a tenant rate limit.",
                               ["tenant", "limit"], registry=registry) if registry is not None else None

    async def check(self, tenant: str, limit: RateLimit, cost_tokens: int, now_unix_s: float) -> RateDecision | None:
        """The decision for one request of ``tenant``; None when the limiter is unavailable."""
        now_us = int(now_unix_s * 1_000_000)
        if limit.tpm > 0 and cost_tokens > limit.tpm:  # can never pass: no round trip
            decision, _ = gcra(None, None, now_us, limit, cost_tokens)
        else:
            try:
                raw = await within(
                    self._script(keys=[keys.rate_limit_key(tenant)],
                                 args=[now_us, WINDOW_US, limit.rpm, limit.tpm, cost_tokens]),
                    self.timeout_s)
            except (TimeoutError, RedisError, OSError) as exc:
                if asyncio.current_task() is not None and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise
                self._warn(exc)
                return None
            allowed, which, lr, lt, wait = (_text(v) for v in raw)
            decision = RateDecision(allowed == "1", limit, cost_tokens, int(lr), int(lt), which or None, int(wait))
        if not decision.allowed and self.refused is not None:
            self.refused.labels(tenant, decision.exceeded or "requests").inc()
        return decision

    def _warn(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.log is not None and now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            self.log.warning("rate limiter unavailable: requests pass unlimited", error=repr(exc))


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def admit(limiter: RateLimiter, limit: RateLimit, tenant: str, prompt_tokens_estimate: int,
                max_tokens: int | None, default_output_tokens: int,
                now_unix_s: float) -> tuple[RateDecision | None, dict[str, str]]:
    """Check one request of ``tenant`` against its ``limit`` (``limit_for``): (the decision, or
    None when it has no limit or the limiter is unavailable; the ``x-ratelimit-*`` headers for
    its response)."""
    if not limit.active:
        return None, {}
    cost = token_cost(prompt_tokens_estimate, max_tokens, default_output_tokens)
    decision = await limiter.check(tenant, limit, cost, now_unix_s)
    if decision is None:
        return None, {}
    return decision, decision.headers()
