"""Cache evidence from response usage (docs/algorithms.md#cache-credit, levels 2 and 3).

Level 1, ``kv_events``, comes from replicas that publish vLLM's KV events
(``services/router/kv_events.py``): ``observe_kv`` keeps, per replica, the prompt-prefix tokens
the replica holds now; it is replaced by a request's usage observation on that replica (until
the next refresh) and withdrawn when the replica's event stream is lost.
After a request of prompt P and output O on replica n:
- when n reports ``prompt_tokens_details.cached_tokens`` (now or before), the evidence is
  ``cached_tokens``: k0 = P + O — the request found ``cached`` tokens resident, computed the
  rest of its prompt and its output, and all of it stays in n's prefix cache until evicted;
- otherwise it is ``volume``: the tokens processed for the session on n (bounded by the last
  context, see ``CacheEvidence.volume_tokens``), which the planner scales by n's hit rate.
One usage observation per replica is kept (the newest), beside at most one ``kv_events``
one; a failed replica's evidence is dropped
(the session returns to the pool with zero credit there).
"""

from __future__ import annotations

from services.common.core.evidence import CacheEvidence
from services.common.vocabulary import EvidenceKind
from services.planner.core.values import HALF_LIFE_S
from services.router.core.model import Usage


def observe_usage(
    evidence: tuple[CacheEvidence, ...],
    replica: str,
    usage: Usage,
    replica_reports_cached: bool,
    now_s: float,
) -> tuple[CacheEvidence, ...]:
    """``evidence`` with the observation of one completed request on ``replica`` folded in."""
    prompt = max(0, usage.prompt_tokens)
    output = max(0, usage.completion_tokens)
    cached = 0 if usage.cached_tokens is None else max(0, min(usage.cached_tokens, prompt))
    previous = next((e for e in evidence if e.replica == replica), None)
    processed = (previous.processed_tokens if previous else 0) + (prompt - cached) + output
    kind: EvidenceKind = "cached_tokens" if (usage.cached_tokens is not None or replica_reports_cached) else "volume"
    observation = CacheEvidence(
        replica=replica,
        kind=kind,
        resident_tokens=prompt + output,
        prompt_tokens=prompt,
        cached_tokens=cached,
        processed_tokens=processed,
        observed_at_s=now_s,
    )
    rest = tuple(e for e in evidence if e.replica != replica)
    return (*rest, observation)


def observe_kv(
    evidence: tuple[CacheEvidence, ...], replica: str, tokens: int | None, now_s: float
) -> tuple[CacheEvidence, ...] | None:
    """``evidence`` with the ``kv_events`` observation on ``replica`` set to ``tokens`` (None:
    withdrawn); None when that changes nothing."""
    old = next((e for e in evidence if e.replica == replica and e.kind == "kv_events"), None)
    if tokens is None:
        return None if old is None else tuple(e for e in evidence if e is not old)
    tokens = max(0, tokens)
    if old is not None and old.resident_tokens == tokens:
        return None
    observation = CacheEvidence(replica=replica, kind="kv_events", resident_tokens=tokens, prompt_tokens=0,
                                cached_tokens=0, processed_tokens=0, observed_at_s=now_s)
    return (*(e for e in evidence if e is not old), observation)


def drop_replica(evidence: tuple[CacheEvidence, ...], replica: str) -> tuple[CacheEvidence, ...]:
    return tuple(e for e in evidence if e.replica != replica)


def decayed_credit(e: CacheEvidence, now_s: float) -> float:
    """The planner's credit for ``e`` now, up to the replica's hit rate for ``volume``
    evidence (services/planner/core/values.py: k0 · 2^(−τ/h), ``kv_events`` not decayed);
    used to rank replicas for one session (``CoreConfig.fast_admit``)."""
    if e.kind == "kv_events":
        return float(e.credit_tokens)
    return e.credit_tokens * 2.0 ** (-max(0.0, now_s - e.observed_at_s) / HALF_LIFE_S)
