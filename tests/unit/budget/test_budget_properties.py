"""Property tests of the budget controller over arbitrary demand sequences.

A hypothesis state machine drives the router model (tests/unit/budget/budget_model.py)
with random demand, completions, latency reports and missing reports, and checks after
every tick: the caps sum to B; caps and limits respect floors; a cap shrinks only by
slots its tenant is not using (no preemption), so in-flight never exceeds caps or B; a
tenant without unmet demand gains only to call back its burst reserve (never above its
static share; dynamic); a receiver gains at most one step per tick; the static policy never
moves; reallocation is deterministic.

The adversarial case of issue 19 — a tenant that alternates idle and flood every 4 s against
the 2 s tick — is checked on its own: Σ caps = Σ limits = B at every tick, nothing is
preempted, and the flooding tenant never loses slots of its static share (its idle gaps are
too short to lend its burst reserve).
"""

from __future__ import annotations

import math

from budget_model import RouterModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from services.budget.core import (
    BudgetConfig,
    BudgetState,
    ClusterObservation,
    DynamicParams,
    TenantConfig,
    make_policy,
    static_targets,
)

NAMES = ("a", "b", "c", "d")


@st.composite
def configs(draw: st.DrawFn, min_tenants: int = 1, max_total: int = 120) -> BudgetConfig:
    n = draw(st.integers(min_tenants, 4))
    total = draw(st.integers(max(n, 2), max_total))
    floors = [draw(st.integers(0, max(0, total // (2 * n)))) for _ in range(n)]
    weights = [draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])) for _ in range(n)]
    slos = [draw(st.one_of(st.none(), st.sampled_from([0.5, 2.0]))) for _ in range(n)]
    tenants = tuple(TenantConfig(NAMES[i], floors[i], weights[i], slos[i]) for i in range(n))
    return BudgetConfig(total, tenants)


class BudgetMachine(RuleBasedStateMachine):
    policy_name = "dynamic"

    @initialize(config=configs())
    def setup(self, config: BudgetConfig) -> None:
        self.params = DynamicParams()
        self.model = RouterModel(config, make_policy(self.policy_name, self.params))
        self.step = self.params.step_slots(config.total)
        self.share = static_targets(config)
        self.model.tick()
        self.first_caps = dict(self.model.allocation.caps)  # type: ignore[union-attr]

    @rule(data=st.data())
    def tick(self, data: st.DataObject) -> None:
        m = self.model
        cfg = m.config
        for name in cfg.names:
            m.finish(name, data.draw(st.integers(0, m.in_flight[name]), label=f"finish {name}"))
            m.set_demand(name, data.draw(st.sampled_from([0, 0, 1, 3, cfg.total // 2, 2 * cfg.total]) |
                                         st.integers(0, 2 * cfg.total), label=f"demand {name}"))
        m.admit()
        p99 = {n: data.draw(st.sampled_from([0.1, 1.0, 5.0]), label=f"p99 {n}") for n in cfg.names}
        skip = frozenset(data.draw(st.sets(st.sampled_from(cfg.names), max_size=1), label="unreported"))
        kv = data.draw(st.sampled_from([None, 0.5, 0.99]), label="kv")
        before = dict(m.allocation.caps)  # type: ignore[union-attr]
        before_limits = dict(m.allocation.limits)  # type: ignore[union-attr]
        observed = m.observations(p99, skip)
        state = BudgetState(m.now_s, cfg, observed, m.allocation, ClusterObservation(kv))
        after = m.tick(p99, skip, kv)
        assert after == m.policy.reallocate(state), "not deterministic"
        floors = {t.name: t.floor for t in cfg.tenants}
        frozen = any(before[n] != before_limits[n] for n in skip)
        if frozen:
            assert dict(after.caps) == before and dict(after.limits) == before_limits, "must hold"
            return
        for n in cfg.names:
            obs = observed.get(n)
            in_flight = obs.in_flight if obs is not None else before[n]
            # no preemption: only unused slots leave a tenant, and what it runs is its own
            assert after.caps[n] >= min(before[n], max(floors[n], in_flight)), (n, before, dict(after.caps))
            if obs is not None:
                assert after.caps[n] >= obs.in_flight, "in-flight requests not settled into the cap"
            if n in skip:
                assert after.caps[n] == before[n], "an unobserved tenant must be held"
            if self.policy_name == "dynamic":
                could = max(before_limits[n], before[n]) + self.step
                assert after.limits[n] <= could and after.caps[n] <= could, "a receiver gained more than one step"
                if obs is None or obs.demand <= before[n]:  # only a burst reserve is called back
                    bound = before[n] if obs is None else max(before[n], self.share[n])
                    assert after.caps[n] <= bound, f"{n} gained without unmet demand"
                    assert after.limits[n] <= bound, f"{n} was promised slots without unmet demand"
            else:
                assert after.caps[n] == self.first_caps[n], "static caps moved"

    @invariant()
    def budget_invariants(self) -> None:
        m = self.model
        alloc = m.allocation
        assert alloc is not None
        assert sum(alloc.caps.values()) == m.config.total == sum(alloc.limits.values())
        for t in m.config.tenants:
            assert t.floor <= alloc.limits[t.name] and t.floor <= alloc.caps[t.name]
            assert m.in_flight[t.name] <= max(alloc.caps[t.name], alloc.limits[t.name])
        assert sum(m.in_flight.values()) <= m.config.total, "more requests in flight than the budget"


class StaticMachine(BudgetMachine):
    policy_name = "static"


TestDynamicBudget = BudgetMachine.TestCase
TestDynamicBudget.settings = settings(max_examples=60, stateful_step_count=25, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
TestStaticBudget = StaticMachine.TestCase
TestStaticBudget.settings = settings(max_examples=20, stateful_step_count=15, deadline=None)


def _reference_share(total: int, weights: dict[str, float], lower: dict[str, int], upper: dict[str, int],
                     name: str) -> float:
    """Real-valued weighted max-min share of ``name`` by bisection (independent of the core)."""
    lo, hi = 0.0, float(total) / min(weights.values()) + 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        used = sum(min(max(mid * weights[n], lower[n]), upper[n]) for n in weights)
        lo, hi = (mid, hi) if used < total else (lo, mid)
    return min(max(lo * weights[name], lower[name]), upper[name])


V0 = DynamicParams(burst_reserve_frac=0.0, lend_horizon_s=0.0, slo_guard_frac=1e9)


@settings(max_examples=40, deadline=None)
@given(config=configs(min_tenants=2), data=st.data(), v0=st.booleans())
def test_busy_tenant_regains_floor_at_once_and_fair_share_within_bound(config: BudgetConfig,
                                                                        data: st.DataObject, v0: bool) -> None:
    """``v0`` (no reserve): the weighted max-min share within the bound. Default controller:
    at least the smaller of that and its static share (idle tenants keep burst reserves)."""
    params = V0 if v0 else DynamicParams()
    model = RouterModel(config, make_policy("dynamic", params))
    names = config.names
    busy = data.draw(st.sampled_from(names), label="busy tenant")
    # an arbitrary history in which the busy tenant is idle
    for _ in range(data.draw(st.integers(1, 6), label="warm-up ticks")):
        for n in names:
            model.finish(n, data.draw(st.integers(0, model.in_flight[n])))
            model.set_demand(n, 0 if n == busy else data.draw(st.integers(0, 2 * config.total)))
        model.tick()
    model.finish(busy, model.in_flight[busy])
    others = {n: data.draw(st.integers(0, 2 * config.total), label=f"demand {n}") for n in names if n != busy}
    demand = 2 * config.total
    model.set_demand(busy, demand)
    model.admit()
    floor = config.tenant(busy).floor
    assert model.in_flight[busy] >= min(floor, demand), "floor not available at once"
    # requests are short: every in-flight request finishes within a tick and is refilled
    step = params.step_slots(config.total)
    ticks = math.ceil(math.log2(2 * config.total + 1)) + math.ceil(config.total / step) + 3
    for _ in range(ticks):
        for n in names:
            model.finish(n, model.in_flight[n])
            model.set_demand(n, demand if n == busy else others[n])
        model.tick()
    weights = {t.name: t.weight for t in config.tenants}
    lower = {t.name: t.floor for t in config.tenants}
    upper = {n: max(lower[n], (d := demand if n == busy else others[n]) + math.ceil(params.headroom_frac * d))
             for n in names}
    if sum(upper.values()) <= config.total:
        expected = float(upper[busy])
    else:
        expected = _reference_share(config.total, weights, lower, upper, busy)
    if not v0:
        expected = min(expected, float(static_targets(config)[busy]))
    cap = model.allocation.caps[busy]  # type: ignore[union-attr]
    assert cap >= math.floor(expected) - params.min_move_slots, (cap, expected, dict(model.allocation.caps))  # type: ignore[union-attr]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(min_tenants=2), data=st.data())
def test_adversarial_idle_flood_every_4s_keeps_the_budget_and_the_flooders_share(config: BudgetConfig,
                                                                                  data: st.DataObject) -> None:
    """Issue 19's adversarial tenant: idle 4 s, flood (demand 2B) 4 s, against a 2 s tick,
    with a random phase; the other tenants' demand, completions and p99 are arbitrary."""
    config = BudgetConfig(config.total, tuple(TenantConfig(t.name, t.floor, t.weight) for t in config.tenants))
    model = RouterModel(config, make_policy("dynamic"))
    names = config.names
    x = data.draw(st.sampled_from(names), label="flooding tenant")
    phase = data.draw(st.integers(0, 3), label="phase (ticks)")
    share = static_targets(config)
    floors = {t.name: t.floor for t in config.tenants}
    model.tick()
    for i in range(24):  # 48 s: six idle/flood cycles
        flood = (i + phase) % 4 >= 2
        for n in names:
            model.finish(n, data.draw(st.integers(0, model.in_flight[n]), label="finish"))
            if n == x:
                model.set_demand(n, 2 * config.total if flood else 0)
            else:
                model.set_demand(n, data.draw(st.sampled_from([0, 1, config.total // 2, 2 * config.total])))
        before = dict(model.allocation.caps)  # type: ignore[union-attr]
        model.admit()
        in_flight = dict(model.in_flight)
        alloc = model.tick(p99={n: data.draw(st.sampled_from([0.1, 5.0]), label="p99") for n in names})
        assert sum(alloc.caps.values()) == config.total == sum(alloc.limits.values()), "Σ caps = B broken"
        for n in names:
            assert alloc.caps[n] >= floors[n] and alloc.limits[n] >= floors[n]
            assert alloc.caps[n] >= min(before[n], max(floors[n], in_flight[n])), "preempted"
        assert sum(model.in_flight.values()) <= config.total
        assert alloc.caps[x] >= share[x], (i, flood, dict(alloc.caps), share)
        assert alloc.min_gap_ms.get(x, 0) <= 4000, "a 4 s idle period is at most a 4 s gap"
