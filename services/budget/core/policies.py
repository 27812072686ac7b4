"""The two budget policies: ``static`` (the baseline) and ``dynamic`` (the budget-controller
study's controller, docs/algorithms.md#budget-loop).

Dynamic, made precise (one tick, every 2 s):

1. *Observe.* A tenant counts as observed when its report is at most ``stale_after_s`` old;
   an unobserved tenant keeps its cap and target this tick (we cannot prove it has free
   slots). If it has slots in transit (promised or draining) the whole tick holds.
2. *Demand envelope* (hysteresis in time): ``e = max(demand, floor(e_prev * release))`` —
   rises at once with demand, decays geometrically when demand falls, so a tenant whose
   queue dips between bursts does not lose slots it will need a second later.
3. *Burst reserve* (issue 19: the bursty tenant's tail). A slot lent to a tenant with long
   requests comes back only when its request ends, seconds after the lender's next burst has
   started, so each tenant keeps a *reserve* below which its target never falls: its whole
   static share until it has shown one burst and one idle gap, then its burst peak (largest
   demand, up to its share, since it was last idle longer than ``burst_memory_s``) plus
   headroom (``reserve_headroom``: the peak is a few tick samples of a Poisson count),
   times ``burst_reserve_frac``. *p99 guard:* a tenant with an SLO whose p99 is
   above ``slo_guard_frac`` of it keeps its whole static share. *Gap lending:* an idle
   tenant's reserve is lent (``lend_frac`` of it) only while its shortest observed idle gap
   lasts at least the *horizon* beyond the next tick (lent slots are refilled until then);
   after that the reserve is *called back*: the tenant becomes a receiver up to its reserve
   without demand, its borrowers are drained, and the slots are free again when its burst is
   due. The horizon is how long a call-back takes: measured on the tenant's own completed
   call-backs, and before the first one the longest p99 slot hold (admission to end) the
   would-be borrowers report, at least ``lend_horizon_s``.
4. *Targets* (weighted max-min fairness): each observed tenant wants ``e + ceil(headroom *
   e)`` slots (0 when idle), bounded below by its floor and its reserve. If the wants do not
   fill the budget, everyone gets their want and the slots nobody wants stay with whoever
   holds them. Otherwise the budget is water-filled by weight between that bound and want.
5. *SLO.* A tenant whose reported p99 exceeds its SLO while it has requests held at the
   router (demand > cap) is admission-limited: its weight is multiplied by ``slo_boost``,
   it is served first and other tenants' reserves give way to it. If it has nothing held, or the engine's KV cache is saturated
   (``kv_usage >= kv_saturation_frac``), its latency is load-driven — more admission would
   only queue its requests inside the engine — so it gets no boost; the decision says so.
6. *Move* (``reconcile.transfer``): slots a receiver already runs in vacated donor slots are
   settled into its cap; receivers are tenants with unmet demand (demand > cap), or calling
   back their reserve, at least ``min_move_slots`` below target (hysteresis in size), served SLO-boosted first, then the
   least served by weight; they take unused slots from tenants above target (idle ones
   first) and are promised busy donors' slots (drains) for the rest; a receiver's
   admission limit grows by at most ``step`` (B/4) per tick. Nothing is preempted.

Recovery bound: a tenant that turns busy can admit its floor at once (floors are never
lent). From the first tick that sees its demand, its admission limit reaches its fair
share within ceil(gap / step) ticks; it can use each promised slot the moment the donor's
request in it finishes (drained slots cannot be refilled), so the wait beyond those ticks is
the donors' remaining request time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from services.budget.core.model import Allocation, BudgetConfig, BudgetState, Decision, TenantObservation
from services.budget.core.reconcile import normalise, transfer, unobserved_in_transit
from services.budget.core.split import water_fill, weighted_split

#: ticks are not exactly ``tick_s`` apart (a service's sleep, a simulator's step boundary): gap
#: and idle times within this many ms of the lending horizon count as meeting it
LEND_JITTER_MS = 100
#: a learned call-back time is trusted while the borrowers' p99 slot hold is at most this many
#: times it (DynamicPolicy._horizons): a call-back of about half of the borrowers' slots takes
#: about half of their hold when their requests started at random times
RECALL_TRUST = 2


def fresh_observations(state: BudgetState, stale_after_s: float) -> dict[str, TenantObservation]:
    """The tenants' observations no older than ``stale_after_s`` (the others are held as they are)."""
    return {
        n: obs
        for n in state.config.names
        if (obs := state.observations.get(n)) is not None and state.now_s - obs.observed_at_s <= stale_after_s
    }


