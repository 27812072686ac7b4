"""TAO's policies, their ablations, and the shortest-job-first baseline (all admission-gating).

Two configurations of one ``TaoPolicy`` (docs/algorithms.md#policies-tao-and-tao-paper):
``TAO_PAPER`` is the TAO paper's policy (objective (Σk, Σr, Σf), pause at once); ``TAO``, the
shipped ``tao``, ranks readiness first (Σr, Σk, Σf), pauses with 5 % hysteresis and spreads
placement ties by compute load. Both run the machinery below unchanged.

TAO (docs/algorithms.md): fold credit/readiness/footprint into the value matrix, pause on
over-capacity replicas in ascending value order, then solve selection + placement of the
pool with the capacity-state DP: at token resolution over reachable states when the pool
is small (sparse.py, exact for the real problem), else quantised (dp.py, exact for the
discretised problem), falling back to knapsack+bfd (approx.py, with an upper bound) when
the state space exceeds the budget. After a DP whose unit was coarser than a
token, the pool sessions left out are offered, in BFD order, to the exact leftover tokens
("rounding top-up", solver ``exact-dp+topup``); each one placed there is a placement that
was feasible before discretisation and excluded by it, and their number is reported as
``Plan.excluded_by_rounding``.

Ablations of ``tao-paper`` (the TAO paper's component analysis), each changes one thing:
- ``tao-no-decay``: k = k0, no 2^(−τ/h) decay;
- ``tao-no-readiness``: r = 0 for every session (credit, then footprint);
- ``tao-bfd``: best-fit-decreasing instead of the DP — sessions by their best value triple
  (k, r, f) descending, which is size-decreasing when credit and readiness tie; each goes to
  the feasible replica where its value is highest, ties to the tightest fit, then lowest id;
- ``tao-ta-pause``: ThunderAgent's pause order (smallest footprint first).

Guard: the DP is exact for the discretised problem, so rounding can leave its plan below a
method that works in exact tokens. Unless ``TaoConfig.guard`` is off, when the DP did not
run at token resolution, the plans of the knapsack decomposition (approx.py, its upper
bound skipped), BFD and SJF are built too and the lexicographically best is kept (solver
``guard-knapsack`` / ``guard-bfd`` / ``guard-sjf`` when one of them won; ties keep the DP's
plan). The benchmark reports how often that happens: at the default state budget the
per-replica knapsacks (1,024 units per replica) usually beat the quantised DP (about 10-20
units per replica with four replicas). The knapsack+bfd fallback for large instances is not
guarded; it reports its upper bound instead.

``sjf`` (the TAO paper's shortest-job-first comparison): sessions by footprint ascending, each
placed like BFD; pauses like ``tao-paper``.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from services.planner.core.approx import solve_greedy
from services.planner.core.continuum import ContinuumConfig, prefill_reload_s, ttl_exponential
from services.planner.core.dp import DpBudget, Instance, solve_exact
from services.planner.core.model import Assignment, Objective, Plan, ReplicaState, SessionState, Snapshot
from services.planner.core.policy import (
    PlanCounter,
    Stopwatch,
    apply_headroom,
    elapsed_ms,
    free_after_pauses,
    full_objective,
    plan_pauses,
    pool_candidates,
    serving_mask,
    sorted_replicas,
    start_time,
)
from services.planner.core.sparse import solve_sparse
from services.planner.core.spread import replica_load, spread
from services.planner.core.values import (
    FULL_VALUES,
    IntArray,
    ValueConfig,
    Values,
    fold_values,
    objective_of,
    ready_first,
    with_tier,
)


@dataclass(frozen=True, slots=True)
class TaoConfig:
    """``placement``: "dp" | "bfd" | "sjf"; ``pause_order``: "tao" | "thunderagent" | "belady";
    ``guard``: after a DP that did not run at token resolution, also build the BFD and SJF
    plans and keep the lexicographically best in exact tokens; ``sparse``: try the
    token-resolution DP over reachable states (sparse.py) first; ``objective``: "paper"
    (Σk, Σr, Σf), "ready-first" (Σr, Σk, Σf, values.ready_first) or "senior" (ready sessions,
    the older half counted twice, then Σk, Σf); ``spread``: break placement
    ties by compute load (spread.py); ``pause_tolerance``: pause only once a replica's admitted
    footprints exceed capacity × (1 + tolerance), then back down to capacity (hysteresis);
    ``reclaim``: a ready pool session that does not fit may take the reservation of admitted
    ACTING sessions that are not ready (``TaoPolicy._reclaim``; the ``tao-reclaim`` lever);
    ``fast_admit``: the router admits a pool session's request at once when nothing contends
    (``services.router.core.model.CoreConfig.fast_admit``), without the planner round trip;
    ``ttl``: reclaim as ``reclaim``, but only from ACTING sessions whose Continuum-style KV
    time-to-live has run out (``ttl_expired``; the ``tao-ttl`` lever), with ``ttl_model``'s
    prefill-reload fit and cold-start TTL; ``ttl_queue``: add Continuum's queueing term T·η to
    the TTL's benefit, T the mean pool wait of the sessions this policy reclaimed, measured when
    it admits them again (the ``tao-ttl-q`` lever); ``ttl_min_remaining_s``: with ``ttl``, take
    back only a tool predicted to run at least this much longer (one past its predicted return
    counts as returning now; no fresh prediction: allowed once its TTL ran out; the
    ``tao-ttl-long`` lever); ``hold_cost``: reclaim as ``reclaim``, and once a ready pool session
    left out has waited at least the time to recompute an admitted ACTING session's context
    (``hold_outweighs_recompute``, the prefill-reload fit of ``ttl_model``), that incumbent's
    reservation may be taken even when its tool is predicted back or its TTL runs: holding the
    waiting session has already cost more than the engine recomputing the incumbent's KV
    (ski rental: keep holding until the hold has cost what the alternative costs; the
    ``tao-hold-cost`` lever, docs/benchmarks.md#terminal-bench-and-kv_aware); ``overcommit``: the
    router lets a pool session's held request through over capacity once it has waited the
    prefill-reload time of its own prompt (``TaoPolicy.hold_limit``, read by the router core as
    its ``hold_limit``; the ``tao-overcommit`` lever): past that, holding costs more than vLLM
    preempting and recomputing; ``overcommit_cap``: only onto a replica whose admitted
    footprints stay within that multiple of its capacity (``TaoPolicy.over_capacity``)."""

    values: ValueConfig = FULL_VALUES
    placement: str = "dp"
    pause_order: str = "tao"
    budget: DpBudget = field(default_factory=DpBudget)
    guard: bool = True
    sparse: bool = True
    objective: str = "paper"
    spread: bool = False
    pause_tolerance: float = 0.0
    reclaim: bool = False
    fast_admit: bool = False
    ttl: bool = False
    ttl_model: ContinuumConfig = field(default_factory=ContinuumConfig)
    ttl_queue: bool = False
    ttl_min_remaining_s: float = 0.0
    hold_cost: bool = False
    overcommit: bool = False
    overcommit_cap: float = 1.4


TAO_PAPER = TaoConfig(spread=True)
"""The TAO paper's policy: (Σk, Σr, Σf) by the DP, pauses by ascending value; placement ties
broken by compute load (spread.py), which the paper leaves open."""

TAO = TaoConfig(objective="ready-first", pause_tolerance=0.05, spread=True)
"""The shipped ``tao`` policy (docs/algorithms.md#policies-tao-and-tao-paper): the paper's DP,
values and pause order, with three changes measured on the simulator grid:
- ready-first objective (Σr, Σk, Σf): a session that can use the GPU now outranks a warm cache
  whose tool is still running (the paper's Σk-first order re-admits paused sessions with warm
  credit while their tools run, holding KV that ready sessions wait for);
- pause hysteresis of 5 % of capacity: footprints are reservations that include estimated
  output and next append, so a small excess is usually not real KV pressure; pausing at once
  paused 3x as often as ThunderAgent and cost prefix hits (91.3 vs 93.6 %);
- compute-load spreading as the last tie-break (spread.py)."""


def ttl_s(session: SessionState, now_s: float, model: ContinuumConfig, queue_delay_s: float = 0.0) -> float:
    """Continuum's KV time-to-live for the session's current tool call (arXiv 2511.02230 §4.2,
    as ``ContinuumPolicy.ttl_s`` before it has history): τ* = argmax_τ P(τ)·B − τ with
    P = Exp(predicted duration d), i.e. d·ln(B/d) when B > d, else 0; B = T·η +
    PrefillReload(context) (the §5.2 quadratic fit; T = ``queue_delay_s``, 0 by default, the
    paper's initial T; η = ``model.default_eta``, 1.0). Without a fresh prediction: the
    cold-start T_default (2 s)."""
    begun = session.acting_since_s if session.acting_since_s is not None else now_s
    if session.tool_return_s is None:
        return model.default_ttl_s
    benefit = (queue_delay_s * model.default_eta
               + prefill_reload_s(session.context_tokens or session.footprint_tokens, model))
    return ttl_exponential(max(0.0, session.tool_return_s - begun), benefit)


def ttl_expired(session: SessionState, now_s: float, model: ContinuumConfig, queue_delay_s: float = 0.0) -> bool:
    """The session's tool call has outlived its TTL (``ttl_s``): holding its KV is predicted to
    cost more than reloading it. A call with no known start counts as starting now."""
    begun = session.acting_since_s if session.acting_since_s is not None else now_s
    return now_s >= begun + ttl_s(session, now_s, model, queue_delay_s)


def hold_outweighs_recompute(waited_s: float, incumbent: SessionState, model: ContinuumConfig) -> bool:
    """A ready session held ``waited_s`` has cost at least what recomputing ``incumbent``'s
    context would (``prefill_reload_s`` of its context, the engine's prefill time for it):
    vLLM keeps a paused session's blocks cached until they are needed, so giving its
    reservation away costs at most that recompute when its tool returns."""
    return waited_s >= prefill_reload_s(incumbent.context_tokens or incumbent.footprint_tokens, model)


def place_greedily(order: Sequence[int], values: Values, eligible: npt.NDArray[np.bool_],
                   free_tokens: IntArray) -> npt.NDArray[np.int64]:
    """Walk rows in ``order``; put each on the feasible column with the most credit, then the
    tightest fit, then the lowest index. Returns the choice vector (-1 = not placed)."""
    m, n = eligible.shape if eligible.ndim == 2 else (values.footprint.shape[0], 0)
    choice = np.full(m, -1, dtype=np.int64)
    rem = [int(x) for x in free_tokens.tolist()]
    top = max(rem, default=0)
    foot = values.footprint.tolist()
    if n > 16:
        return _place_greedily_wide(order, values, eligible, free_tokens)
    for i in order:
        need = foot[i]
        if need > top:
            continue  # cheap skip: once replicas fill up most rows fit nowhere
        elig = eligible[i].tolist()
        credit = values.credit[i].tolist()
        best: tuple[int, int, int] | None = None
        for j in range(n):
            if elig[j] and rem[j] >= need:
                key = (-credit[j], rem[j] - need, j)
                if best is None or key < best:
                    best = key
        if best is None:
            continue
        j = best[2]
        choice[i] = j
        rem[j] -= need
        top = max(rem)
    return choice


def _place_greedily_wide(order: Sequence[int], values: Values, eligible: npt.NDArray[np.bool_],
                         free_tokens: IntArray) -> npt.NDArray[np.int64]:
    """``place_greedily`` with numpy row operations (faster than Python for many replicas)."""
    choice = np.full(values.footprint.shape[0], -1, dtype=np.int64)
    rem = free_tokens.astype(np.int64).copy()
    big = np.iinfo(np.int64).max
    top = int(rem.max()) if rem.size else 0
    foot = values.footprint.tolist()
    for i in order:
        need = foot[i]
        if need > top:
            continue
        ok = eligible[i] & (rem >= need)
        if not ok.any():
            continue
        credit = values.credit[i]
        slack = np.where(ok & (credit == credit[ok].max()), rem - need, big)
        j = int(slack.argmin())
        choice[i] = j
        rem[j] -= need
        top = int(rem.max())
    return choice


def bfd_order(values: Values, eligible: npt.NDArray[np.bool_], ids: Sequence[str]) -> list[int]:
    """Rows by best value triple descending (k on their best eligible replica, r, f), then id
    (rows are in id order, so the row index breaks ties)."""
    rows = np.arange(len(ids))
    best_k = np.where(eligible, values.credit, 0).max(axis=1) if eligible.size else np.zeros(len(ids), np.int64)
    return np.lexsort((rows, -values.footprint, -values.ready, -best_k)).tolist()


def sjf_order(values: Values, ids: Sequence[str]) -> list[int]:
    """Rows by footprint ascending, then id (row order)."""
    return np.lexsort((np.arange(len(ids)), values.footprint)).tolist()


class TaoPolicy:
    """TAO or one of its ablations / the SJF baseline, by ``TaoConfig``."""

    gates_admission = True
    sticky = True

    def __init__(self, name: str = "tao", config: TaoConfig | None = None,
                 stopwatch: Stopwatch | None = None) -> None:
        self.name = name
        self.config = config or TaoConfig()
        self._stopwatch = stopwatch
        self._revisions = PlanCounter()
        self._first_seen: dict[str, int] = {}  # session -> order of first sight (tao-senior)
        # The router core reads this (CoreConfig.fast_admit): decisions without contention are
        # the DP's own under the ready-first objective, so the router may take them itself.
        self.fast_admit = self.config.fast_admit and self.config.objective == "ready-first"
        self._seen = 0
        # tao-ttl-q: sessions this policy reclaimed, and their pool waits when admitted again.
        self._reclaimed: set[str] = set()
        self._reclaim_waits: deque[float] = deque(maxlen=self.config.ttl_model.queue_window)

    def hold_limit_s(self, prompt_tokens: int) -> float:
        """``TaoConfig.overcommit``: how long a held request of ``prompt_tokens`` may wait before
        the router admits its session over capacity: the engine's time to prefill that prompt
        (``prefill_reload_s``, the qwen3-32b-h100x2 fit of the engine model), i.e. what a
        recompute after a preemption costs it."""
        return prefill_reload_s(prompt_tokens, self.config.ttl_model)

    @property
    def hold_limit(self) -> Callable[[int], float] | None:
        """The router core's ``hold_limit`` (None: hold until a plan admits)."""
        return self.hold_limit_s if self.config.overcommit else None

    @property
    def over_capacity(self) -> float:
        """The router core's ``over_capacity``: 1 (never over) unless ``TaoConfig.overcommit``."""
        return self.config.overcommit_cap if self.config.overcommit else 1.0

    @property
    def queue_delay_s(self) -> float:
        """T of ``TaoConfig.ttl_queue``: the mean of the last ``queue_window`` pool waits of
        reclaimed sessions (0 before any, Continuum's initial T)."""
        return sum(self._reclaim_waits) / len(self._reclaim_waits) if self._reclaim_waits else 0.0

    def _observe_reclaimed(self, snapshot: Snapshot, assigned: Sequence[Assignment],
                           dropped: Sequence[str]) -> None:
        """Record the pool wait of each reclaimed session this plan admits again (0 when it is
        admitted before its request arrives), then remember the newly reclaimed ones."""
        by_id = {s.id: s for s in snapshot.sessions}
        for a in assigned:
            if a.session in self._reclaimed:
                self._reclaimed.discard(a.session)
                s = by_id[a.session]
                waited = (snapshot.now_s - s.waiting_since_s
                          if s.phase == "WAITING" and s.waiting_since_s is not None else 0.0)
                self._reclaim_waits.append(max(0.0, waited))
        self._reclaimed.update(dropped)
        if len(self._reclaimed) > 4 * len(by_id) + 64:
            self._reclaimed &= set(by_id)

    def plan(self, snapshot: Snapshot) -> Plan:
        start = start_time(self._stopwatch)
        cfg = self.config
        replicas = sorted_replicas(snapshot)
        paused = plan_pauses(snapshot, cfg.pause_order, cfg.values, cfg.pause_tolerance)
        paused_ids = frozenset(paused.pauses)
        free = free_after_pauses(replicas, paused.freed_tokens)
        pool = pool_candidates(snapshot)
        values = fold_values(snapshot.now_s, pool, replicas, cfg.values)
        healthy = np.array([r.healthy for r in replicas], dtype=np.bool_)
        eligible = healthy[None, :] & serving_mask(pool, replicas) & (values.footprint[:, None] <= free[None, :])
        ids = [s.id for s in pool]
        best_k = np.where(eligible, values.credit, 0).max(axis=1) if pool and replicas else np.zeros(len(pool), np.int64)
        keep = apply_headroom(
            pool,
            dict(snapshot.tenant_headroom) if snapshot.tenant_headroom else None,
            (lambda i: (-int(values.ready[i]), -int(best_k[i]), -int(values.footprint[i]), ids[i]))
            if cfg.objective == "ready-first" else
            (lambda i: (-int(best_k[i]), -int(values.ready[i]), -int(values.footprint[i]), ids[i])),
        )
        if len(keep) < len(pool):
            rows = np.array(keep, dtype=np.intp)
            values = Values(values.credit[rows], values.ready[rows], values.footprint[rows])
            eligible = eligible[rows]
            ids = [ids[i] for i in keep]
        solve_values = ready_first(values) if cfg.objective == "ready-first" else values
        if cfg.objective == "senior":
            solve_values = with_tier(values, self._seniority_tier(snapshot, ids, values), keep_ready=False)
        solved = self._solve(solve_values, eligible, free, ids)
        choice = solved.choice
        pauses = paused.pauses
        if cfg.reclaim or cfg.ttl or cfg.hold_cost:
            reclaimed = self._reclaim(snapshot, replicas, healthy, paused_ids, values, free, ids, choice)
            if reclaimed is not None:
                solved, values, eligible, free, dropped, kept = reclaimed
                choice = solved.choice
                pauses = pauses + dropped
                paused_ids = paused_ids | frozenset(dropped) | kept
        if cfg.spread:
            col = {r.id: j for j, r in enumerate(replicas)}
            admitted = [s for s in snapshot.sessions if s.admitted and s.id not in paused_ids]
            busy, total = replica_load(admitted, col, len(replicas))
            choice = spread(choice, values, eligible, free, busy, total)
        if len(choice) > len(ids):  # _reclaim's rows of reclaimed incumbents: not assignments
            values = Values(values.credit[: len(ids)], values.ready[: len(ids)], values.footprint[: len(ids)])
            choice = choice[: len(ids)]
        assignments = tuple(
            Assignment(ids[i], replicas[int(choice[i])].id) for i in range(len(ids)) if choice[i] >= 0
        )
        if cfg.ttl_queue:
            self._observe_reclaimed(snapshot, assignments, pauses[len(paused.pauses):])
        return Plan(
            revision=self._revisions.next(),
            assignments=assignments,
            pauses=pauses,
            objective=(objective_of(values, choice) if cfg.values == FULL_VALUES
                       else full_objective(snapshot, assignments)),
            solver=solved.solver,
            solve_ms=elapsed_ms(self._stopwatch, start),
            excluded_by_rounding=solved.excluded,
            # The approximate solver's bound is in the order it solved; only the paper's order
            # is the order of ``objective``, so a ready-first bound is not reported.
            upper_bound=solved.upper_bound if cfg.objective == "paper" else None,
            policy=self.name,
            dp_states=solved.states,
            pruned_pairs=solved.pruned,
            unit_tokens=solved.unit_tokens,
        )

    def _reclaim(self, snapshot: Snapshot, replicas: Sequence[ReplicaState], healthy: npt.NDArray[np.bool_],
                 paused_ids: frozenset[str], values: Values, free: IntArray, ids: list[str],
                 choice: npt.NDArray[np.int64],
                 ) -> tuple[Solved, Values, npt.NDArray[np.bool_], IntArray, tuple[str, ...], frozenset[str]] | None:
        """Take KV reservations back from tools when ready work waits (``TaoConfig.reclaim``).

        When the plan leaves a ready pool session out, the admitted ACTING sessions that are not
        ready (their tool is not predicted back within the horizon) become candidates again: the
        DP re-solves pool ∪ those incumbents, each incumbent only on its own replica, with
        their footprints returned to the free tokens, on tiers r·(m+1) + incumbent (m rows),
        so that readiness ranks first (exactly: Σincumbent ≤ m) and an incumbent is dropped only
        to admit a ready session, never for cache credit alone. Dropped incumbents are paused
        (their blocks stay cached in vLLM until the space is needed, so a tool that returns
        before that still hits). With ``TaoConfig.ttl`` only incumbents whose Continuum TTL has
        run out (``ttl_expired``) are candidates: a tool predicted back before reloading its
        context would cost more than holding it keeps its slot. Returns None when nothing changes; else the solve over the
        combined rows (pool rows first), its values / eligibility / free tokens, the
        incumbents to pause, and the ids of those kept (already admitted, not re-placed)."""
        cfg = self.config
        m_pool = len(ids)
        left_out = [i for i in range(m_pool) if values.ready[i] and choice[i] < 0]
        if not left_out:
            return None
        col = {r.id: j for j, r in enumerate(replicas)}
        by_id = {s.id: s for s in snapshot.sessions}
        # hold_cost: the longest a left-out ready session has been held (0 when none is held yet)
        waited = max((snapshot.now_s - w for i in left_out
                      if (w := by_id[ids[i]].waiting_since_s) is not None), default=0.0)

        def usual(s: SessionState) -> bool:
            return (not (s.ready and cfg.values.use_readiness)
                    and (not cfg.ttl or ttl_expired(s, snapshot.now_s, cfg.ttl_model,
                                                    self.queue_delay_s if cfg.ttl_queue else 0.0))
                    and (cfg.ttl_min_remaining_s <= 0.0 or s.tool_return_s is None
                         or s.tool_return_s - snapshot.now_s >= cfg.ttl_min_remaining_s))

        def costly(s: SessionState) -> bool:
            return cfg.hold_cost and hold_outweighs_recompute(waited, s, cfg.ttl_model)

        inc = sorted((s for s in snapshot.sessions
                      if s.admitted and s.id not in paused_ids and s.phase == "ACTING"
                      and ((cfg.reclaim or cfg.ttl) and usual(s) or costly(s))
                      and s.replica in col and healthy[col[s.replica or ""]]), key=lambda s: s.id)
        if not inc:
            return None
        inc_values = fold_values(snapshot.now_s, inc, replicas, cfg.values)
        freed = free.copy()
        for s in inc:
            freed[col[s.replica or ""]] += s.footprint_tokens
        n = len(replicas)
        combined = Values(
            credit=np.vstack([values.credit.reshape(m_pool, n), inc_values.credit.reshape(len(inc), n)]),
            ready=np.concatenate([values.ready, inc_values.ready]),
            footprint=np.concatenate([values.footprint, inc_values.footprint]),
        )
        m = m_pool + len(inc)
        rows = [by_id[sid] for sid in ids] + inc
        eligible = healthy[None, :] & serving_mask(rows, replicas) & (combined.footprint[:, None] <= freed[None, :])
        own = np.zeros((len(inc), n), dtype=np.bool_)
        for k, s in enumerate(inc):
            own[k, col[s.replica or ""]] = True
        eligible[m_pool:] &= own
        incumbent = np.concatenate([np.zeros(m_pool, np.int64), np.ones(len(inc), np.int64)])
        # an incumbent whose hold has outweighed its recompute ranks as not ready: the waiting
        # session may take its place (readiness still ranks first among the rest)
        ready = combined.ready.copy()
        for k, s in enumerate(inc):
            if costly(s):
                ready[m_pool + k] = 0
        tier = ready * (m + 1) + incumbent
        solved = self._solve(with_tier(combined, tier, keep_ready=False), eligible, freed,
                             ids + [s.id for s in inc])
        dropped = tuple(inc[k].id for k in range(len(inc)) if solved.choice[m_pool + k] < 0)
        if not dropped:
            return None
        kept = frozenset(inc[k].id for k in range(len(inc)) if solved.choice[m_pool + k] >= 0)
        return solved, combined, eligible, freed, dropped, kept

    def _seniority_tier(self, snapshot: Snapshot, ids: list[str], values: Values) -> IntArray:
        """Per pool row: 0 when not ready; else 1, or 2 for the older half of the sessions in the
        snapshot, by the order in which this policy first saw them (program-level age, after
        Continuum's program FCFS). Σtier then counts ready sessions with the senior ones twice."""
        for sid in sorted(sess.id for sess in snapshot.sessions if sess.id not in self._first_seen):
            self._first_seen[sid] = self._seen  # new ones in id order: list order never matters
            self._seen += 1
        live = {sess.id for sess in snapshot.sessions}
        if len(self._first_seen) > 4 * len(live) + 64:
            self._first_seen = {k: v for k, v in self._first_seen.items() if k in live}
        order = sorted(live, key=self._first_seen.__getitem__)
        senior = set(order[: (len(order) + 1) // 2])
        bonus = [1 if sid in senior else 0 for sid in ids]
        return np.array([(1 + b) if r else 0 for b, r in zip(bonus, values.ready.tolist(), strict=True)],
                        dtype=np.int64)

    def _solve(self, values: Values, eligible: npt.NDArray[np.bool_], free: IntArray, ids: list[str]) -> Solved:
        cfg = self.config
        if cfg.placement == "bfd":
            return Solved(place_greedily(bfd_order(values, eligible, ids), values, eligible, free), "bfd")
        if cfg.placement == "sjf":
            return Solved(place_greedily(sjf_order(values, ids), values, eligible, free), "sjf")
        instance = Instance(values=values, free_tokens=free, eligible=eligible)
        exact = solve_sparse(instance) if cfg.sparse else None
        if exact is None:
            exact = solve_exact(instance, cfg.budget)
        if exact is None:
            approx = solve_greedy(instance)
            return Solved(approx.choice, "knapsack+bfd", upper_bound=approx.upper_bound)
        choice = exact.choice.copy()
        solver = "exact-dp"
        excluded = 0
        if exact.exact_tokens:
            return Solved(choice, solver, states=exact.states, pruned=exact.pruned_pairs, unit_tokens=1)
        # Rounding top-up: whatever still fits in the exact leftover tokens, BFD order.
        rem = free.copy()
        for i in np.nonzero(choice >= 0)[0]:
            rem[choice[i]] -= values.footprint[i]
        left = [i for i in bfd_order(values, eligible, ids) if choice[i] < 0]
        extra = place_greedily(left, values, eligible, rem)
        excluded = int((extra >= 0).sum())
        if excluded:
            solver = "exact-dp+topup"
            choice = np.where(extra >= 0, extra, choice)
        solved = Solved(choice, solver, excluded=excluded, states=exact.states,
                        pruned=exact.pruned_pairs, unit_tokens=exact.unit_tokens)
        return self._guarded(solved, values, eligible, free, ids)

    def _guarded(self, solved: Solved, values: Values, eligible: npt.NDArray[np.bool_], free: IntArray,
                 ids: list[str]) -> Solved:
        """Rounding (or the fallback) can leave the plan below a simple heuristic working in
        exact tokens; the guard keeps the best of the three (ties: the solver's plan)."""
        if not self.config.guard:
            return solved
        best, best_value = solved, objective_of(values, solved.choice)
        candidates: tuple[tuple[str, Callable[[], npt.NDArray[np.int64]]], ...] = (
            ("guard-knapsack", lambda: solve_greedy(Instance(values, free, eligible), with_bound=False).choice),
            ("guard-bfd", lambda: place_greedily(bfd_order(values, eligible, ids), values, eligible, free)),
            ("guard-sjf", lambda: place_greedily(sjf_order(values, ids), values, eligible, free)),
        )
        for name, build in candidates:
            choice = build()
            value = objective_of(values, choice)
            if value > best_value:
                best = dataclasses.replace(solved, choice=choice, solver=name)
                best_value = value
        return best


@dataclass(frozen=True, slots=True)
class Solved:
    choice: npt.NDArray[np.int64]
    solver: str
    excluded: int = 0
    upper_bound: Objective | None = None
    states: int = 0
    pruned: int = 0
    unit_tokens: int = 0
