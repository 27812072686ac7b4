"""A tenant's request and token rate limits, the one type every service uses for them: the
budget service carries them in its tenant configuration and publishes them with each
allocation, the router enforces them (``services/router/core/ratelimit.py``, the GCRA and the
OpenAI-style answer)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Requests per minute and tokens per minute (prompt estimate + ``max_tokens``); 0 = none."""

    rpm: int = 0
    tpm: int = 0

    def __post_init__(self) -> None:
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError("rpm and tpm must be >= 0")

    @property
    def active(self) -> bool:
        return self.rpm > 0 or self.tpm > 0


NO_LIMIT = RateLimit()

__all__ = ["NO_LIMIT", "RateLimit"]