def _hold_in_transit(state: BudgetState, observed: Mapping[str, TenantObservation], policy: str) -> Allocation | None:
    """The previous allocation, unchanged, when a tenant with slots in transit is unobserved."""
    missing = unobserved_in_transit(state.previous, observed)
    if state.previous is None or not missing:
        return None
    prev = state.previous
    reason = f"{', '.join(missing)} unobserved while slots are in transit: allocation held"
    return replace(prev, revision=prev.revision + 1, policy=policy, computed_at_s=state.now_s,
                   decisions=(Decision("hold", reason),))


def _prev_limits(state: BudgetState, caps: Mapping[str, int], normalised: list[Decision]) -> Mapping[str, int]:
    """The limits in force before this tick (the caps after an initial split or reconfiguration)."""
    if state.previous is None or normalised:
        return caps
    return state.previous.limits


def _next_revision(state: BudgetState) -> int:
    return 1 if state.previous is None else state.previous.revision + 1


def static_targets(config: BudgetConfig) -> dict[str, int]:
    """Configured static caps, or the budget split by weight (equal by default) above floors."""
    if all(t.static_cap is not None for t in config.tenants):
        return {t.name: int(t.static_cap or 0) for t in config.tenants}
    return weighted_split(config.total, {t.name: t.weight for t in config.tenants},
                          {t.name: t.floor for t in config.tenants})


class StaticPolicy:
    """The baseline: caps frozen at the static split whatever the demand. After a
    reconfiguration or a switch from another policy, caps move to the split as fast as
    slots free up (no step bound, still no preemption)."""

    name = "static"

    def __init__(self, stale_after_s: float = 10.0) -> None:
        self.stale_after_s = stale_after_s

    def reallocate(self, state: BudgetState) -> Allocation:
        return toward_targets(state, static_targets(state.config), self.name, self.stale_after_s,
                              "its static cap", "static split")


def toward_targets(state: BudgetState, targets: Mapping[str, int], policy: str, stale_after_s: float,
                   target_name: str, settled: str) -> Allocation:
    """Move the caps toward ``targets`` (summing to B) as fast as slots free up, with no step
    bound and no preemption (``normalise``, then ``transfer`` with the whole budget as the step);
    the previous allocation, unchanged, while a tenant with slots in transit is unobserved.
    ``target_name`` names the target in the move reasons ("its static cap"), ``settled`` the
    hold reason once every cap is at its target. The static policy's rule; the benchmark's
    foresight reference (bench/budget/foresight.py) moves with it too."""
    config = state.config
    observed = fresh_observations(state, stale_after_s)
    caps, decisions = normalise(config, state.previous, observed, targets)
    if not decisions and (held := _hold_in_transit(state, observed, policy)) is not None:
        return held
    receivers = [n for n in config.names if targets[n] > caps[n]]
    why = {n: f"{n} below {target_name} {targets[n]}" for n in receivers}
    caps, limits, moves = transfer(config, caps, _prev_limits(state, caps, decisions), observed, targets,
                                   receivers, config.total, why)
    decisions += moves
    if not any(d.kind == "move" for d in decisions):
        decisions.append(Decision("hold", settled if not receivers else "waiting for slots to free"))
    memory = state.previous.memory() if state.previous else {}
    return Allocation(_next_revision(state), config.total, caps, limits, policy, state.now_s,
                      tuple(decisions), targets, **memory)


