"""A per-replica circuit breaker (pure; time passed in).

CLOSED: requests flow. ``failure`` ``threshold`` times in a row -> OPEN for at least
``open_s``; a health probe success after that closes it (the probe is the half-open trial,
so no user request is risked on a replica that just failed). Any request success resets
the failure count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Breaker:
    threshold: int = 1
    open_s: float = 5.0
    failures: int = 0
    opened_at_s: float | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at_s is not None

    def failure(self, now_s: float) -> Breaker:
        failures = self.failures + 1
        opened = self.opened_at_s
        if opened is None and failures >= self.threshold:
            opened = now_s
        return Breaker(self.threshold, self.open_s, failures, opened)

    def success(self) -> Breaker:
        if self.failures == 0 and self.opened_at_s is None:
            return self
        if self.opened_at_s is not None:
            return self  # only a probe (``probe_ok``) may close an open breaker
        return Breaker(self.threshold, self.open_s, 0, None)

    def probe_ok(self, now_s: float) -> Breaker:
        """A passing health probe: closes the breaker once it has been open ``open_s``."""
        if self.opened_at_s is not None and now_s - self.opened_at_s < self.open_s:
            return self
        return Breaker(self.threshold, self.open_s, 0, None)
