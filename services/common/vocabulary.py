"""The session vocabulary every layer shares, defined once (docs/architecture.md#session-model).

``Phase`` is a session's phase; ``EvidenceKind`` names what a cache-credit observation is, in
the evidence order of docs/algorithms.md#cache-credit (strongest first). ``serves_model`` is
the one model-eligibility rule (docs/architecture.md#models-and-block-size) and
``DEFAULT_BLOCK_SIZE`` the KV block size assumed for a replica that has not reported its own. The router core, the
planner core, the Redis records and the simulator import these; the proto enums
(``tao.common.v1.SessionPhase``) are converted at the gRPC edge only. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal, get_args

Phase = Literal["WAITING", "RUNNING", "ACTING", "PAUSED", "ENDED"]
PHASES: tuple[Phase, ...] = get_args(Phase)

EvidenceKind = Literal["kv_events", "cached_tokens", "volume"]
EVIDENCE_KINDS: tuple[EvidenceKind, ...] = get_args(EvidenceKind)
"""Strongest first: KV events, then a cached-token report, then processed volume × hit rate."""

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size in tokens (``CacheConfig.block_size``), used only for a replica
whose ``vllm:cache_config_info`` has not said its own."""


def serves_model(served: Collection[str], model: str) -> bool:
    """A replica serving ``served`` may take a request or session for ``model``. A session that
    named no model (``""``: the simulator's, a hand-written snapshot's) may go anywhere; a
    named model only to a replica whose ``/v1/models`` lists it (unknown lists serve nothing)."""
    return not model or model in served


__all__ = ["DEFAULT_BLOCK_SIZE", "EVIDENCE_KINDS", "PHASES", "EvidenceKind", "Phase", "serves_model"]
