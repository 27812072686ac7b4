"""TAO's policies, their ablations, and the shortest-job-first baseline (all admission-gating).

Two configurations of one ``TaoPolicy`` (docs/algorithms.md#policies-tao-and-tao-paper):
``TAO_PAPER`` is the TAO paper's policy (objective (Σk, Σr, Σf), pause at once); ``TAO_HOLD``
ranks readiness first (Σr, Σk, Σf), pauses with 5 % hysteresis and spreads placement ties by
compute load, and holds an admitted session's KV for its whole tool call (``tao-hold``, the
shipped ``tao`` until 2026-12-03); ``TAO``, the shipped ``tao``, is ``TAO_HOLD`` that takes a
tool's KV back when its Continuum TTL has run out and it is predicted to outlast the turn of a
ready session left out on its replica (``ttl``, ``ttl_turn``). All run the machinery below.

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
from dataclasses import dataclass, field, replace

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
    full_objective,
    plan_pauses,
    pool_candidates,
    room_after_pauses,
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
class DecodeStepFit:
    """Seconds of one decode step of ``batch`` sequences that read ``kv_tokens`` of KV in all:
    c0 + c1·batch + c2·kv_tokens, the least-squares fit of the engine model's decode step
    (``services/sim/engine/step_time.py``, ``decode_step_time_s``) on qwen3-32b-h100x2, batch
    1–64 × 1k–96k tokens each, within 0.1 % everywhere: the profile of ``ContinuumConfig``'s
    prefill fit (about 14.4 ms for one short sequence, 35 ms for four of 96k tokens).

    For a mixture-of-experts model a step also reads the routed experts its tokens touch: with
    each of ``batch`` tokens picking k of E experts, a share ``1 − (1 − k/E)^batch`` of them
    (the engine model's weight read, ``StepTimeModel.weight_bytes_read``), which no term linear
    in the batch fits (the GLM profile's linear fit was off by up to 32 %). ``expert_miss`` is
    ``1 − k/E`` from the model's config (1.0, no term, for a dense model) and
    ``per_expert_share_s`` the time to read all routed experts once."""

    constant_s: float = 1.444e-2
    per_seq_s: float = 6.41e-5
    per_kv_token_s: float = 5.22e-8
    per_expert_share_s: float = 0.0
    expert_miss: float = 1.0

    @property
    def weight_bound_kv_tokens(self) -> int:
        """The KV tokens whose read costs a decode step as much as its constant part (the
        weights): below it a step is bound by the weights, whatever the batch holds."""
        return int(self.constant_s / self.per_kv_token_s) if self.per_kv_token_s > 0 else 0

    def step_s(self, batch: int, kv_tokens: int) -> float:
        b = max(1, batch)
        return (self.constant_s + self.per_seq_s * b + self.per_kv_token_s * max(0, kv_tokens)
                + self.per_expert_share_s * (1.0 - self.expert_miss**b))


@dataclass(frozen=True, slots=True)
class TaoConfig:
    """``placement``: "dp" | "bfd" | "sjf"; ``pause_order``: "tao" | "thunderagent" | "belady" |
    "smallest" (``plan_pauses``);
    ``guard``: after a DP that did not run at token resolution, also build the BFD and SJF
    plans and keep the lexicographically best in exact tokens; ``sparse``: try the
    token-resolution DP over reachable states (sparse.py) first; ``objective``: "paper"
    (Σk, Σr, Σf), "ready-first" (Σr, Σk, Σf, values.ready_first), "senior" (ready sessions,
    the older half counted twice, then Σk, Σf) or "tiered" (Σtier, Σk, Σf: readiness, or a
    subclass's finer per-session tier, ``TaoPolicy._tier``); ``spread``: break placement
    ties by compute load (spread.py); ``pause_tolerance``: pause only once a replica's admitted
    footprints exceed capacity × (1 + tolerance), then back down to capacity (hysteresis);
    ``reclaim``: a ready pool session that does not fit may take the reservation of admitted
    ACTING sessions that are not ready (``TaoPolicy._reclaim``; the ``tao-reclaim`` lever);
    ``fast_admit``: the router admits the request of a session alone in the pool at once
    (``services.router.core.model.CoreConfig.fast_admit`` "cache"), without the planner round trip;
    ``ttl``: reclaim as ``reclaim``, but only from ACTING sessions whose Continuum-style KV
    time-to-live has run out (``ttl_expired``; the ``tao-ttl`` lever), with ``ttl_model``'s
    prefill-reload fit and cold-start TTL; ``ttl_queue``: add Continuum's queueing term T·η to
    the TTL's benefit, T the mean pool wait of the sessions this policy reclaimed, measured when
    it admits them again (the ``tao-ttl-q`` lever); ``ttl_min_remaining_s``: with ``ttl``, take
    back only a tool predicted to run at least this much longer (one past its predicted return
    counts as returning now; no fresh prediction: allowed once its TTL ran out; the
    ``tao-ttl-long`` lever); ``ttl_turn``: with ``ttl``, take back only a tool predicted to run
    longer than the shortest predicted turn (``turn_s``) of the ready sessions left out on its
    replica, i.e. one that would lend (``lends``) to the session that needs the tokens: the
    bound ``ttl_min_remaining_s`` sets by hand, from the engine's step times instead (no fresh
    prediction: allowed once its TTL ran out; the ``tao-ttl-turn`` lever); ``hold_cost``:
    reclaim as ``reclaim``, and once a ready pool session left out has waited at least the time
    to recompute an admitted ACTING session's context (``hold_outweighs_recompute``, the
    prefill-reload fit of ``ttl_model``), that incumbent's reservation may be taken even when its
    tool is predicted back or its TTL runs: holding the
    waiting session has already cost more than the engine recomputing the incumbent's KV
    (ski rental: keep holding until the hold has cost what the alternative costs; the
    ``tao-hold-cost`` lever, docs/benchmarks.md#terminal-bench-and-kv_aware); ``overcommit``: the
    router lets a pool session's held request through over capacity once it has waited the
    prefill-reload time of its own prompt (``TaoPolicy.hold_limit``, read by the router core as
    its ``hold_limit``; the ``tao-overcommit`` lever): past that, holding costs more than vLLM
    preempting and recomputing; ``overcommit_cap``: only onto a replica whose admitted
    footprints stay within that multiple of its capacity (``TaoPolicy.over_capacity``); ``lend``: a
    ready pool session the plan leaves out may be admitted into the reservations of admitted ACTING
    sessions whose predicted tool outlasts its predicted turn (``TaoPolicy._lend``, ``lends``; the
    ``tao-lend`` lever); it gives them back when its request ends (the router core accepts such an
    assignment, ``CoreConfig.lend``), with ``decode_model``'s decode step time; ``idle_reclaim``:
    with ``ttl_turn``, the turn bound does not apply on a replica where no admitted session runs
    a request (read from the sessions' phases, the router's own state, not the replica's scraped
    running count, which can be a scrape interval old): there an ACTING session whose TTL has run out gives its
    reservation to a ready session left out even when its tool is predicted back before that
    session's turn would end. Its GPU would otherwise idle until the tool returns, while the ready
    session waits for a room that, where a few long contexts fill a replica, no short tool ever
    frees; the incumbent then waits at most one turn; ``borrow_bound``: with ``ttl_turn``, the
    reclaimed tokens go only to ready sessions whose own predicted turn on that replica ends
    before every tool reclaimable there is predicted to return (``TaoPolicy._reclaim``; the
    ``tao-borrow`` lever, not shipped): without it the bound holds only for the shortest turn, and
    the solve may admit any left-out session into the freed tokens (on 2-node SWE-lite c128, 195
    of 287 borrowers had a predicted turn longer than a dropped tool's predicted remaining time);
    with it, level with ``tao`` on the grid
    (docs/benchmarks.md#the-turn-bound-for-every-borrower-2026-12-05-not-shipped);
    ``share_prefixes``: on a replica whose whole KV cache read costs a decode step less time than
    its weights read (``decode_model``: KV tokens × per-token cost < the step's constant), the
    router reserves a prefix that sessions share (the same system prompt and tools) once instead
    of once per session, as vLLM's prefix cache stores it once; there an extra sequence is nearly
    free throughput, so the tokens are worth more as admitted sessions. Where the KV read
    dominates, the copies stay counted per session and the tokens they stand for keep paused
    sessions' blocks cached (``CoreConfig.share_prefixes_below_tokens``;
    docs/algorithms.md#footprint)."""

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
    ttl_turn: bool = False
    hold_cost: bool = False
    overcommit: bool = False
    overcommit_cap: float = 1.4
    lend: bool = False
    decode_model: DecodeStepFit = field(default_factory=DecodeStepFit)
    idle_reclaim: bool = False
    borrow_bound: bool = False
    share_prefixes: bool = False


TAO_PAPER = TaoConfig(spread=True)
"""The TAO paper's policy: (Σk, Σr, Σf) by the DP, pauses by ascending value; placement ties
broken by compute load (spread.py), which the paper leaves open."""

TAO_HOLD = TaoConfig(objective="ready-first", pause_tolerance=0.05, spread=True)
"""``tao-hold``, the shipped ``tao`` until 2026-12-03 and the base of the levers
(docs/algorithms.md#policies-tao-and-tao-paper): the paper's DP, values and pause order, with
three changes measured on the simulator grid:
- ready-first objective (Σr, Σk, Σf): a session that can use the GPU now outranks a warm cache
  whose tool is still running (the paper's Σk-first order re-admits paused sessions with warm
  credit while their tools run, holding KV that ready sessions wait for);
- pause hysteresis of 5 % of capacity: footprints are reservations that include estimated
  output and next append, so a small excess is usually not real KV pressure; pausing at once
  paused 3x as often as ThunderAgent and cost prefix hits (91.3 vs 93.6 %);
- compute-load spreading as the last tie-break (spread.py).

It holds an admitted session's KV reservation for as long as its tool runs."""

TAO = replace(TAO_HOLD, ttl=True, ttl_turn=True, fast_admit=True, share_prefixes=True)
"""The shipped ``tao`` policy: ``TAO_HOLD`` plus the TTL reclaim bounded by the turn time (the
``tao-ttl-turn`` lever until 2026-12-03; docs/benchmarks.md#the-reclaim-that-never-happened-plan-revalidation-fixed):
a ready pool session the DP leaves out may take the reservation of admitted ACTING sessions whose
Continuum TTL has run out (``ttl_expired``) and whose tool is predicted to run longer than the
shortest predicted turn (``turn_s``) of the ready sessions left out on their replica (``lends``);
dropped incumbents are paused, fewest first, readiness still ranking first (``TaoPolicy._reclaim``);
and, since 2026-12-05, a session alone in the pool admitted by the router core at its request's
arrival (``fast_admit``, ``CoreConfig.fast_admit`` "cache"; docs/algorithms.md#policies-tao-and-tao-paper),
and, on replicas whose decode step stays weight-bound with a full cache, a prefix the sessions
share reserved once (``share_prefixes``; docs/algorithms.md#footprint)."""

TAO_BORROW = replace(TAO, borrow_bound=True)
"""``tao-borrow``: ``TAO`` whose reclaimed tokens go only to sessions whose own predicted turn ends
before the tools reclaimed for them return (``borrow_bound``). Level with ``tao`` over four seeds
of the fast grid and two of the full grid; not shipped
(docs/benchmarks.md#the-turn-bound-for-every-borrower-2026-12-05-not-shipped)."""

TAO_IDLE = replace(TAO, idle_reclaim=True)
"""``tao-idle``: ``TAO`` whose turn bound does not apply on a replica where no admitted session
runs a request (``idle_reclaim``). Ahead of ``tao`` in the simulator on tight-KV traces, behind it
live; not shipped (docs/benchmarks.md#an-idle-replica-waives-the-turn-bound-tao-idle-2026-12-04-not-shipped)."""


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


def turn_s(borrower: SessionState, cached_tokens: int, running: int, running_kv_tokens: int,
           cfg: TaoConfig) -> float:
    """Predicted duration of ``borrower``'s next turn on a replica that holds ``cached_tokens`` of
    its prompt and runs ``running`` requests over ``running_kv_tokens`` of KV: the prefill of the
    uncached part of its prompt (``prefill_reload_s`` of the prompt less that of the cached
    prefix: the suffix attends to the prefix) plus the decode of its new tokens at that replica's
    decode step time with the borrower in the batch (``DecodeStepFit``). Its footprint stands for
    the prompt and its footprint less its context (the next append plus the expected output,
    docs/algorithms.md#footprint) for the output: the snapshot carries no separate output
    estimate, so both are upper bounds (a longer predicted turn lends less)."""
    prompt = borrower.footprint_tokens
    cached = min(max(0, cached_tokens), prompt)
    prefill = prefill_reload_s(prompt, cfg.ttl_model) - prefill_reload_s(cached, cfg.ttl_model)
    new_tokens = max(0, borrower.footprint_tokens - borrower.context_tokens)
    step = cfg.decode_model.step_s(running + 1, running_kv_tokens + borrower.footprint_tokens)
    return prefill + new_tokens * step


def lends(lender: SessionState, now_s: float, turn: float) -> bool:
    """``lender`` (an admitted ACTING session that is not ready) may lend its reservation for a
    turn of ``turn`` seconds: its tool is predicted to return later than that turn ends. Without a
    fresh prediction it does not lend; a tool past its predicted return counts as returning now."""
    return lender.tool_return_s is not None and lender.tool_return_s - now_s > turn


def running_load(snapshot: Snapshot, replicas: Sequence[ReplicaState],
                 col: dict[str, int]) -> tuple[list[int], list[int]]:
    """Per replica: the requests it runs (its own count) and the footprints of the admitted
    sessions in RUNNING there (the KV its decode steps read), for ``turn_s``."""
    running = [r.running for r in replicas]
    running_kv = [0] * len(replicas)
    for s in snapshot.sessions:
        if s.admitted and s.phase == "RUNNING" and s.replica in col:
            running_kv[col[s.replica]] += s.footprint_tokens
    return running, running_kv


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
    #: CoreConfig.drop_resumed_reclaims: a reclaim takes the reservation of a session between
    #: requests, so its pause is void once that session runs again (router/core/plans.py)
    reclaims_between_requests = True

    def __init__(self, name: str = "tao", config: TaoConfig | None = None,
                 stopwatch: Stopwatch | None = None) -> None:
        self.name = name
        self.config = config or TaoConfig()
        self._stopwatch = stopwatch
        self._revisions = PlanCounter()
        self._first_seen: dict[str, int] = {}  # session -> order of first sight (tao-senior)
        # The router core reads this (CoreConfig.fast_admit): a session alone in the pool is
        # admitted by the DP wherever it fits, with the most credit first, so the router may
        # take that decision itself at the request's arrival.
        self.fast_admit = "cache" if self.config.fast_admit else ""
        self._seen = 0
        # tao-ttl-q: sessions this policy reclaimed, and their pool waits when admitted again.
        self._reclaimed: set[str] = set()
        self._reclaim_waits: deque[float] = deque(maxlen=self.config.ttl_model.queue_window)
        # The router core reads this (CoreConfig.lend): a plan's assignment may exceed free room.
        self.lend = self.config.lend
        self._loans: dict[str, _Loan] = {}  # tao-lend: borrower -> its loan
        # The router core reads this (CoreConfig.share_prefixes_below_tokens): on a replica of at
        # most this many KV tokens a prefix that sessions share is reserved once, so the
        # footprints the DP packs are what each session adds there.
        self.shares_prefixes_below_tokens = self.config.decode_model.weight_bound_kv_tokens \
            if self.config.share_prefixes else 0

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
        borrowers = self._settle_loans(snapshot) if cfg.lend else frozenset()
        paused = plan_pauses(snapshot, cfg.pause_order, cfg.values, cfg.pause_tolerance, first=borrowers)
        paused_ids = frozenset(paused.pauses)
        room = room_after_pauses(replicas, paused.freed_tokens)
        free = np.maximum(room, 0)
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
            if cfg.objective in ("ready-first", "tiered") else
            (lambda i: (-int(best_k[i]), -int(values.ready[i]), -int(values.footprint[i]), ids[i])),
        )
        if len(keep) < len(pool):
            rows = np.array(keep, dtype=np.intp)
            values = Values(values.credit[rows], values.ready[rows], values.footprint[rows])
            eligible = eligible[rows]
            ids = [ids[i] for i in keep]
        solve_values = ready_first(values) if cfg.objective == "ready-first" else values
        if cfg.objective in ("senior", "tiered"):
            solve_values = with_tier(values, self._tier(snapshot, ids, values), keep_ready=False)
        solved = self._solve(solve_values, eligible, free, ids)
        choice = solved.choice
        pauses = paused.pauses
        if cfg.reclaim or cfg.ttl or cfg.hold_cost:
            reclaimed = self._reclaim(snapshot, replicas, healthy, paused_ids, values, room, ids, choice)
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
        if cfg.lend:
            choice = self._lend(snapshot, replicas, healthy, frozenset(pauses), values, ids, choice)
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
                 paused_ids: frozenset[str], values: Values, room: IntArray, ids: list[str],
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

        shortest_turn: list[float] = []
        idle: list[bool] = []
        turns: dict[int, list[float]] = {}  # left-out row -> its predicted turn on each replica
        if cfg.ttl_turn:
            running, running_kv = running_load(snapshot, replicas, col)
            turns = {i: [turn_s(by_id[ids[i]], int(values.credit[i, j]), running[j], running_kv[j], cfg)
                         for j in range(len(replicas))] for i in left_out}
            shortest_turn = [min((turns[i][j] for i in left_out), default=0.0) for j in range(len(replicas))]
            # idle: no session admitted there runs a request (``running_kv`` sums their footprints:
            # the router's own, exact state; a replica's scraped running count can be a scrape
            # interval old)
            idle = [cfg.idle_reclaim and kv == 0 for kv in running_kv]

        def usual(s: SessionState) -> bool:
            return (not (s.ready and cfg.values.use_readiness)
                    and (not cfg.ttl or ttl_expired(s, snapshot.now_s, cfg.ttl_model,
                                                    self.queue_delay_s if cfg.ttl_queue else 0.0))
                    and (cfg.ttl_min_remaining_s <= 0.0 or s.tool_return_s is None
                         or s.tool_return_s - snapshot.now_s >= cfg.ttl_min_remaining_s)
                    and (not cfg.ttl_turn or s.tool_return_s is None or s.replica not in col
                         or idle[col[s.replica]] or lends(s, snapshot.now_s, shortest_turn[col[s.replica]])))

        def costly(s: SessionState) -> bool:
            return cfg.hold_cost and hold_outweighs_recompute(waited, s, cfg.ttl_model)

        inc = sorted((s for s in snapshot.sessions
                      if s.admitted and s.id not in paused_ids and s.phase == "ACTING"
                      and ((cfg.reclaim or cfg.ttl) and usual(s) or costly(s))
                      and s.replica in col and healthy[col[s.replica or ""]]), key=lambda s: s.id)
        if not inc:
            return None
        inc_values = fold_values(snapshot.now_s, inc, replicas, cfg.values)
        # from the signed room: a replica left over capacity within the pause tolerance must have
        # its excess covered before an incumbent's tokens make room (floored at 0 only after)
        freed = room.copy()
        for s in inc:
            freed[col[s.replica or ""]] += s.footprint_tokens
        freed = np.maximum(freed, 0)
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
        if cfg.ttl_turn and cfg.borrow_bound:
            # a left-out session may use a replica's reclaimed tokens only if its turn there ends
            # before the earliest predicted return among the tools reclaimable there (a tool without
            # a fresh prediction bounds nothing); the first solve's admissions stay eligible, so
            # the re-solve never admits fewer ready sessions than it did
            first: dict[int, tuple[float, SessionState]] = {}  # replica -> its tool predicted back first
            for s in inc:
                j = col[s.replica or ""]
                if s.tool_return_s is not None and (j not in first or s.tool_return_s < first[j][0]):
                    first[j] = (s.tool_return_s, s)
            for i in left_out:
                for j, (_, lender) in first.items():
                    if not idle[j] and not lends(lender, snapshot.now_s, turns[i][j]):
                        eligible[i, j] = False
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
        # a replica left over capacity within the pause band cannot keep every incumbent in
        # ``freed``; where the solve admits no pool session, its drops would only pay that
        # excess, which is the pause band's business: keep them there
        admits = {int(j) for j in solved.choice[:m_pool] if j >= 0}
        choice = solved.choice.copy()
        for k, s in enumerate(inc):
            if choice[m_pool + k] < 0 and col[s.replica or ""] not in admits:
                choice[m_pool + k] = col[s.replica or ""]
        solved = dataclasses.replace(solved, choice=choice)
        dropped = tuple(inc[k].id for k in range(len(inc)) if solved.choice[m_pool + k] < 0)
        if not dropped:
            return None
        kept = frozenset(inc[k].id for k in range(len(inc)) if solved.choice[m_pool + k] >= 0)
        return solved, combined, eligible, freed, dropped, kept

    def _settle_loans(self, snapshot: Snapshot) -> frozenset[str]:
        """Bring the loans up to date with the snapshot and return the borrowers admitted on loan
        (paused first on their replica once it is over the band: ``plan_pauses``' ``first``).
        A loan lasts while its borrower is admitted on the loan's replica: it ends when the
        borrower is gone, placed elsewhere or back in the pool (its request ended, or the router
        did not apply the loan before this snapshot)."""
        by_id = {s.id: s for s in snapshot.sessions}
        for sid, loan in list(self._loans.items()):
            s = by_id.get(sid)
            if s is None or not s.admitted or s.replica != loan.replica:
                del self._loans[sid]
        return frozenset(self._loans)

    def _lend(self, snapshot: Snapshot, replicas: Sequence[ReplicaState], healthy: npt.NDArray[np.bool_],
              paused_ids: frozenset[str], values: Values, ids: list[str],
              choice: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``TaoConfig.lend``: after the DP, each ready pool session it left out (longest held
        first, then id) may be admitted into the reservations of admitted ACTING sessions that are
        not ready, not paused, not borrowers and not already lending, whose tool is predicted to
        return after the borrower's turn ends (``lends``, ``turn_s`` on that replica): on the
        replica where its predicted turn is shortest (then id), lenders with the furthest return
        first, as few as cover it. Bounds: only on a replica not over capacity after this plan,
        and there Σ admitted − Σ lent + Σ borrowed ≤ capacity, so the excess is never more
        than the borrowers' footprints and the borrowers, paused first (``_settle_loans``), return
        it when their request ends; the lenders keep their admission. Returns the new choice."""
        cfg = self.config
        now = snapshot.now_s
        left = [i for i in range(len(ids)) if values.ready[i] and choice[i] < 0]
        if not left:
            return choice
        by_id = {s.id: s for s in snapshot.sessions}
        col = {r.id: j for j, r in enumerate(replicas)}
        room = [r.capacity_tokens - r.used_tokens for r in replicas]
        for sid in paused_ids:
            s = by_id[sid]
            if s.phase == "ACTING" and s.replica in col:
                room[col[s.replica]] += s.footprint_tokens
        for i in np.nonzero(choice >= 0)[0].tolist():
            room[int(choice[i])] -= int(values.footprint[i])
        open_ = [healthy[j] and room[j] >= 0 for j in range(len(replicas))]
        lending = {lender for loan in self._loans.values() for lender in loan.lenders}
        running, running_kv = running_load(snapshot, replicas, col)
        lenders: list[list[SessionState]] = [[] for _ in replicas]
        for s in sorted(snapshot.sessions, key=lambda s: s.id):
            if (s.admitted and s.replica in col and s.phase == "ACTING" and not s.ready
                    and s.id not in paused_ids and s.id not in lending
                    and s.id not in self._loans and s.tool_return_s is not None):
                lenders[col[s.replica]].append(s)
        for j in range(len(replicas)):
            lenders[j].sort(key=lambda s: (-(s.tool_return_s or 0.0), s.id))
        choice = choice.copy()
        held_since = {i: by_id[ids[i]].waiting_since_s for i in left}
        # tenant headroom needs no count here: ``ids`` are the pool rows ``apply_headroom`` kept,
        # so the DP's admissions and these loans together stay within it
        for i in sorted(left, key=lambda i: (held_since[i] if held_since[i] is not None else now, ids[i])):
            b = by_id[ids[i]]
            best: tuple[float, str, int, tuple[SessionState, ...]] | None = None
            for j, r in enumerate(replicas):
                if not open_[j] or not r.serves(b):
                    continue
                turn = turn_s(b, int(values.credit[i, j]), running[j], running_kv[j], cfg)
                need = b.footprint_tokens - room[j]
                taken: list[SessionState] = []
                for lender in lenders[j]:
                    if need <= 0:
                        break
                    if lends(lender, now, turn):
                        taken.append(lender)
                        need -= lender.footprint_tokens
                if need <= 0 and taken and (best is None or (turn, r.id) < best[:2]):
                    best = (turn, r.id, j, tuple(taken))
            if best is None:
                continue
            _, rid, j, taken_lenders = best
            choice[i] = j
            room[j] += sum(s.footprint_tokens for s in taken_lenders) - b.footprint_tokens
            gone = {s.id for s in taken_lenders}
            lenders[j] = [s for s in lenders[j] if s.id not in gone]
            running[j] += 1
            running_kv[j] += b.footprint_tokens
            self._loans[b.id] = _Loan(rid, tuple(s.id for s in taken_lenders))
        return choice

    def _tier(self, snapshot: Snapshot, ids: list[str], values: Values) -> IntArray:
        """The first term of the "senior" and "tiered" objectives, per pool row (0 when not
        ready). "tiered": readiness alone (1 when ready), i.e. ``tao``'s ready-first order, which
        a subclass refines (the simulator's ``oracle-remaining``, ``services/sim/cluster/oracle.py``).
        "senior": ``_seniority_tier``."""
        if self.config.objective == "tiered":
            return values.ready.astype(np.int64)
        return self._seniority_tier(snapshot, ids, values)

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
class _Loan:
    """A ``tao-lend`` loan: the borrower's replica and the sessions whose reservations it borrowed."""

    replica: str
    lenders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Solved:
    choice: npt.NDArray[np.int64]
    solver: str
    excluded: int = 0
    upper_bound: Objective | None = None
    states: int = 0
    pruned: int = 0
    unit_tokens: int = 0
