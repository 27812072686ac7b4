"""Time is injected: cores take a ``Clock`` and never read wall-clock time themselves.

``WallClock`` is for services; ``VirtualClock`` for tests and the simulator, which
advance it explicitly. Times are seconds as floats.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's timeline (monotonic for WallClock)."""
        ...


class WallClock:
    """Monotonic seconds; use ``wall()`` only for timestamps shown to people."""

    def now(self) -> float:
        return time.monotonic()

    @staticmethod
    def wall() -> float:
        return time.time()


class VirtualClock:
    """A clock that moves only when told to."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def advance(self, dt_s: float) -> float:
        if dt_s < 0:
            raise ValueError(f"cannot move a clock backwards by {dt_s} s")
        self._now += dt_s
        return self._now

    def set(self, t_s: float) -> None:
        if t_s < self._now:
            raise ValueError(f"cannot move a clock backwards from {self._now} to {t_s}")
        self._now = t_s
