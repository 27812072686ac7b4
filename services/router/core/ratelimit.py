"""Per-tenant request and token rate limits (pure: the rules, the reference arithmetic and the
OpenAI-style answer; the fleet-wide state lives in Redis, ``services/router/ratelimit.py``).

A tenant may have a limit in requests per minute (``rpm``) and in tokens per minute
(``tpm``); 0 means none. Each is a GCRA (generic cell rate algorithm, i.e. a token bucket
kept as one timestamp): the bucket holds a minute's worth (``rpm`` requests, ``tpm``
tokens), refills continuously at the limit's rate, and a request takes 1 from the request
bucket and its token cost from the token bucket. A request passes only when both buckets
have room, and then both are debited in one atomic step; a refused request changes nothing.
Over a long run a tenant that asks for more gets exactly the configured rate.

A request's token cost is what it may use, as OpenAI counts it: the prompt estimate plus
``max_tokens`` (or the router's ``default_output_tokens`` when the request sets none). A
request whose cost exceeds the whole ``tpm`` can never pass: it gets a 429 at once.

``STATE`` is the GCRA state: the theoretical arrival time (TAT) per bucket, in integer
microseconds on the shared Unix clock (model time, docs/architecture.md#model-time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.core.ratelimit import NO_LIMIT, RateLimit

WINDOW_S = 60.0
WINDOW_US = 60_000_000
REQUESTS = "requests"
TOKENS = "tokens"


def parse_limits(raw: object, where: str) -> dict[str, RateLimit]:
    """``{tenant: {rpm, tpm}}`` (``"*"``: every tenant not listed) -> RateLimits; ValueError."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: 'limits' must map tenant -> {{rpm, tpm}}")
    out = {}
    for tenant, spec in raw.items():
        if not isinstance(tenant, str) or not tenant or not isinstance(spec, dict):
            raise ValueError(f"{where}: limits[{tenant!r}] must be a mapping with rpm and/or tpm")
        unknown = set(spec) - {"rpm", "tpm"}
        if unknown:
            raise ValueError(f"{where}: limits[{tenant!r}]: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        values = {}
        for k in ("rpm", "tpm"):
            v = spec.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}: limits[{tenant!r}].{k} must be an integer >= 0")
            values[k] = v
        out[tenant] = RateLimit(**values)
    return out


def limit_for(limits: Mapping[str, RateLimit], tenant: str, *weaker: Mapping[str, RateLimit]) -> RateLimit:
    """The tenant's limit in ``limits``, else in each of ``weaker`` in turn; then ``"*"`` the same
    way; else none. (The router's layers, strongest first: the budget's, the keys file's, its
    settings'; looked up in place, not merged per request.)"""
    for key in (tenant, "*"):
        for layer in (limits, *weaker):
            hit = layer.get(key)
            if hit is not None:
                return hit
    return NO_LIMIT


def token_cost(prompt_tokens_estimate: int, max_tokens: int | None, default_output_tokens: int) -> int:
    return max(0, prompt_tokens_estimate) + (max_tokens if max_tokens is not None else default_output_tokens)


