"""Writer epochs and revisions (docs/architecture.md#epoch-and-revision-fencing).

A writer picks a random epoch at start-up and numbers what it publishes 1, 2, 3, ... in
process memory, so revisions keep increasing across a Redis wipe. Every publish also
re-asserts ``{tao}:<service>:epoch``; a reader accepts a value only when its epoch equals the
live epoch there and its revision is newer than the last one it applied. A value from a
previous writer process (stale epoch) therefore always loses, even with a higher revision.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass


def new_epoch() -> str:
    """A fresh start-up id (64 random bits, hex)."""
    return secrets.token_hex(8)


@dataclass(frozen=True, order=False)
class Stamp:
    epoch: str
    rev: int


class RevisionCounter:
    """In-process revision numbering for one writer epoch."""

    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch or new_epoch()
        self._rev = 0

    @property
    def last(self) -> int:
        return self._rev

    def next(self) -> Stamp:
        self._rev += 1
        return Stamp(self.epoch, self._rev)


class StampFence:
    """Reader-side fencing: applies only values that are newer within the live epoch."""

    def __init__(self) -> None:
        self.applied: Stamp | None = None

    def admits(self, candidate: Stamp, live_epoch: str | None) -> bool:
        """True when ``candidate`` may be applied.

        ``live_epoch`` is the writer's current epoch as read from Redis (None when unknown,
        e.g. Redis was just wiped: then only a value newer than the applied one in the same
        epoch, or a first value, is admitted).
        """
        if live_epoch is not None and candidate.epoch != live_epoch:
            return False
        if self.applied is None:
            return True
        if candidate.epoch != self.applied.epoch:
            # a new writer epoch that matches the live one replaces the old epoch entirely
            return live_epoch is not None
        return candidate.rev > self.applied.rev

    def mark(self, stamp: Stamp) -> None:
        self.applied = stamp
