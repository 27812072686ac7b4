"""Rate-limit rules (pure): GCRA arithmetic, OpenAI's headers and 429 body, configuration."""

from __future__ import annotations

import pytest

from services.router.core.ratelimit import (
    WINDOW_US,
    RateLimit,
    duration,
    gcra,
    limit_for,
    parse_limits,
    token_cost,
)


def run(limit: RateLimit, offered_per_s: float, seconds: float, cost: int = 1) -> int:
    """Offer requests evenly for ``seconds`` (after draining the bucket); count those admitted."""
    tat: tuple[int | None, int | None] = (None, None)
    now = 0
    while True:  # drain the initial minute's worth
        d, new = gcra(*tat, now, limit, cost)
        if new is None:
            break
        tat = new
    admitted = 0
    step = 1_000_000 / offered_per_s
    for i in range(int(seconds * offered_per_s)):
        d, new = gcra(*tat, round(i * step), limit, cost)
        if new is not None:
            tat = new
            admitted += 1
    return admitted


@pytest.mark.parametrize("rpm", [60, 600, 7])
def test_admits_the_configured_request_rate(rpm: int) -> None:
    admitted = run(RateLimit(rpm=rpm), offered_per_s=3 * rpm / 60, seconds=30.0)
    assert abs(admitted - rpm / 2) <= max(1, 0.05 * rpm / 2), admitted


def test_admits_the_configured_token_rate() -> None:
    admitted = run(RateLimit(tpm=60_000), offered_per_s=5, seconds=30.0, cost=1000)  # 1 request/s of 1000 tokens
    assert abs(admitted - 30) <= 1.5


def test_bucket_holds_a_minute_and_refusal_changes_nothing() -> None:
    limit = RateLimit(rpm=3, tpm=1000)
    tat: tuple[int | None, int | None] = (None, None)
    for i in range(3):
        d, new = gcra(*tat, 0, limit, 100)
        assert d.allowed and new is not None
        assert d.remaining_requests() == 2 - i
        tat = new
    d, new = gcra(*tat, 0, limit, 100)
    assert not d.allowed and new is None and d.exceeded == "requests"
    assert d.retry_after_us == 20_000_000  # one request every 20 s
    h = d.headers()
    assert h["x-ratelimit-limit-requests"] == "3" and h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"] == "1m0s" and h["Retry-After"] == "20"
    assert h["x-ratelimit-limit-tokens"] == "1000" and h["x-ratelimit-remaining-tokens"] == "700"
    body = d.error_body("A")["error"]
    assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded" and body["param"] is None
    assert "Limit 3" in body["message"] and "try again in 20s" in body["message"]
    d2, new2 = gcra(*tat, 20_000_000, limit, 100)  # 20 s later: one more
    assert d2.allowed and new2 is not None


def test_tokens_limit_and_a_request_too_large() -> None:
    limit = RateLimit(tpm=1000)
    d, new = gcra(None, None, 0, limit, 800)
    assert d.allowed and new is not None
    d, none = gcra(*new, 0, limit, 300)
    assert not d.allowed and none is None and d.exceeded == "tokens"
    assert d.retry_after_us == round(100 * WINDOW_US / 1000)  # 100 tokens refill in 6 s
    assert d.error_body("A")["error"]["type"] == "tokens"
    big, none = gcra(None, None, 0, limit, 1001)
    assert not big.allowed and big.too_large and "Request too large" in big.error_body("A")["error"]["message"]


def test_duration_format() -> None:
    assert duration(0.02) == "20ms" and duration(1.5) == "1.5s" and duration(6) == "6s"
    assert duration(360) == "6m0s" and duration(3723) == "1h2m3s" and duration(0) == "0s"


def test_parse_limits_and_lookup() -> None:
    limits = parse_limits({"A": {"rpm": 10}, "*": {"tpm": 500}}, "x")
    assert limit_for(limits, "A") == RateLimit(rpm=10) and limit_for(limits, "B") == RateLimit(tpm=500)
    assert not limit_for({}, "A").active
    for bad in ({"A": {"rpm": -1}}, {"A": {"rps": 1}}, {"A": 5}, [1], {"A": {"rpm": True}}):
        with pytest.raises(ValueError):
            parse_limits(bad, "x")
    assert token_cost(100, None, 256) == 356 and token_cost(100, 10, 256) == 110