@dataclass(frozen=True, slots=True)
class RateDecision:
    """The outcome of one check: whether it passes, and the bucket levels after it (before
    it when refused) for the ``x-ratelimit-*`` headers."""

    allowed: bool
    limit: RateLimit
    cost_tokens: int
    #: microseconds of each bucket in use (TAT - now): 0 = full bucket, WINDOW_US = empty
    level_requests_us: int
    level_tokens_us: int
    #: which limit refused it (``requests`` first), None when allowed
    exceeded: str | None = None
    #: microseconds until it would pass
    retry_after_us: int = 0
    #: its cost exceeds the whole token limit: it can never pass
    too_large: bool = False

    def remaining_requests(self) -> int:
        return _remaining(self.limit.rpm, self.level_requests_us)

    def remaining_tokens(self) -> int:
        return _remaining(self.limit.tpm, self.level_tokens_us)

    def headers(self) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers (and ``Retry-After`` when refused)."""
        out: dict[str, str] = {}
        if self.limit.rpm > 0:
            out["x-ratelimit-limit-requests"] = str(self.limit.rpm)
            out["x-ratelimit-remaining-requests"] = str(self.remaining_requests())
            out["x-ratelimit-reset-requests"] = duration(self.level_requests_us / 1e6)
        if self.limit.tpm > 0:
            out["x-ratelimit-limit-tokens"] = str(self.limit.tpm)
            out["x-ratelimit-remaining-tokens"] = str(self.remaining_tokens())
            out["x-ratelimit-reset-tokens"] = duration(self.level_tokens_us / 1e6)
        if not self.allowed:
            wait_s = WINDOW_S if self.too_large else self.retry_after_us / 1e6
            out["Retry-After"] = str(max(1, math.ceil(wait_s)))
            out["retry-after-ms"] = str(max(1, math.ceil(wait_s * 1000)))
        return out

    def error_body(self, tenant: str) -> dict[str, Any]:
        """OpenAI's 429 body."""
        kind = self.exceeded or REQUESTS
        if self.too_large:
            message = (f"Request too large for tenant {tenant} on tokens per min (TPM): Limit {self.limit.tpm}, "
                       f"Requested {self.cost_tokens}. Lower max_tokens or the prompt.")
        elif kind == REQUESTS:
            message = (f"Rate limit reached for tenant {tenant} on requests per min (RPM): Limit {self.limit.rpm}, "
                       f"Used {self.limit.rpm - self.remaining_requests()}, Requested 1. Please try again in "
                       f"{duration(self.retry_after_us / 1e6)}.")
        else:
            message = (f"Rate limit reached for tenant {tenant} on tokens per min (TPM): Limit {self.limit.tpm}, "
                       f"Used {self.limit.tpm - self.remaining_tokens()}, Requested {self.cost_tokens}. Please try "
                       f"again in {duration(self.retry_after_us / 1e6)}.")
        return {"error": {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}}


def _remaining(limit: int, level_us: int) -> int:
    if limit <= 0:
        return 0
    return max(0, min(limit, math.floor((WINDOW_US - level_us) * limit / WINDOW_US)))


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    total = math.ceil(seconds)
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return (f"{h}h" if h else "") + f"{m}m{s}s"


def gcra(tat_requests_us: int | None, tat_tokens_us: int | None, now_us: int, limit: RateLimit,
         cost: int) -> tuple[RateDecision, tuple[int, int] | None]:
    """The reference step (the Lua script in ``services/router/ratelimit.py`` does the same):
    the decision and the new (TAT requests, TAT tokens), or None when refused (no change)."""
    tat_r = max(now_us, tat_requests_us if tat_requests_us is not None else now_us)
    tat_t = max(now_us, tat_tokens_us if tat_tokens_us is not None else now_us)
    if limit.tpm > 0 and cost > limit.tpm:
        return RateDecision(False, limit, cost, tat_r - now_us, tat_t - now_us, TOKENS, 0, True), None
    new_r, new_t = float(tat_r), float(tat_t)
    wait_r = wait_t = 0
    if limit.rpm > 0:
        new_r = tat_r + WINDOW_US / limit.rpm
        wait_r = max(0, math.ceil(new_r - now_us - WINDOW_US))
    if limit.tpm > 0 and cost > 0:
        new_t = tat_t + cost * WINDOW_US / limit.tpm
        wait_t = max(0, math.ceil(new_t - now_us - WINDOW_US))
    if wait_r or wait_t:
        which = REQUESTS if wait_r else TOKENS
        return RateDecision(False, limit, cost, tat_r - now_us, tat_t - now_us, which, max(wait_r, wait_t)), None
    r, t = round(new_r), round(new_t)
    return RateDecision(True, limit, cost, r - now_us, t - now_us), (r, t)
