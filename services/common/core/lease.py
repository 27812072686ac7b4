"""Leader lease, the decision side (docs/architecture.md#high-availability).

A role (``planner``, ``budget``; later one router session) is held by whoever owns a Redis key
set with ``SET NX PX`` and a random token; the holder renews it (compare-and-pexpire) every
``renew_s`` and deletes it (compare-and-delete) on shutdown. This module decides *when* to
acquire or renew and *whether this process may act as the holder right now*; the Redis side is
``services.common.lease``.

Safety: Redis starts the key's TTL when it receives the command, never before the holder sent
it, so a holder that measures validity from the instant it *sent* its last successful
acquire/renew, minus ``safety_s`` for clock-rate drift, stops acting before any other process
can acquire the key. Writes are fenced in Redis as well (a Lua script that checks the token
before writing), so a paused or partitioned former holder cannot overwrite its successor even
if its own clock lies.

Every takeover is a new *term* (``INCR`` of the role's term key in the same script; a holder
winning back a lease no one took meanwhile keeps its term), and the holder's writer epoch is
``term_epoch(term, process_epoch)``: terms increase on every takeover, and the process part
keeps epochs unique when the term key is lost in a Redis wipe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class Role(Enum):
    STANDBY = "standby"
    LEADER = "leader"


class Action(Enum):
    ACQUIRE = "acquire"
    RENEW = "renew"


@dataclass(frozen=True)
class LeaseConfig:
    """``ttl_s``: the key's lifetime; renewed every ``renew_s`` (default ttl/3); the holder stops
    acting ``safety_s`` (default 10 % of ttl) before the lease it last confirmed could expire."""

    ttl_s: float
    renew_s: float | None = None
    safety_s: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttl_s) and self.ttl_s > 0):
            raise ValueError("lease ttl_s must be a positive number")
        if not 0 < self.renew_interval_s < self.ttl_s - self.safety_margin_s:
            raise ValueError("lease renew_s must be positive and below ttl_s - safety_s")
        if not 0 <= self.safety_margin_s < self.ttl_s:
            raise ValueError("lease safety_s must be in [0, ttl_s)")

    @property
    def renew_interval_s(self) -> float:
        return self.renew_s if self.renew_s is not None else self.ttl_s / 3.0

    @property
    def safety_margin_s(self) -> float:
        return self.safety_s if self.safety_s is not None else self.ttl_s / 10.0

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))


def term_epoch(term: int, process_epoch: str) -> str:
    """The writer epoch of a holder in ``term``: zero-padded so it also sorts by term."""
    if term < 1:
        raise ValueError("terms start at 1")
    return f"{term:012d}-{process_epoch}"


def epoch_term(epoch: str) -> int | None:
    """The term of an epoch made by ``term_epoch`` (None for a plain start-up epoch)."""
    head, sep, _ = epoch.partition("-")
    return int(head) if sep and head.isdigit() else None


class LeaseCore:
    """The lease state of one process for one role. ``now`` is any monotonic clock in seconds."""

    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        self.role = Role.STANDBY
        self.term = 0
        self.valid_until = -math.inf
        self.next_at = -math.inf  # the next acquire/renew attempt is due then
        self.takeovers = 0
        self.losses = 0

    # ------------------------------------------------------------ queries

    def is_leader(self, now: float) -> bool:
        """True while this process may act as the holder (lease confirmed and not about to expire)."""
        return self.role is Role.LEADER and now < self.valid_until

    def due(self, now: float) -> Action | None:
        """What to send now, if anything."""
        if now < self.next_at:
            return None
        return Action.RENEW if self.role is Role.LEADER else Action.ACQUIRE

    def wait_s(self, now: float) -> float:
        """How long until the next action (or until local validity ends, whichever is first)."""
        until = self.next_at
        if self.role is Role.LEADER:
            until = min(until, self.valid_until)
        return max(0.0, until - now)

    # ------------------------------------------------------------ outcomes

    def acquired(self, term: int, sent_at: float) -> None:
        """The acquire sent at ``sent_at`` won ``term``."""
        if term < 1:
            raise ValueError("a won acquisition has a term >= 1")
        if term != self.term:
            self.takeovers += 1
        self.role = Role.LEADER
        self.term = term
        self._confirmed(sent_at)

    def not_acquired(self, sent_at: float) -> None:
        """Another process holds the lease: stay standby, try again after ``renew_s``."""
        self._step_down()
        self.next_at = sent_at + self.config.renew_interval_s

    def renewed(self, sent_at: float) -> None:
        if self.role is Role.LEADER:
            self._confirmed(sent_at)

    def lost(self, now: float) -> None:
        """The key is gone or holds another token (a renew or fenced write said so)."""
        if self.role is Role.LEADER:
            self.losses += 1
        self._step_down()
        self.next_at = now  # try to win it back at once: another process may not have taken it

    def failed(self, now: float) -> None:
        """Redis did not answer: keep acting only while the last confirmation is valid; retry soon."""
        if self.role is Role.LEADER and now >= self.valid_until:
            self.losses += 1
            self._step_down()
        self.next_at = now + min(self.config.renew_interval_s, 0.25)

    def released(self) -> None:
        self._step_down()

    def _confirmed(self, sent_at: float) -> None:
        self.valid_until = sent_at + self.config.ttl_s - self.config.safety_margin_s
        self.next_at = sent_at + self.config.renew_interval_s

    def _step_down(self) -> None:
        self.role = Role.STANDBY
        self.valid_until = -math.inf
