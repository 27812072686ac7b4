"""Cache evidence from response usage (docs/algorithms.md#cache-credit, levels 2 and 3).

The router sees no KV events (level 1 is the planner's business when replicas publish them).
After a request of prompt P and output O on replica n:
- when n reports ``prompt_tokens_details.cached_tokens`` (now or before), the evidence is
  ``cached_tokens``: k0 = P + O — the request found ``cached`` tokens resident, computed the
  rest of its prompt and its output, and all of it stays in n's prefix cache until evicted;
- otherwise it is ``volume``: the tokens processed for the session on n (bounded by the last
  context, see ``CacheEvidence.volume_tokens``), which the planner scales by n's hit rate.
One observation per replica is kept (the newest); a failed replica's evidence is dropped
(the session returns to the pool with zero credit there).
"""

from __future__ import annotations

from services.common.vocabulary import EvidenceKind
from services.router.core.model import CacheEvidence, Usage


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


def drop_replica(evidence: tuple[CacheEvidence, ...], replica: str) -> tuple[CacheEvidence, ...]:
    return tuple(e for e in evidence if e.replica != replica)


def credit_tokens(e: CacheEvidence) -> int:
    """The token figure the planner's ``CreditEvidence`` carries for ``e``."""
    return e.volume_tokens if e.kind == "volume" else e.resident_tokens
