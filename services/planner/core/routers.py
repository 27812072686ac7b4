"""Per-request routers (not admission-gating, not sticky): round_robin, least_loaded, cache_aware.

Each routes every held request (pool session in WAITING) at once, in arrival order
(``waiting_since_s``, then id), to one healthy replica serving the session's model
(``ReplicaState.serves``; a request no healthy replica serves stays unrouted), whatever its
capacity — vLLM queues what does not fit. They never pause. ``Plan.objective`` is still
measured with TAO's values.

- ``round_robin`` (vLLM production-stack / Dynamo ``--router-mode round-robin``): the healthy
  replicas serving the model, in id order, one cursor that persists across plans. Sees only
  replica health and models.
- ``least_loaded``: the healthy replica with the fewest requests (running + waiting from
  ``/metrics`` + requests this plan already sent there); ties by fewer used tokens, then id.
  Sees request counts.
- ``cache_aware`` — NVIDIA Dynamo's KV router cost (github.com/ai-dynamo/dynamo:
  ``lib/llm/src/kv_router/scheduler.rs`` ``DefaultWorkerSelector::select_worker``, now
  ``lib/kv-router/src/scheduling/selector.rs``; docs "KV Router" / "KV cache routing"):
  ``logit = overlap_score_weight × potential_prefill_blocks + potential_decode_blocks``, lowest
  wins; ``--kv-overlap-score-weight`` default 1.0, ``--router-temperature`` default 0 (no
  softmax sampling: the minimum). Per replica:
    prefill_blocks = (input tokens − overlap blocks × block size) / block size,
    decode_blocks  = active blocks on the replica + blocks of this request.
  *Overlap* is Dynamo's radix-tree match (``lib/llm/src/kv_router/indexer.rs``
  ``RadixTree::find_matches``): the leading blocks of the request's chained block hashes that
  the replica's KV events (vLLM ``BlockStored`` / ``BlockRemoved``) say it holds now — its
  real prefix residency, shared prefixes of other sessions included, evicted blocks excluded,
  no time decay. Here it is the session's strongest evidence k0 on the replica
  (``raw_credit_matrix``: ``kv_events`` first), in whole blocks, capped at the input: a
  snapshot built with KV events (the simulator's per-request router,
  ``services.sim.cluster.kv_events``) carries exactly that overlap; without them (the live router,
  which sees no KV events) the fallback is the router's usage evidence (``cached_tokens``,
  then ``volume``), which cannot see shared prefixes and stays at the last context after
  eviction. *Active blocks* are Dynamo's ``ActiveSequences`` count
  (``lib/llm/src/kv_router/sequence.rs``): blocks of the requests routed to the replica and
  not yet finished — not cached or reserved blocks. Here ceil(used_tokens / block): for
  per-request (non-sticky) routing ``used_tokens`` sums the footprints of the sessions with a
  request held-and-routed or in flight on the replica (each leaves at its request's end),
  plus what this plan already routed there (Dynamo's ``add_request`` after each selection).
  Input tokens are the session's ``context_tokens`` (the next prompt less its unknown
  append; the footprint before any request completed). Block size: each replica's own
  (``ReplicaState.block_size``, from its ``vllm:cache_config_info``; Dynamo takes one
  ``--kv-cache-block-size`` for the fleet), unless the policy is built with ``block_tokens``.
  Deviations, for want of snapshot fields: Dynamo dedups active blocks shared between
  requests on a worker (``--router-assume-kv-reuse``) and, with
  ``--router-track-prefill-tokens``, adds the worker's outstanding prefill tokens to the
  prefill term; equal logits go to the worker with the smaller radix tree, then arbitrarily
  (HashMap order) — here to fewer active blocks, then the lowest id.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from services.planner.core.model import Assignment, Plan, ReplicaState, SessionState, Snapshot
from services.planner.core.policy import (
    PlanCounter,
    Stopwatch,
    elapsed_ms,
    full_objective,
    sorted_replicas,
    start_time,
)
from services.planner.core.values import raw_credit_matrix


def held_requests(snapshot: Snapshot) -> list[SessionState]:
    """Pool sessions with a request held at the router, in arrival order."""
    held = [s for s in snapshot.sessions if not s.admitted and s.phase == "WAITING"]
    return sorted(held, key=lambda s: (s.waiting_since_s if s.waiting_since_s is not None else snapshot.now_s, s.id))


class _Router(ABC):
    gates_admission = False
    sticky = False
    name = ""

    def __init__(self, stopwatch: Stopwatch | None = None) -> None:
        self._stopwatch = stopwatch
        self._revisions = PlanCounter()

    def plan(self, snapshot: Snapshot) -> Plan:
        start = start_time(self._stopwatch)
        healthy = [r for r in sorted_replicas(snapshot) if r.healthy]
        held = held_requests(snapshot)
        assignments = tuple(self._route(snapshot, healthy, held)) if healthy else ()
        return Plan(
            revision=self._revisions.next(),
            assignments=assignments,
            pauses=(),
            objective=full_objective(snapshot, assignments),
            solver=self.name,
            solve_ms=elapsed_ms(self._stopwatch, start),
            policy=self.name,
        )

    @abstractmethod
    def _route(self, snapshot: Snapshot, healthy: list[ReplicaState], held: list[SessionState]) -> list[Assignment]:
        """Route ``held`` (arrival order) onto ``healthy`` (non-empty, id order)."""


class RoundRobinPolicy(_Router):
    name = "round_robin"

    def __init__(self, stopwatch: Stopwatch | None = None) -> None:
        super().__init__(stopwatch)
        self._cursor = 0

    def _route(self, snapshot: Snapshot, healthy: list[ReplicaState], held: list[SessionState]) -> list[Assignment]:
        out = []
        for s in held:
            serving = [r for r in healthy if r.serves(s)]
            if not serving:
                continue
            out.append(Assignment(s.id, serving[self._cursor % len(serving)].id))
            self._cursor += 1
        return out


class LeastLoadedPolicy(_Router):
    name = "least_loaded"

    def _route(self, snapshot: Snapshot, healthy: list[ReplicaState], held: list[SessionState]) -> list[Assignment]:
        load = {r.id: r.running + r.waiting for r in healthy}
        out = []
        for s in held:
            target = min((r for r in healthy if r.serves(s)), key=lambda r: (load[r.id], r.used_tokens, r.id),
                         default=None)
            if target is None:
                continue
            load[target.id] += 1
            out.append(Assignment(s.id, target.id))
        return out


class CacheAwarePolicy(_Router):
    name = "cache_aware"

    def __init__(self, overlap_score_weight: float = 1.0, block_tokens: int | None = None,
                 stopwatch: Stopwatch | None = None) -> None:
        """``block_tokens`` None: each replica's own block size (``ReplicaState.block_size``)."""
        super().__init__(stopwatch)
        self.overlap_score_weight = overlap_score_weight
        self.block_tokens = block_tokens

    def _route(self, snapshot: Snapshot, healthy: list[ReplicaState], held: list[SessionState]) -> list[Assignment]:
        block = {r.id: self.block_tokens or r.block_size for r in healthy}
        k0, _ = raw_credit_matrix(held, healthy)
        active = {r.id: math.ceil(r.used_tokens / block[r.id]) for r in healthy}
        out = []
        for i, s in enumerate(held):
            input_tokens = s.context_tokens if s.context_tokens > 0 else s.footprint_tokens
            best: tuple[float, int, str, int] | None = None
            for j, r in enumerate(healthy):
                if not r.serves(s):
                    continue
                bt = block[r.id]
                request_blocks = math.ceil(input_tokens / bt)
                overlap_blocks = min(int(k0[i, j]), input_tokens) // bt
                prefill_blocks = (input_tokens - overlap_blocks * bt) / bt
                decode_blocks = active[r.id] + request_blocks
                key = (self.overlap_score_weight * prefill_blocks + decode_blocks, active[r.id], r.id,
                       request_blocks)
                if best is None or key < best:
                    best = key
            if best is None:
                continue
            active[best[2]] += best[3]
            out.append(Assignment(s.id, best[2]))
        return out
