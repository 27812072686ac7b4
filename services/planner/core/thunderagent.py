"""ThunderAgent's program-aware scheduler (TR mode), as published, on TAO's snapshot model.

Source: ThunderAgent (github.com/ThunderAgent-org/ThunderAgent), ``scheduler/router.py``
(``_scheduled_check``, ``_greedy_resume``, ``_pause_until_safe``,
``_select_backend_for_new_program``), ``backend/state.py`` (``remaining_capacity``,
``remaining_capacity_with_decay``) and ``wiki/Scheduler.md``. Mapping to our snapshot:
program = session; REASONING = RUNNING or WAITING; program tokens = ``footprint_tokens``,
which the router core counts as ThunderAgent does (``CoreConfig.accounting`` "program",
``services.router.core.footprint.program_tokens``: vLLM's prompt + completion tokens of the last
request, ``Program.total_tokens`` in ``program/state.py``, with no reservation for the next
append or output) against the whole KV cache (``kv_utilisation`` 1.0: its
``total_tokens_capacity`` is vLLM's ``num_gpu_blocks × block_size``, ``backend/vllm_metrics.py``);
a *new* program (step 1) = a session with no cache evidence anywhere; the global paused
pool = the planner pool. ``thunderagent-reserved`` (``published_accounting=False``) is the same
scheduler on TAO's reservations (f(s) against 95 % of the cache), the baseline before 2026-12-06
(docs/benchmarks.md#thunderagents-own-token-count-fixed-2026-12-06).

What it sees: per replica the tokens of its admitted programs (acting ones weighted by
``acting_token_weight``), a per-program buffer (``BUFFER_PER_PROGRAM`` = 100 tokens), and
program sizes. It never sees credit, readiness or tool predictions. Every program's tokens count
in full, a shared system prompt included: ``BackendState.shared_tokens`` stays 0 upstream (the
scheduler never calls ``update_shared_tokens``; commit 699f111 has the call commented out "for
conservative capacity"), so the router core runs it without ``CoreConfig.share_prefixes_below_tokens``.

What it decides:
- On arrival: a new program is placed at once — on the replica with the fewest active program
  tokens that has room for tokens + buffer — only when the paused pool is empty; otherwise it
  queues (fairness). The router core does this at the request's arrival
  (``CoreConfig.fast_admit`` "new-program", from ``fast_admit`` below); every plan call does it
  too, for a new program the router could not place.
- Every ``interval_s`` (``--scheduler-interval``, default 5 s), a tick:
  1. resume (``_greedy_resume``): capacity = Σ remaining over healthy replicas with more
     than a buffer left (with ``use_acting_token_decay`` acting tokens count ×2^(−t), t =
     seconds acting — optimistic, resume only); candidates in priority order REASONING
     (pending request) → new → ACTING, each group fewest tokens first, taken while the
     cumulative tokens + buffers fit the capacity; then best-fit-decreasing: largest first
     onto the replica with the most remaining capacity, re-sorted after each placement;
  2. pause (``_pause_until_safe``, undecayed capacity): while a replica is over capacity,
     pause its ACTING programs smallest first, then mark REASONING ones smallest first
     (never preempted: they pause when their request ends; their tokens count as future
     release). A program resumed in the same tick and chosen for pausing is simply not
     resumed.
- A request that waited longer than ``force_resume_after_s`` (30 min, ``_wait_for_resume``) is
  force-resumed to its previous replica (or the one with the fewest programs) regardless of
  capacity. The router does this, not the plan (``force_admit_after_s``, read by the router
  core as ``RouterCore.force_admit_after_s``): a plan's admission is checked against the
  router's capacity and would be refused, as it was until 2026-12-03, which left this bound
  without effect.

Models (not in the published scheduler, whose backends all serve one model): a program goes
only to a replica serving its model (``ReplicaState.serves``); the resume capacity is summed
per model over the replicas serving it, and best fit picks the roomiest serving replica.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.planner.core.model import Assignment, Plan, ReplicaState, SessionState, Snapshot
from services.planner.core.policy import (
    HOLDS_REQUEST,
    PlanCounter,
    Stopwatch,
    elapsed_ms,
    full_objective,
    pool_candidates,
    sorted_replicas,
    start_time,
)

BUFFER_PER_PROGRAM = 100  # ThunderAgent backend/state.py


@dataclass(frozen=True, slots=True)
class ThunderAgentConfig:
    interval_s: float = 5.0
    acting_token_weight: float = 1.0
    use_acting_token_decay: bool = False
    buffer_tokens: int = BUFFER_PER_PROGRAM
    force_resume_after_s: float | None = 1800.0
    #: count programs and capacity as ThunderAgent does (module docstring); False: TAO's
    #: reservations against the deployment's admissible fraction (``thunderagent-reserved``)
    published_accounting: bool = True


class ThunderAgentPolicy:
    gates_admission = True
    sticky = True
    #: the router core reads this (CoreConfig.fast_admit): ThunderAgent places a new program at
    #: its request's arrival (``update_program_before_request`` calls
    #: ``_select_backend_for_new_program``) when its waiting queue is empty, not at a tick
    fast_admit = "new-program"

    def __init__(self, name: str = "thunderagent", config: ThunderAgentConfig | None = None,
                 stopwatch: Stopwatch | None = None) -> None:
        self.name = name
        self.config = config or ThunderAgentConfig()
        self._stopwatch = stopwatch
        self._revisions = PlanCounter()
        self._last_tick_s: float | None = None
        self._queued: frozenset[str] = frozenset()

    @property
    def accounting(self) -> str:
        """The router core's ``CoreConfig.accounting``: ThunderAgent's program tokens."""
        return "program" if self.config.published_accounting else "reservation"

    @property
    def kv_utilisation(self) -> float | None:
        """The router core's admissible fraction (``admissible_fraction``): all of vLLM's KV."""
        return 1.0 if self.config.published_accounting else None

    @property
    def force_admit_after_s(self) -> float | None:
        """The router core's ``force_admit_after_s``: ThunderAgent's force-resume bound."""
        return self.config.force_resume_after_s

    def plan(self, snapshot: Snapshot) -> Plan:
        start = start_time(self._stopwatch)
        cfg = self.config
        healthy = [r for r in sorted_replicas(snapshot) if r.healthy]
        ledger = _Ledger(snapshot, healthy, cfg)
        pool = pool_candidates(snapshot)
        assigned: dict[str, str] = {}
        fresh = [s for s in pool if not s.credits and s.phase == "WAITING" and s.id not in self._queued]
        fresh_ids = {s.id for s in fresh}
        queue_busy = any(s.id not in fresh_ids for s in pool)
        for s in sorted(fresh, key=lambda s: (s.waiting_since_s or snapshot.now_s, s.id)):
            target = None if queue_busy else ledger.least_active_with_room(s)
            if target is None:
                queue_busy = True
                continue
            assigned[s.id] = target
            ledger.add(target, s, resumed=True)
        pauses: list[str] = []
        if self._last_tick_s is None or snapshot.now_s - self._last_tick_s >= cfg.interval_s:
            self._last_tick_s = snapshot.now_s
            waiting = [s for s in pool if s.id not in assigned]
            for sid, rid in self._resume(ledger, waiting):
                assigned[sid] = rid
            for sid in ledger.pause_until_safe():
                if sid in assigned:
                    del assigned[sid]
                else:
                    pauses.append(sid)
        self._queued = frozenset(s.id for s in pool if s.id not in assigned)
        assignments = tuple(Assignment(sid, rid) for sid, rid in sorted(assigned.items()))
        return Plan(
            revision=self._revisions.next(),
            assignments=assignments,
            pauses=tuple(pauses),
            objective=full_objective(snapshot, assignments),
            solver="thunderagent-bfd",
            solve_ms=elapsed_ms(self._stopwatch, start),
            policy=self.name,
        )

    def _resume(self, ledger: _Ledger, waiting: list[SessionState]) -> list[tuple[str, str]]:
        buf = self.config.buffer_tokens
        caps = {rid: rem for rid, rem in ledger.remaining(decayed=self.config.use_acting_token_decay).items()
                if rem > buf}
        if not caps or sum(caps.values()) <= 0 or not waiting:
            return []
        reps = ledger.replicas
        totals: dict[str, int] = {}  # per model: capacity of the replicas serving it
        cumulative: dict[str, int] = {}

        def group(s: SessionState) -> int:
            if not s.credits:
                return 1  # new program (step 1)
            return 0 if s.phase == "WAITING" else 2  # reasoning (pending request) / acting

        picked: list[SessionState] = []
        for s in sorted(waiting, key=lambda s: (group(s), s.footprint_tokens, s.id)):
            need = s.footprint_tokens + buf
            if s.model not in totals:
                totals[s.model] = sum(room for rid, room in caps.items() if reps[rid].serves(s))
            if cumulative.get(s.model, 0) + need <= totals[s.model]:
                picked.append(s)
                cumulative[s.model] = cumulative.get(s.model, 0) + need
        if not picked:
            return []
        picked.sort(key=lambda s: (-s.footprint_tokens, s.id))
        smallest_need = picked[-1].footprint_tokens + buf
        bins = sorted(caps.items(), key=lambda kv: (-kv[1], kv[0]))
        out: list[tuple[str, str]] = []
        for s in picked:
            if not bins or smallest_need > bins[0][1]:
                break
            need = s.footprint_tokens + buf
            at = next((k for k, (rid, _) in enumerate(bins) if reps[rid].serves(s)), None)
            if at is None or need > bins[at][1]:
                continue
            rid, room = bins[at]
            out.append((s.id, rid))
            ledger.add(rid, s, resumed=True)
            room -= need
            if room > buf:
                bins[at] = (rid, room)
                bins.sort(key=lambda kv: (-kv[1], kv[0]))
            else:
                bins.pop(at)
        return out


def select_backend_for_new_program(tokens: int, backends: Iterable[tuple[str, float, float, int]],
                                   buffer: int = BUFFER_PER_PROGRAM) -> str | None:
    """ThunderAgent's ``_select_backend_for_new_program``: among ``backends`` (id, capacity,
    active program tokens, programs) the one with the fewest active tokens whose remaining
    capacity (capacity − active − ``buffer`` per program) holds ``tokens`` plus one buffer; None
    when none does. The plan's ledger and the router core's arrival rule
    (``CoreConfig.fast_admit`` "new-program") both place by it."""
    fits = [(active, rid) for rid, capacity, active, programs in backends
            if capacity - active - buffer * programs >= tokens + buffer]
    return min(fits)[1] if fits else None


class _Ledger:
    """ThunderAgent's per-replica token accounting for one plan call."""

    def __init__(self, snapshot: Snapshot, healthy: list[ReplicaState], cfg: ThunderAgentConfig) -> None:
        self.cfg = cfg
        self.now_s = snapshot.now_s
        self.replicas = {r.id: r for r in healthy}
        self.capacity = {r.id: r.capacity_tokens for r in healthy}
        # Load that is not an admitted session (the router's "unknown load") stays as is.
        self.base = {r.id: r.used_tokens for r in healthy}
        self.programs: dict[str, list[tuple[SessionState, bool]]] = {r.id: [] for r in healthy}
        for s in sorted(snapshot.sessions, key=lambda s: s.id):
            if s.admitted and s.replica in self.programs:
                self.base[s.replica] -= s.footprint_tokens
                self.programs[s.replica].append((s, False))

    def add(self, rid: str, s: SessionState, resumed: bool) -> None:
        self.programs[rid].append((s, resumed))

    def _acting(self, s: SessionState) -> bool:
        return s.phase not in HOLDS_REQUEST

    def used(self, rid: str, decayed: bool = False) -> float:
        w = self.cfg.acting_token_weight
        total = float(self.base[rid]) + self.cfg.buffer_tokens * len(self.programs[rid])
        for s, _ in self.programs[rid]:
            if not self._acting(s):
                total += s.footprint_tokens
            elif decayed and s.acting_since_s is not None:
                total += s.footprint_tokens * 2.0 ** (-max(0.0, self.now_s - s.acting_since_s))
            else:
                total += w * s.footprint_tokens
        return total

    def remaining(self, decayed: bool = False) -> dict[str, int]:
        return {rid: int(self.capacity[rid] - self.used(rid, decayed)) for rid in self.capacity}

    def least_active_with_room(self, s: SessionState) -> str | None:
        buf = self.cfg.buffer_tokens
        return select_backend_for_new_program(
            s.footprint_tokens,
            ((rid, self.capacity[rid], self.used(rid) - buf * len(self.programs[rid]), len(self.programs[rid]))
             for rid in self.capacity if self.replicas[rid].serves(s)),
            buf)

    def pause_until_safe(self) -> list[str]:
        out: list[str] = []
        for rid in sorted(self.capacity):
            excess = self.used(rid) - self.capacity[rid]
            if excess <= 0:
                continue
            progs = self.programs[rid]
            for want_acting in (True, False):
                for s, _ in sorted(progs, key=lambda p: (p[0].footprint_tokens, p[0].id)):
                    if excess <= 0:
                        break
                    if self._acting(s) != want_acting:
                        continue
                    out.append(s.id)
                    excess -= s.footprint_tokens + self.cfg.buffer_tokens
        return out