@dataclass(frozen=True)
class DynamicParams:
    """Tuning of the dynamic controller (defaults used by the service and the benchmark)."""

    #: per-tick bound on a receiver's gain, as a fraction of B (at least 1 slot)
    step_frac: float = 0.25
    #: a receiver must be at least this many slots below target (hysteresis in size)
    min_move_slots: int = 2
    #: slots kept above the demand envelope, as a fraction of it
    headroom_frac: float = 0.10
    #: per-tick decay of the demand envelope (0: none kept, 1: never decays). 0.25 was chosen
    #: over 0.5 on bench/budget workload seeds 1-3 (better throughput and bursty-tenant p99);
    #: the reported benchmark uses other seeds
    release_per_tick: float = 0.25
    #: weight multiplier for a tenant whose SLO violation is due to admission
    slo_boost: float = 4.0
    #: engine KV use at or above which latency counts as load-driven
    kv_saturation_frac: float = 0.98
    #: reports older than this (relative to the tick) are ignored
    stale_after_s: float = 10.0
    #: burst reserve: a tenant keeps at least this fraction of its burst peak (its largest
    #: demand, up to its static share, in its recent active periods) as target, so slots it
    #: will need at its next burst are not lent to a tenant whose requests would hold them past
    #: the burst's start (0: no reserve, the controller of the budget-controller study)
    burst_reserve_frac: float = 1.0
    #: the burst peak is kept while the tenant has been idle at most this long, then decays by
    #: ``release_per_tick`` per tick (a tenant idle for longer is not expected back soon)
    burst_memory_s: float = 30.0
    #: gap lending: the reserve of an idle tenant is lent while its shortest observed idle gap
    #: lasts at least the horizon beyond the next tick; then it is called back, so it is free
    #: again when the tenant's burst is due. The horizon is what the tenant's call-backs took,
    #: and until one has been measured the borrowers' reported p99 slot hold, never less than
    #: this (~5 s: a 512-token request at full batch on qwen2.5-3b-h200). 0: never lent
    lend_horizon_s: float = 5.0
    #: fraction of an idle tenant's reserve lent during gap lending
    lend_frac: float = 1.0
    #: p99 guard: a tenant with a p99 SLO whose reported p99 exceeds this fraction of it
    #: lends nothing of its static share (its reserve is its whole static share)
    slo_guard_frac: float = 0.8
    #: burst reserve headroom in standard deviations of a Poisson count: the peak is sampled
    #: once a tick, a few times per burst, and the requests in flight during a burst of
    #: Poisson arrivals are a Poisson count, so the reserve is the peak plus the larger of the
    #: envelope's headroom and ``reserve_z * sqrt(peak)`` (1.65: the one-sided 95 % point).
    #: With 10 % alone, a peak of 36 sampled in a tenant's first burst kept 40 of its 48 and
    #: B's 2,048-token requests took the rest for 17 s (the bursty tenant's p99 +7.8 %)
    reserve_z: float = 1.65

    def __post_init__(self) -> None:
        if not 0 < self.step_frac <= 1:
            raise ValueError("step_frac must be in (0, 1]")
        if self.min_move_slots < 1:
            raise ValueError("min_move_slots must be >= 1")
        if self.headroom_frac < 0 or not 0 <= self.release_per_tick <= 1:
            raise ValueError("headroom_frac must be >= 0 and release_per_tick in [0, 1]")
        if self.slo_boost < 1 or self.stale_after_s <= 0:
            raise ValueError("slo_boost must be >= 1 and stale_after_s > 0")
        if not 0 <= self.burst_reserve_frac <= 1 or self.burst_memory_s < 0 or self.lend_horizon_s < 0:
            raise ValueError("burst_reserve_frac must be in [0, 1], burst_memory_s and lend_horizon_s >= 0")
        if self.slo_guard_frac <= 0 or not 0 <= self.lend_frac <= 1:
            raise ValueError("slo_guard_frac must be > 0 and lend_frac in [0, 1]")
        if not 0 <= self.reserve_z <= 10:
            raise ValueError("reserve_z must be in [0, 10]")

    def headroom(self, envelope: int) -> int:
        """Slots kept above a demand envelope (0 for an idle tenant)."""
        if envelope <= 0:
            return 0
        return math.ceil(self.headroom_frac * envelope)

    def reserve_headroom(self, peak: int) -> int:
        """Slots kept above a burst peak (module docstring, ``reserve_z``)."""
        return max(self.headroom(peak), math.ceil(self.reserve_z * math.sqrt(max(0, peak))))

    def step_slots(self, total: int) -> int:
        return max(1, math.ceil(self.step_frac * total))


