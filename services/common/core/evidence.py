"""Cache evidence, the one type (docs/algorithms.md#cache-credit, docs/architecture.md#one-contract).

``CacheEvidence`` is what is known about one session's cache on one replica. The router core
writes it (``services.router.core.cache``: from a request's usage, or from the replica's KV
events); the Redis ``SessionRecord`` stores it (``services.common.records``, Unix clock); the
planner core values it (``services.planner.core.values``: ``credit_tokens`` decayed, and scaled
by the replica's hit rate for ``volume`` evidence); the simulator adds ``kv_events`` evidence
(``services.sim.cluster.kv_events``). ``observed_at_s`` is on the clock of whatever holds it:
the router's clock in the router core, Unix seconds in a record and in a snapshot built from
records, the snapshot's clock in a snapshot.

The snapshot JSON and the planner proto carry only the credit figure (``tokens``);
``CacheEvidence.of_credit`` reads such a credit back, with ``credit_tokens`` unchanged. Pure:
no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from services.common.vocabulary import EvidenceKind


@dataclass(frozen=True, slots=True)
class CacheEvidence:
    """The latest observation of a session's cache on one replica.

    ``resident_tokens`` is k0 for ``cached_tokens`` and ``kv_events`` evidence (for a usage
    observation: the whole context the last request on the replica computed or hit, i.e. its
    prompt + output; for KV events: the prompt-prefix tokens the replica holds now). For
    ``volume`` evidence (the replica never reports cached tokens) ``volume_tokens`` is what the
    planner multiplies by the replica's observed prefix hit rate. ``prompt_tokens`` and
    ``cached_tokens`` are the observing request's (0 for KV events and for a credit read from
    a snapshot); ``processed_tokens`` is the total the session has processed on the replica.
    """

    replica: str
    kind: EvidenceKind
    resident_tokens: int
    prompt_tokens: int
    cached_tokens: int
    processed_tokens: int
    observed_at_s: float

    @property
    def volume_tokens(self) -> int:
        """Processed volume bounded by what can be resident (the last context on the replica)."""
        return min(self.processed_tokens, self.resident_tokens)

    @property
    def credit_tokens(self) -> int:
        """The credit figure before decay (and, for ``volume``, before the hit rate): the
        ``tokens`` of a snapshot credit (docs/architecture.md#snapshot-and-plan-json)."""
        return self.volume_tokens if self.kind == "volume" else self.resident_tokens

    @classmethod
    def of_credit(cls, replica: str, tokens: int, observed_at_s: float, kind: str = "cached_tokens") -> CacheEvidence:
        """Evidence read from a snapshot credit (JSON or proto), whose ``credit_tokens`` is
        ``tokens``. ``kind`` is not checked here: ``Snapshot.validate`` names a bad one."""
        return cls(replica=replica, kind=cast(EvidenceKind, kind), resident_tokens=tokens, prompt_tokens=0,
                   cached_tokens=0, processed_tokens=tokens if kind == "volume" else 0, observed_at_s=observed_at_s)


def last_used_replica(evidence: Iterable[CacheEvidence]) -> str | None:
    """The replica of the newest usage observation among ``evidence`` (where the session's last
    request ran), or None. KV-event evidence is left out: a replica can hold a session's shared
    prefix without ever having served it. Continuum's home replica, read by its planner port and
    by the router core's arrival rule."""
    usage = [e for e in evidence if e.kind != "kv_events"]
    return max(usage, key=lambda e: (e.observed_at_s, e.replica)).replica if usage else None


__all__ = ["CacheEvidence", "last_used_replica"]
