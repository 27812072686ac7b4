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


class ScaledClock:
    """Model time for emulation runs where replicas run ``scale`` times faster than wall time.

    ``now()`` is monotonic seconds x scale and ``unix()`` Unix seconds x scale, so every
    process on the machine agrees on model time without coordination (no shared anchor).
    With ``scale == 1`` it is the wall clock. Services put ``unix()`` into records they share
    and compare them with their own ``unix()``; tool runners stamp events the same way.
    """

    def __init__(self, scale: float = 1.0) -> None:
        if not scale > 0:
            raise ValueError(f"time scale must be > 0, got {scale}")
        self.scale = float(scale)

    def now(self) -> float:
        return time.monotonic() * self.scale

    def unix(self) -> float:
        return time.time() * self.scale

    def wall_seconds(self, model_s: float) -> float:
        """How long ``model_s`` model seconds take on the wall clock (for sleeps)."""
        return model_s / self.scale
