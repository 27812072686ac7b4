"""The policy registry: config string -> zero-argument factory
(docs/architecture.md#planner-core-api; each policy and its source: docs/algorithms.md).

Every factory returns a fresh policy instance (policies with history — round_robin's cursor,
ThunderAgent's tick clock and queue — keep it per instance). Other packages register more
policies by adding to ``POLICIES`` (the simulator adds ``oracle``); the conformance test
runs every registered name through the same invariants.

| name             | gates | sees                                        | decides                                          | source |
|------------------|-------|---------------------------------------------|--------------------------------------------------|--------|
| tao              | yes   | decayed credit (h = 10 s), readiness, footprint, free capacity, compute load, predicted tool returns, context tokens, requests running per replica | as tao-hold, and a ready session left out may take the reservation of admitted ACTING sessions whose Continuum TTL has run out and whose tool is predicted to outlast the shortest predicted turn of the ready sessions left out on that replica (the DP drops the fewest); the router admits the request of a session alone in the pool at arrival, on the replica with the most credit, then the fewest requests in flight; a prefix the sessions share (system prompt, tools) is reserved once per replica | this project (docs/algorithms.md#policies-tao-and-tao-paper) |
| tao-per-session  | yes   | as tao                                       | as tao, with every session's footprint counting its shared prefix in full (the shipped tao until 2026-12-05) | tao ablation |
| tao-hold         | yes   | decayed credit (h = 10 s), readiness, footprint, free capacity, compute load | pauses by ascending value past 5 % over capacity; admission+placement by the DP on (Σr, Σk, Σf); ties spread by compute load; a tool's KV held while it runs (the shipped tao until 2026-12-03; the base of the tao-* levers below, whose "as tao" means as tao-hold) | this project |
| tao-paper        | yes   | decayed credit (h = 10 s), readiness, footprint, free capacity | pauses by ascending value; admission+placement by the capacity-state DP (lexicographic Σk, Σr, Σf); ties spread by compute load | the TAO paper |
| tao-no-decay     | yes   | as tao-paper, credit k = k0                  | as tao-paper                                     | TAO paper ablation |
| tao-no-readiness | yes   | as tao-paper, r = 0                          | as tao-paper                                     | TAO paper ablation |
| tao-bfd          | yes   | as tao-paper                                 | best-fit-decreasing by value instead of the DP   | TAO paper ablation |
| tao-ta-pause     | yes   | as tao-paper                                 | ThunderAgent's pause order (smallest first)      | TAO paper ablation |
| tao-belady       | yes   | as tao, plus predicted tool return times     | as tao, pausing the furthest predicted return first | tao lever (Belady) |
| tao-small-pause  | yes   | as tao                                       | as tao, pausing (not ready first) the smallest footprint first, so the largest contexts keep running | tao lever (ThunderAgent's pause order) |
| tao-no-spread    | yes   | as tao                                       | as tao, no compute-load tie-break                | tao ablation |
| tao-senior       | yes   | as tao, plus when each session was first seen | as tao, ready sessions of the older half count twice | tao lever (after Continuum's program FCFS) |
| tao-fast         | yes   | as tao                                       | as tao, and the router admits the request of a session alone in the pool at once where a serving replica has room (no planner round trip; shipped in tao) | tao lever |
| tao-reclaim      | yes   | as tao                                       | as tao, and a ready session that does not fit may take the KV reservation of an admitted session whose tool is not predicted back | tao lever (the opposite of Continuum's TTL pinning) |
| tao-ttl          | yes   | as tao, plus predicted tool return times and context tokens | as tao-reclaim, but only from sessions whose Continuum TTL (d·ln(B/d), B = prefill reload) has run out | tao lever (Continuum's TTL inside TAO's objective, arXiv 2511.02230) |
| tao-ttl-q        | yes   | as tao-ttl, plus the pool waits of the sessions it reclaimed | as tao-ttl, with Continuum's queueing term T·η in the TTL's benefit | tao lever (arXiv 2511.02230 §4.2) |
| tao-ttl-long     | yes   | as tao-ttl                                   | as tao-ttl, only from tools predicted to run ≥ 10 s more | tao lever |
| tao-ttl-turn     | yes   | as tao                                       | the same policy as tao (the lever's name before it was shipped) | tao lever, shipped |
| tao-borrow       | yes   | as tao                                       | as tao, and only a left-out session whose own predicted turn on the replica ends before every tool reclaimable there returns may take the reclaimed tokens | tao lever (the turn bound for every borrower) |
| tao-idle         | yes   | as tao, plus which sessions run a request per replica | as tao, and the turn bound is waived on a replica where no admitted session runs a request | tao lever (a GPU idle through short tools) |
| tao-hold-cost    | yes   | as tao-reclaim, plus how long left-out sessions were held and context tokens | as tao-reclaim, and once a held session has waited the prefill time of an ACTING incumbent's context, that incumbent's reservation may be taken even if its tool is predicted back | tao lever (ski rental: hold vs recompute) |
| tao-overcommit   | yes   | as tao                                       | as tao, and the router admits a pool session whose request was held as long as its prompt's prefill takes, over capacity (≤ 1.4×), into the reservations of sessions idle at least as long as their own prefill | tao lever (ski rental: hold vs recompute) |
| tao-lend         | yes   | as tao, plus predicted tool return times, context tokens, requests running per replica | as tao, and a ready session left out may be admitted into the reservations of ACTING sessions whose tool is predicted to return after its turn (prefill of its uncached prompt + decode at the replica's step time) ends; it is paused first, so it gives them back when its request ends | tao lever (prediction-based lending) |
| sjf              | yes   | footprint (credit only to pick the replica)  | shortest footprint first, tao-paper's pauses     | TAO paper's DP comparison |
| thunderagent     | yes   | program tokens (prompt + completion so far, acting weighted), buffers, the whole KV cache | tick every 5 s: resume reasoning→new→acting, BFD onto the roomiest replica; pause smallest acting first, mark reasoning; a new program placed at its request's arrival (fewest tokens, room for it + buffer) while nothing is paused | ThunderAgent scheduler/router.py, backend/state.py, program/state.py |
| thunderagent-reserved | yes | as thunderagent, but TAO's footprints against 95 % of the cache | as thunderagent | ThunderAgent's scheduler on TAO's reservations (the baseline until 2026-12-06) |
| continuum        | yes   | program arrival, tool-return prediction, context tokens | program-level FCFS with head-of-line blocking; pin each tool call's KV for TTL τ* = argmax P(τ)·(T·η + prefill) − τ, unpin on expiry or (latest arrival first) when the queue head does not fit; a request that heads an empty queue admitted at its arrival when it fits (its last replica, else the roomiest) | arXiv 2511.02230 §4, Hanchenli/vllm-continuum |
| continuum-affine | yes   | as continuum                                 | as continuum with one engine per replica behind a session-sticky router: each program keeps its replica (a new one goes to the most room), FCFS, head-of-line blocking and unpinning per replica | arXiv 2511.02230 on each replica (multi-replica mapping ours) |
| round_robin      | no    | replica health                               | every held request to the next replica          | vLLM production-stack / Dynamo round-robin |
| least_loaded     | no    | running + waiting requests                   | every held request to the least loaded replica  | common load-balancing baseline |
| cache_aware      | no    | best cache evidence per replica, active KV blocks | lowest 1.0·prefill blocks + decode blocks      | NVIDIA Dynamo KV router docs |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from services.planner.core.continuum import ContinuumConfig, ContinuumPolicy
from services.planner.core.fits import engine_fits
from services.planner.core.policy import Policy
from services.planner.core.routers import CacheAwarePolicy, LeastLoadedPolicy, RoundRobinPolicy
from services.planner.core.tao import TAO, TAO_BORROW, TAO_HOLD, TAO_IDLE, TAO_PAPER, TaoPolicy
from services.planner.core.thunderagent import ThunderAgentConfig, ThunderAgentPolicy
from services.planner.core.values import ValueConfig


class UnknownPolicyError(ValueError):
    """A policy name that is not registered; the message lists the registered names."""


POLICIES: dict[str, Callable[[], Policy]] = {
    "tao": lambda: TaoPolicy("tao", TAO),
    "tao-per-session": lambda: TaoPolicy("tao-per-session", replace(TAO, share_prefixes=False)),
    "tao-hold": lambda: TaoPolicy("tao-hold", TAO_HOLD),
    "tao-paper": lambda: TaoPolicy("tao-paper", TAO_PAPER),
    "tao-no-decay": lambda: TaoPolicy("tao-no-decay", replace(TAO_PAPER, values=ValueConfig(half_life_s=None))),
    "tao-no-readiness": lambda: TaoPolicy("tao-no-readiness",
                                          replace(TAO_PAPER, values=ValueConfig(use_readiness=False))),
    "tao-bfd": lambda: TaoPolicy("tao-bfd", replace(TAO_PAPER, placement="bfd")),
    "tao-ta-pause": lambda: TaoPolicy("tao-ta-pause", replace(TAO_PAPER, pause_order="thunderagent")),
    "sjf": lambda: TaoPolicy("sjf", replace(TAO_PAPER, placement="sjf")),
    "tao-belady": lambda: TaoPolicy("tao-belady", replace(TAO_HOLD, pause_order="belady")),
    "tao-small-pause": lambda: TaoPolicy("tao-small-pause", replace(TAO_HOLD, pause_order="smallest")),
    "tao-no-spread": lambda: TaoPolicy("tao-no-spread", replace(TAO_HOLD, spread=False)),
    "tao-senior": lambda: TaoPolicy("tao-senior", replace(TAO_HOLD, objective="senior")),
    "tao-fast": lambda: TaoPolicy("tao-fast", replace(TAO_HOLD, fast_admit=True)),
    "tao-reclaim": lambda: TaoPolicy("tao-reclaim", replace(TAO_HOLD, reclaim=True)),
    "tao-ttl": lambda: TaoPolicy("tao-ttl", replace(TAO_HOLD, ttl=True)),
    "tao-ttl-long": lambda: TaoPolicy("tao-ttl-long", replace(TAO_HOLD, ttl=True, ttl_min_remaining_s=10.0)),
    "tao-ttl-turn": lambda: TaoPolicy("tao-ttl-turn", TAO),  # the lever that became ``tao`` (2026-12-03)
    "tao-borrow": lambda: TaoPolicy("tao-borrow", TAO_BORROW),
    "tao-idle": lambda: TaoPolicy("tao-idle", TAO_IDLE),
    "tao-hold-cost": lambda: TaoPolicy("tao-hold-cost", replace(TAO_HOLD, reclaim=True, hold_cost=True)),
    "tao-overcommit": lambda: TaoPolicy("tao-overcommit", replace(TAO_HOLD, overcommit=True)),
    "tao-ttl-q": lambda: TaoPolicy("tao-ttl-q", replace(TAO_HOLD, ttl=True, ttl_queue=True)),
    "tao-lend": lambda: TaoPolicy("tao-lend", replace(TAO_HOLD, lend=True)),
    "round_robin": RoundRobinPolicy,
    "least_loaded": LeastLoadedPolicy,
    "cache_aware": CacheAwarePolicy,
    "thunderagent": ThunderAgentPolicy,
    "thunderagent-reserved": lambda: ThunderAgentPolicy("thunderagent-reserved",
                                                        ThunderAgentConfig(published_accounting=False)),
    "continuum": ContinuumPolicy,
    "continuum-affine": lambda: ContinuumPolicy("continuum-affine", ContinuumConfig(per_replica_queues=True)),
}


def make_policy(name: str, engine_profile: str | None = None) -> Policy:
    """A fresh instance of the policy registered as ``name``; with ``engine_profile``, the TAO
    policies and Continuum estimate prefill and decode times by that profile's fits
    (``fits.ENGINE_FITS``; ValueError for a profile without fits), else by qwen3-32b-h100x2's."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy {name!r}; registered: {', '.join(sorted(POLICIES))}"
        ) from None
    policy = factory()
    if engine_profile is None:
        return policy
    fits = engine_fits(engine_profile)
    if isinstance(policy, TaoPolicy):
        cfg = policy.config
        return type(policy)(policy.name, replace(cfg, ttl_model=fits.prefill(cfg.ttl_model), decode_model=fits.decode))
    if isinstance(policy, ContinuumPolicy):
        return ContinuumPolicy(policy.name, fits.prefill(policy.config))
    return policy
