"""The DP equals brute force of the lexicographic objective; the approximate path is feasible
and under its upper bound; the knapsacks are exact."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_brute import brute_force

from services.planner.core.approx import knapsack, knapsack_value, relative_gap, solve_greedy, upper_bound
from services.planner.core.dp import DpBudget, Instance, costs_in_units, solve_exact
from services.planner.core.sparse import solve_sparse
from services.planner.core.values import Values


def fast(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw: st.DrawFn, scale: int = 1, budgets: tuple[int, ...] = (8, 16, 64, 1 << 17)
              ) -> tuple[Instance, DpBudget]:
    """Small instances full of ties: zero capacities, zero footprints, sessions that fit
    nowhere, unhealthy replicas, cloned (cache-equivalent) replicas, tiny state budgets.
    Hypothesis picks the shape and a seed; numpy fills the contents (fast to generate)."""
    m = draw(st.integers(0, 6))
    n = draw(st.integers(1, 3))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    foot = np.array([rng.choice((0, 1, 2, 3, 4, 5, 8, 13, 30)) for _ in range(m)], dtype=np.int64)
    free = np.array([rng.choice((0, 1, 3, 5, 8, 13, 21)) for _ in range(n)], dtype=np.int64)
    credit = np.array([rng.choice((0, 0, 0, 1, 2, 5)) for _ in range(m * n)], dtype=np.int64).reshape(m, n)
    if n > 1 and draw(st.booleans()):  # clones: equal capacity and credit columns
        free[:] = free[0]
        credit[:, :] = credit[:, :1]
    ready = np.array([rng.randint(0, 1) for _ in range(m)], dtype=np.int64)
    healthy = np.array([rng.random() < 0.85 for _ in range(n)], dtype=np.bool_)
    eligible = np.repeat(healthy[None, :], m, axis=0)
    budget = DpBudget(state_budget=draw(st.sampled_from(budgets)), work_budget=10**9,
                      memory_budget=10**9, min_resolution=1)
    values = Values(credit=credit * scale, ready=ready, footprint=foot * scale)
    return Instance(values=values, free_tokens=free * scale, eligible=eligible), budget


def _check_exact(inst: Instance, budget: DpBudget) -> None:
    res = solve_exact(inst, budget)
    assert res is not None
    v, u = inst.values, res.units_tokens
    constrained = u > 0
    # The discretised problem: per-replica units; unconstrained replicas keep tokens.
    cost = np.where(constrained[None, :], costs_in_units(v.footprint, u), v.footprint[:, None])
    caps = np.where(constrained, inst.free_tokens // np.maximum(u, 1), inst.free_tokens)
    elig = inst.eligible & (v.footprint[:, None] <= inst.free_tokens[None, :]) & (cost <= caps[None, :])
    # The returned plan is feasible in units (hence in tokens) and only uses eligible pairs.
    load = np.zeros_like(caps)
    tokens = np.zeros_like(caps)
    for i, j in enumerate(res.choice.tolist()):
        if j >= 0:
            assert elig[i, j]
            load[j] += cost[i, j]
            tokens[j] += v.footprint[i]
    assert (load <= caps).all()
    assert (tokens <= inst.free_tokens).all()
    assert res.objective == brute_force(v, elig, cost, caps)


@fast(2000)
@given(instances())
def test_dp_equals_brute_force(case: tuple[Instance, DpBudget]) -> None:
    _check_exact(*case)


@fast(300)
@given(instances(scale=10**9, budgets=(8, 16, 64)))
def test_dp_exact_beyond_int64_codes(case: tuple[Instance, DpBudget]) -> None:
    """Huge token counts push the mixed-radix codes past int64: the object-array path."""
    _check_exact(*case)


@fast(600)
@given(instances())
def test_sparse_dp_is_the_optimum_in_tokens(case: tuple[Instance, DpBudget]) -> None:
    """The reachable-state DP at u = 1 solves the real (undiscretised) problem exactly."""
    inst, _ = case
    res = solve_sparse(inst)
    assert res is not None and res.exact_tokens
    v = inst.values
    elig = inst.eligible & (v.footprint[:, None] <= inst.free_tokens[None, :])
    load = np.zeros_like(inst.free_tokens)
    for i, j in enumerate(res.choice.tolist()):
        if j >= 0:
            assert elig[i, j]
            load[j] += v.footprint[i]
    assert (load <= inst.free_tokens).all()
    assert res.objective == brute_force(v, elig, v.footprint, inst.free_tokens)


def test_sparse_dp_gives_up_on_large_pools() -> None:
    rng = np.random.default_rng(1)
    m, n = 300, 4
    v = Values(credit=rng.integers(0, 100, (m, n)), ready=rng.integers(0, 2, m), footprint=rng.integers(50, 500, m))
    assert solve_sparse(Instance(v, rng.integers(1000, 5000, n), np.ones((m, n), dtype=np.bool_))) is None


def test_token_resolution_when_the_budget_allows() -> None:
    v = Values(credit=np.array([[3, 0], [0, 4], [1, 1]]), ready=np.array([1, 0, 1]),
               footprint=np.array([5, 7, 4]))
    inst = Instance(v, np.array([9, 7]), np.ones((3, 2), dtype=np.bool_))
    res = solve_exact(inst)
    assert res is not None and res.exact_tokens and res.unit_tokens <= 1
    # s0 on r0 (k=3) and s1 on r1 (k=4); s2 fits in r0's leftover 4 tokens (k=1): Σk = 8.
    assert res.objective == (8, 2, 16)
    assert res.choice.tolist() == [0, 1, 0]


def test_lexicographic_not_weighted() -> None:
    """One credit token beats any amount of readiness and footprint."""
    v = Values(credit=np.array([[1], [0], [0]]), ready=np.array([0, 1, 1]), footprint=np.array([10, 5, 5]))
    res = solve_exact(Instance(v, np.array([10]), np.ones((3, 1), dtype=np.bool_)))
    assert res is not None and res.choice.tolist() == [0, -1, -1]


def test_budget_too_small_returns_none() -> None:
    rng = np.random.default_rng(0)
    m, n = 40, 12
    v = Values(credit=rng.integers(0, 100, (m, n)), ready=rng.integers(0, 2, m), footprint=rng.integers(50, 500, m))
    inst = Instance(v, rng.integers(1000, 5000, n), np.ones((m, n), dtype=np.bool_))
    assert solve_exact(inst, DpBudget(state_budget=1000, min_resolution=8)) is None


@fast(400)
@given(instances())
def test_approximate_plan_is_feasible_and_under_its_bound(case: tuple[Instance, DpBudget]) -> None:
    inst, _ = case
    res = solve_greedy(inst)
    v = inst.values
    elig = inst.eligible & (v.footprint[:, None] <= inst.free_tokens[None, :])
    load = np.zeros_like(inst.free_tokens)
    for i, j in enumerate(res.choice.tolist()):
        if j >= 0:
            assert elig[i, j]
            load[j] += v.footprint[i]
    assert (load <= inst.free_tokens).all()
    optimum = brute_force(v, elig, v.footprint, inst.free_tokens)
    bound = upper_bound(v, inst.free_tokens, inst.eligible)
    # Each bound component bounds its own sum over every feasible plan, so also the optimum's.
    assert all(o <= b for o, b in zip(optimum, bound, strict=True)), (optimum, bound)
    assert res.objective <= optimum
    assert all(0.0 <= g <= 1.0 for g in relative_gap(res.objective, bound))


def test_knapsacks_match_enumeration() -> None:
    """Up to 12 items, so the Dembo–Hammer reduction (8 items and more) is exercised too."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(0, 13))
        cap = int(rng.integers(0, 40))
        vals = rng.integers(0, 30, n).astype(np.int64)
        costs = rng.integers(0, 12, n).astype(np.int64)
        masks = np.array(list(itertools.product((False, True), repeat=n)), dtype=np.bool_).reshape(2**n, n)
        fits = masks @ costs <= cap
        best = int((masks[fits] @ vals).max())
        picked = knapsack(vals, costs, cap)
        assert len(set(picked)) == len(picked)
        assert int(costs[picked].sum()) <= cap
        assert int(vals[picked].sum()) == best
        assert knapsack_value(vals, costs, cap) == best


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_dp_runs_on_a_realistic_pool(seed: int) -> None:
    """A realistic 4-replica pool is solved by the DP (no fallback), with pruning at work, and
    the plan fits in tokens; small pools are solved at token resolution."""
    rng = np.random.default_rng(seed)
    m, n = 64, 4
    foot = np.exp(rng.uniform(np.log(4000), np.log(64000), m)).astype(np.int64)
    credit = np.where(rng.random((m, n)) < 0.25, rng.integers(1000, 30000, (m, n)), 0)
    v = Values(credit=credit, ready=(rng.random(m) < 0.3).astype(np.int64), footprint=foot)
    free = rng.integers(20000, 250000, n)
    res = solve_exact(Instance(v, free, np.ones((m, n), dtype=np.bool_)))
    assert res is not None and res.states > 1 and res.pruned_pairs > 0
    load = np.bincount(res.choice[res.choice >= 0], weights=foot[res.choice >= 0], minlength=n)
    assert (load <= free).all()
    small = Values(credit=credit[:3], ready=v.ready[:3], footprint=foot[:3] // 1000)
    tiny = solve_exact(Instance(small, free // 1000, np.ones((3, n), dtype=np.bool_)))
    assert tiny is not None and tiny.exact_tokens
