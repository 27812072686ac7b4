"""The session vocabulary every layer shares, defined once (docs/architecture.md#session-model).

``Phase`` is a session's phase; ``EvidenceKind`` names what a cache-credit observation is, in
the evidence order of docs/algorithms.md#cache-credit (strongest first). The router core, the
planner core, the Redis records and the simulator import these; the proto enums
(``tao.common.v1.SessionPhase``) are converted at the gRPC edge only. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal, get_args

Phase = Literal["WAITING", "RUNNING", "ACTING", "PAUSED", "ENDED"]
PHASES: tuple[Phase, ...] = get_args(Phase)

EvidenceKind = Literal["kv_events", "cached_tokens", "volume"]
EVIDENCE_KINDS: tuple[EvidenceKind, ...] = get_args(EvidenceKind)
"""Strongest first: KV events, then a cached-token report, then processed volume × hit rate."""

__all__ = ["EVIDENCE_KINDS", "PHASES", "EvidenceKind", "Phase"]
