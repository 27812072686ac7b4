"""The Policy protocol and what every policy shares: the pool, tenant headroom, pauses, timing.

A policy turns a ``Snapshot`` into a ``Plan``. Two kinds
(docs/architecture.md#planner-core-api):
- admission-gating (``gates_admission``): admits pool sessions onto replicas within free
  capacity and pauses admitted ones when a replica is over capacity. Invariant: on every
  healthy replica the footprints it newly admits fit in capacity − used + footprints of the
  ACTING sessions it pauses there; nothing goes to an unhealthy replica; no session twice.
  (The one published exception: ThunderAgent force-resumes a request that waited 30 min.)
- per-request routers (not gating): route every held request (pool sessions in WAITING) to
  a healthy replica at once, whatever the capacity — vLLM queues what does not fit. They
  never pause. Invariant: each WAITING pool session routed exactly once, to a healthy
  replica; nothing else routed.

Candidates are pool sessions (``admitted`` False) in WAITING, ACTING or PAUSED; RUNNING and
ENDED ones are never placed. Every policy places a session only on a replica that serves its
model (``serving_mask``; a per-request router leaves a request no healthy replica serves
unrouted). Every list a policy walks is sorted by id first, so plans do
not depend on the order of the snapshot's lists.

Tenant headroom (``Snapshot.tenant_headroom``, from the budget service) caps how many
sessions of a tenant one plan may newly admit; tenants not in the mapping are unlimited.
The TAO family and sjf apply it before solving, keeping each tenant's best sessions by
value; the DP is exact for the pool that remains. ThunderAgent and the per-request routers
do not know tenants (as published); the router's tenant slots still gate forwarding.

Timing: the core reads no clock. ``Plan.solve_ms`` is measured by an injected ``Stopwatch``
(seconds, monotonic) when a policy is built with one, else left 0.0 for the caller to fill
(``services.planner.timing.timed_plan`` does). It never influences a decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from services.planner.core.model import Assignment, Objective, Plan, ReplicaState, SessionState, Snapshot
from services.planner.core.values import FULL_VALUES, ValueConfig, credit_matrix, fold_values, objective_of

Stopwatch = Callable[[], float]


def elapsed_ms(stopwatch: Stopwatch | None, start: float) -> float:
    """Milliseconds since ``start`` on ``stopwatch`` (0.0 without one)."""
    return 0.0 if stopwatch is None else (stopwatch() - start) * 1000.0


def start_time(stopwatch: Stopwatch | None) -> float:
    return 0.0 if stopwatch is None else stopwatch()

CANDIDATE_PHASES = frozenset({"WAITING", "ACTING", "PAUSED"})
HOLDS_REQUEST = frozenset({"RUNNING", "WAITING"})  # admitted sessions whose request must not be cut


@runtime_checkable
class Policy(Protocol):
    """The planner core API (docs/architecture.md#planner-core-api): ``plan`` is a function of the snapshot and the policy's own history.

    Optional attributes, read by ``services.router.core.state.policy_flags``: ``fast_admit``, the
    name of the rule by which the router core admits a pool session itself at its request's
    arrival when nothing contends (``CoreConfig.fast_admit``; default "": never); and (default
    False) ``lend`` (``CoreConfig.lend``); ``reclaims_between_requests``,
    a pause made only to room the plan's own assignments is void once its session runs again
    (``CoreConfig.drop_resumed_reclaims``)."""

    name: str
    gates_admission: bool
    sticky: bool

    def plan(self, snapshot: Snapshot) -> Plan: ...


def sorted_replicas(snapshot: Snapshot) -> tuple[ReplicaState, ...]:
    return tuple(sorted(snapshot.replicas, key=lambda r: r.id))


def serving_mask(sessions: Sequence[SessionState], replicas: Sequence[ReplicaState]) -> npt.NDArray[np.bool_]:
    """(m, n): replica n serves session m's model (``ReplicaState.serves``). Every policy
    places a session only where this holds, on top of its own health and capacity rules."""
    out = np.ones((len(sessions), len(replicas)), dtype=np.bool_)
    if not any(s.model for s in sessions):
        return out
    for j, r in enumerate(replicas):
        out[:, j] = [r.serves(s) for s in sessions]
    return out


def pool_candidates(snapshot: Snapshot) -> tuple[SessionState, ...]:
    """Pool sessions a policy may place, sorted by id."""
    return tuple(
        sorted(
            (s for s in snapshot.sessions if not s.admitted and s.phase in CANDIDATE_PHASES),
            key=lambda s: s.id,
        )
    )


def apply_headroom(
    sessions: Sequence[SessionState],
    headroom: dict[str, int] | None,
    priority: Callable[[int], tuple[object, ...]],
) -> list[int]:
    """Indices of ``sessions`` kept under tenant headroom; ``priority(i)`` sorts best first."""
    if not headroom:
        return list(range(len(sessions)))
    order = sorted(range(len(sessions)), key=priority)
    left = dict(headroom)
    keep: list[int] = []
    for i in order:
        tenant = sessions[i].tenant
        if tenant in left:
            if left[tenant] <= 0:
                continue
            left[tenant] -= 1
        keep.append(i)
    return sorted(keep)


@dataclass(frozen=True, slots=True)
class PauseResult:
    pauses: tuple[str, ...]
    freed_tokens: dict[str, int]  # replica id -> footprints of ACTING sessions paused now


def plan_pauses(snapshot: Snapshot, order: str, values: ValueConfig = FULL_VALUES,
                tolerance: float = 0.0, first: frozenset[str] = frozenset()) -> PauseResult:
    """Pause admitted sessions on over-capacity healthy replicas
    (docs/algorithms.md#pause-policy).

    ACTING sessions are paused first, until used − freed ≤ capacity; if that is not enough,
    RUNNING (and admitted WAITING) ones are marked to pause when their request ends, counted
    as future release so no more are marked than needed. ``order``:
    - ``"tao"``: ascending value — not ready first, then lowest credit on the replica, then
      smallest footprint, then id;
    - ``"thunderagent"``: smallest footprint first, then id (ThunderAgent's
      ``_pause_until_safe``: ACTING smallest tokens first, then REASONING marked);
    - ``"belady"``: not ready first, then the furthest predicted tool return first (Belady's
      rule: evict what is needed last; no fresh prediction counts as furthest), then as ``"tao"``;
    - ``"smallest"``: not ready first, then the smallest footprint, then id (ThunderAgent's order
      with readiness kept first; the ``tao-small-pause`` lever): the largest contexts keep
      running, at the price of more sessions paused to cover the same excess.
    ``first``: sessions paused before every other on their replica, whatever their phase (the
    borrowers of ``tao-lend``'s loans: they give the lent tokens back, the lenders keep theirs).
    """
    replicas = sorted_replicas(snapshot)
    by_id = {r.id: r for r in replicas}
    admitted = sorted((s for s in snapshot.sessions if s.admitted and s.replica in by_id), key=lambda s: s.id)
    # ``tolerance``: a replica counts as over capacity only past capacity × (1 + tolerance);
    # it is then brought back to capacity itself.
    over = {r.id: r.used_tokens - r.capacity_tokens for r in replicas
            if r.healthy and r.used_tokens > r.capacity_tokens * (1.0 + tolerance)}
    if not over:
        return PauseResult((), {})
    on_over = [s for s in admitted if s.replica in over]
    credit = credit_matrix(snapshot.now_s, on_over, replicas, values.half_life_s)
    col = {r.id: j for j, r in enumerate(replicas)}

    def key(i: int) -> tuple[object, ...]:
        s = on_over[i]
        if order == "thunderagent":
            return (s.footprint_tokens, s.id)
        ready = 1 if (s.ready and values.use_readiness) else 0
        if order == "smallest":
            return (ready, s.footprint_tokens, s.id)
        if order == "belady":
            # Furthest predicted return first; no fresh prediction counts as furthest.
            returns = s.tool_return_s if s.tool_return_s is not None else math.inf
            return (ready, -returns, int(credit[i, col[s.replica or ""]]), s.footprint_tokens, s.id)
        return (ready, int(credit[i, col[s.replica or ""]]), s.footprint_tokens, s.id)

    pauses: list[str] = []
    freed: dict[str, int] = {}
    for rid in sorted(over):
        excess = over[rid]
        mine = [i for i, s in enumerate(on_over) if s.replica == rid]
        groups = [sorted((i for i in mine if on_over[i].id in first), key=key)] + [
            sorted((i for i in mine if on_over[i].phase in phase_set and on_over[i].id not in first), key=key)
            for phase_set in (frozenset({"ACTING"}), HOLDS_REQUEST)]
        for group in groups:
            for i in group:
                if excess <= 0:
                    break
                s = on_over[i]
                pauses.append(s.id)
                excess -= s.footprint_tokens
                if s.phase == "ACTING":
                    freed[rid] = freed.get(rid, 0) + s.footprint_tokens
    return PauseResult(tuple(pauses), freed)


def room_after_pauses(replicas: Sequence[ReplicaState], freed: dict[str, int]) -> np.ndarray:
    """Capacity left per replica once ``freed`` is paused, negative while a replica stays over
    capacity (within a pause tolerance); 0 for unhealthy ones; int64."""
    return np.array(
        [r.capacity_tokens - r.used_tokens + freed.get(r.id, 0) if r.healthy else 0 for r in replicas],
        dtype=np.int64,
    )


def full_objective(snapshot: Snapshot, assignments: Iterable[Assignment]) -> Objective:
    """(Σk, Σr, Σf) of ``assignments`` with the full TAO values (the common yardstick)."""
    pairs = list(assignments)
    if not pairs:
        return (0, 0, 0)
    sessions_by_id = {s.id: s for s in snapshot.sessions}
    replicas = sorted_replicas(snapshot)
    col = {r.id: j for j, r in enumerate(replicas)}
    sessions = [sessions_by_id[a.session] for a in pairs]
    vals = fold_values(snapshot.now_s, sessions, replicas, FULL_VALUES)
    choice = np.array([col[a.replica] for a in pairs], dtype=np.int64)
    return objective_of(vals, choice)


class PlanCounter:
    """Per-instance revision numbers (1, 2, …); services replace them with published revisions."""

    def __init__(self) -> None:
        self._next = 1

    def next(self) -> int:
        rev = self._next
        self._next += 1
        return rev