class DynamicPolicy:
    """Zero-sum, demand-driven reallocation (module docstring)."""

    name = "dynamic"

    def __init__(self, params: DynamicParams | None = None) -> None:
        self.params = params or DynamicParams()

    def reallocate(self, state: BudgetState) -> Allocation:
        p, config = self.params, state.config
        names, floors = config.names, {t.name: t.floor for t in config.tenants}
        observed = fresh_observations(state, p.stale_after_s)
        initial = static_targets(config) if state.previous is None else {}
        caps, decisions = normalise(config, state.previous, observed, initial)
        if not decisions and (held := _hold_in_transit(state, observed, self.name)) is not None:
            return held
        prev = state.previous
        prev_env = prev.demand_envelope if prev else {}
        env = {n: self._envelope(observed[n].demand, prev_env.get(n)) if n in observed else prev_env.get(n, 0)
               for n in names}
        kv = state.cluster.kv_usage_frac
        saturated = kv is not None and kv >= p.kv_saturation_frac
        boosted, notes = self._slo(config, observed, caps, saturated)
        weights = {t.name: t.weight * (p.slo_boost if t.name in boosted else 1.0) for t in config.tenants}
        share = static_targets(config)
        peak, idle, gaps = self._burst_memory(state, observed, share)
        horizon = self._horizons(config, observed, caps, prev)
        reserve, guarded, lending, full = self._reserve(config, observed, share, peak, idle, gaps, horizon)
        for n in guarded:
            notes[n] = notes.get(n, "") + f"; p99 guard: keeps its static share {reserve[n]}"
        if boosted:  # an admission-limited SLO violation outranks other tenants' reserves
            reserve = {n: reserve[n] if n in boosted else 0 for n in names}
        targets = self._targets(config, caps, observed, env, weights, reserve)
        step = p.step_slots(config.total)
        # receivers: unmet demand, or a reserve called back (the tenant is below it)
        recall = {n for n in observed if caps[n] < reserve[n] and observed[n].demand <= caps[n]}
        receivers = sorted(
            (n for n in observed
             if (observed[n].demand > caps[n] or n in recall) and targets[n] - caps[n] >= p.min_move_slots),
            key=lambda n: (n not in boosted, n in recall, caps[n] / weights[n], n),
        )
        why = {n: (f"{n} has {observed[n].waiting} waiting (demand {observed[n].demand}, cap {caps[n]}, "
                   f"target {targets[n]}){notes.get(n, '')}") if n not in recall else
               (f"{n} calls back its burst reserve {reserve[n]} (cap {caps[n]}, idle "
                f"{idle[n] / 1000:.0f} s of its shortest gap {gaps.get(n, 0) / 1000:.0f} s)")
               for n in receivers}
        # a call-back restores the reserve, no more: the rest of the target needs demand
        moving = {n: min(targets[n], reserve[n]) if n in recall else targets[n] for n in names}
        before = dict(caps)
        caps, limits, moves = transfer(config, caps, _prev_limits(state, caps, decisions), observed, moving,
                                       receivers, step, why)
        decisions += moves
        if not any(d.kind == "move" for d in decisions):
            decisions.append(Decision("hold", self._hold_reason(config, caps, observed, targets, moves, notes)))
        assert all(caps[n] >= floors[n] and limits[n] >= floors[n] for n in names)
        since, took = self._recall_memory(state, observed, before, caps, full, recall, lending)
        return Allocation(_next_revision(state), config.total, caps, limits, self.name, state.now_s,
                          tuple(decisions), targets, env, peak, idle, gaps, since, took)

    def _horizons(
        self, config: BudgetConfig, observed: Mapping[str, TenantObservation], caps: Mapping[str, int],
        prev: Allocation | None,
    ) -> dict[str, int]:
        """Per tenant, how long (ms) after a call-back of its lent reserve starts the slots are
        back: what its own completed call-backs took (``recall_ms``, learned), else the prior,
        the longest p99 slot hold reported by a tenant that would borrow (one with unmet demand),
        and never less than ``lend_horizon_s``. A borrower's request keeps a lent slot until it
        ends, so a fixed horizon lends slots to requests that outlast the lender's gap whenever
        the borrowers' requests are long (2,048-token requests: the lender's p99 ×11,
        docs/benchmarks.md#budget). A learned time stands only while the prior is at most
        ``RECALL_TRUST`` times it: borrowers whose requests have grown longer than that since
        (the hold is reported every second, a call-back is timed once a gap) get the prior."""
        learned = prev.recall_ms if prev else {}
        holds = [o.p99_hold_s for o in observed.values()
                 if o.p99_hold_s is not None and o.demand > caps.get(o.tenant, 0)]
        prior = round(1000 * max([self.params.lend_horizon_s, *holds]))
        return {n: learned[n] if n in learned and prior <= RECALL_TRUST * learned[n] else prior
                for n in config.names}

    @staticmethod
    def _recall_memory(
        state: BudgetState, observed: Mapping[str, TenantObservation], before: Mapping[str, int],
        caps: Mapping[str, int], full: Mapping[str, int], recall: set[str], lending: list[str],
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Call-backs in progress (since when) and how long completed ones took: a call-back
        starts at the tick that first calls back at least half of a lender's reserve (what gap
        lending lends; a borrower returns a few slots sooner than many, so smaller call-backs
        would understate the horizon) and ends at the first tick whose caps give the lender its
        whole reserve again (measured in ticks: an upper bound). The learned duration rises at
        once to a longer call-back and moves halfway toward a shorter one."""
        prev = state.previous
        since = dict(prev.recall_since_ms) if prev else {}
        took = dict(prev.recall_ms) if prev else {}
        now_ms = round(1000 * state.now_s)
        for n in state.config.names:
            if n not in observed:
                continue
            if n in lending:
                since.pop(n, None)
            elif n in since and caps[n] >= full[n]:
                d = max(0, now_ms - since.pop(n))
                took[n] = d if n not in took else max(d, (took[n] + d) // 2)
            elif n in recall and n not in since and 2 * (full[n] - before[n]) >= full[n] > 0:
                if caps[n] >= full[n]:  # called back within this tick: the slots were unused
                    took[n] = 0 if n not in took else took[n] // 2
                else:
                    since[n] = now_ms
        return since, took

    def _burst_memory(
        self, state: BudgetState, observed: Mapping[str, TenantObservation], share: Mapping[str, int],
    ) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Per tenant: burst peak, idle time and shortest completed idle gap (model docstring).
        The peak is the largest demand up to the static share while the tenant has been idle at
        most ``burst_memory_s``; then it decays by ``release_per_tick`` per tick. Idle time
        counts from the tenant's first demand (-1 before it). Unobserved tenants keep their memory. A tenant not seen before starts at its whole static share:
        until it has shown a burst, the controller cannot know how much it needs."""
        config, prev = state.config, state.previous
        prev_peak = prev.burst_peak if prev else {}
        prev_idle = prev.idle_ms if prev else {}
        gaps = dict(prev.min_gap_ms) if prev else {}
        dt_ms = max(0, round(1000 * (state.now_s - prev.computed_at_s))) if prev else 0
        peak: dict[str, int] = {}
        idle: dict[str, int] = {}
        for n in config.names:
            # idle -1: never seen busy (time before a tenant's first request is not a gap)
            old_peak, old_idle = prev_peak.get(n, share[n]), prev_idle.get(n, -1)
            obs = observed.get(n)
            if obs is None:
                peak[n], idle[n] = old_peak, old_idle
                continue
            if obs.demand > 0:
                if old_idle > 0:  # a gap ended: remember the shortest (what was surely idle:
                    # from the first tick that saw it idle to the last one)
                    gap = max(0, old_idle - dt_ms)
                    gaps[n] = min(gaps.get(n, gap), gap)
                idle[n] = 0
            else:
                idle[n] = old_idle + dt_ms if old_idle >= 0 else -1
            if old_idle < 0 <= idle[n]:  # its first demand replaces the cold-start guess
                kept = 0
            elif idle[n] <= 1000 * self.params.burst_memory_s:
                kept = old_peak
            else:
                kept = math.floor(old_peak * self.params.release_per_tick)
            peak[n] = max(min(obs.demand, share[n]), kept)
        return peak, idle, gaps

    def _reserve(
        self, config: BudgetConfig, observed: Mapping[str, TenantObservation], share: Mapping[str, int],
        peak: Mapping[str, int], idle: Mapping[str, int], gaps: Mapping[str, int], horizon: Mapping[str, int],
    ) -> tuple[dict[str, int], list[str], list[str], dict[str, int]]:
        """Slots each tenant keeps whatever its current demand: ``burst_reserve_frac`` of its
        burst peak plus headroom, never above its static share (its whole share until it has shown a gap);
        its whole static share under the p99 guard; nothing while it is idle early enough in its
        shortest known gap (gap lending). The gap is what was surely idle, from the first tick
        that saw the tenant idle to the last one, so idle - dt of it has passed (``idle`` counts the
        tick interval dt before the first idle tick too); lent slots are refilled until the next
        tick, about dt away, and the call-back that starts then has the slots back ``horizon``
        later (``_horizons``): lent while gap - (idle - dt) >= dt + horizon, i.e. gap - idle >=
        horizon. (Until 2026-12-03 dt was subtracted once more: lending stopped a tick earlier
        than the gap required; until later that day the horizon was the fixed ``lend_horizon_s``.)
        Returns (reserve, guarded tenants, lending tenants, reserve before lending)."""
        p = self.params
        # until a tenant has shown one whole burst and gap, its pattern is unknown: it keeps its share
        # the peak is sampled once a tick and misses what happens between ticks: it gets the same
        # headroom as a demand envelope
        reserve = {n: min(share[n], math.ceil(p.burst_reserve_frac * (
            peak[n] + p.reserve_headroom(peak[n]) if n in gaps else share[n]))) for n in config.names}
        guarded, lending = [], []
        for t in config.tenants:
            n, obs = t.name, observed.get(t.name)
            if (t.p99_slo_s is not None and obs is not None and obs.p99_latency_s is not None
                    and obs.p99_latency_s > p.slo_guard_frac * t.p99_slo_s):
                reserve[n] = share[n]
                guarded.append(n)
        full = dict(reserve)
        for t in config.tenants:
            n, obs = t.name, observed.get(t.name)
            if (p.lend_horizon_s > 0 and n not in guarded and obs is not None and obs.demand == 0 and idle[n] > 0
                    and n in gaps and gaps[n] - idle[n] + LEND_JITTER_MS >= horizon[n]):
                reserve[n] = math.floor((1 - p.lend_frac) * reserve[n])
                lending.append(n)
        return reserve, guarded, lending, full

    def _envelope(self, demand: int, previous: int | None) -> int:
        if previous is None:
            return demand
        return max(demand, math.floor(previous * self.params.release_per_tick))

    def _slo(
        self, config: BudgetConfig, observed: Mapping[str, TenantObservation], caps: Mapping[str, int],
        saturated: bool,
    ) -> tuple[set[str], dict[str, str]]:
        boosted: set[str] = set()
        notes: dict[str, str] = {}
        for t in config.tenants:
            obs = observed.get(t.name)
            if obs is None or t.p99_slo_s is None or obs.p99_latency_s is None or obs.p99_latency_s <= t.p99_slo_s:
                continue
            head = f"; SLO violated (p99 {obs.p99_latency_s:.2f} s > {t.p99_slo_s:.2f} s)"
            if saturated:
                notes[t.name] = head + ", load-driven: engine KV saturated, no boost"
            elif obs.demand <= caps[t.name]:
                notes[t.name] = head + ", load-driven: nothing held at admission, no boost"
            else:
                boosted.add(t.name)
                notes[t.name] = head + f", admission-limited: weight x{self.params.slo_boost:g}, served first"
        return boosted, notes

    def _targets(
        self, config: BudgetConfig, caps: Mapping[str, int], observed: Mapping[str, TenantObservation],
        env: Mapping[str, int], weights: Mapping[str, float], reserve: Mapping[str, int],
    ) -> dict[str, int]:
        floors = {t.name: t.floor for t in config.tenants}
        targets = {n: caps[n] for n in config.names if n not in observed}
        share = config.total - sum(targets.values())
        live = sorted(observed)
        if not live:
            return targets
        # reserves are at most static shares (which sum to B); they give way to floors only
        # when unobserved tenants hold more than their own shares
        lower = {n: max(floors[n], reserve[n]) for n in live}
        if sum(lower.values()) > share:
            lower = {n: floors[n] for n in live}
        want = {n: max(lower[n], env[n] + self.params.headroom(env[n])) for n in live}
        if sum(want.values()) >= share:
            targets.update(water_fill(share, {n: weights[n] for n in live}, lower, want))
            return targets
        leftover = share - sum(want.values())
        for n in live:  # slots nobody wants stay with their holders: no move without demand
            keep = min(leftover, max(0, caps[n] - want[n]))
            targets[n] = want[n] + keep
            leftover -= keep
        return targets

    @staticmethod
    def _hold_reason(
        config: BudgetConfig, caps: Mapping[str, int], observed: Mapping[str, TenantObservation],
        targets: Mapping[str, int], drains: list[Decision], notes: Mapping[str, str],
    ) -> str:
        if drains:
            return "waiting for drained slots to free: " + "; ".join(
                f"{d.from_tenant} drains {d.slots} for {d.to_tenant}" for d in drains if d.kind == "drain")
        unmet = [n for n in config.names if n in observed and observed[n].demand > caps[n]]
        if not unmet:
            missing = [n for n in config.names if n not in observed]
            if not observed:
                return "no fresh demand reports: caps held"
            tail = f" ({', '.join(missing)} unobserved)" if missing else ""
            return "no tenant has unmet demand" + tail
        parts = []
        for n in unmet:
            gap = targets[n] - caps[n]
            state = "at its fair share" if gap <= 0 else f"{gap} below target, within hysteresis"
            parts.append(f"{n} has {observed[n].waiting} waiting, cap {caps[n]} {state}{notes.get(n, '')}")
        return "; ".join(parts)
