"""Exact capacity-state dynamic program for selection + placement
(docs/algorithms.md#capacity-state-dp).

Problem (an ``Instance``): pool sessions i (rows) and replicas j (columns) with value
triples v(i, j), footprints f(i) and free capacities F(j) in tokens. Choose for every session
"skip" or one replica it is eligible for so that every replica's quantised capacity holds,
maximising (Σk, Σr, Σf) lexicographically.

Discretisation. Replica j has a unit of u_j tokens: it holds U_j = floor(F_j / u_j)
units and session i costs c_ij = ceil(f_i / u_j) there. A resolution R gives the largest
replica about R units and replica j about R·(F_j/F_max)² (see ``_quantise``); a replica whose
eligible sessions all fit together is unconstrained (u_j = 0: no state, no cost). A quantised plan is always
feasible in tokens (costs round up, capacities down). The DP is exact for this discretised
problem; rounding may exclude a plan that fits in tokens — the caller measures that
(``excluded_by_rounding``) and tops up. R is the finest resolution whose state space fits
``DpBudget``: states ≤ ``state_budget``, (eligible pairs after pruning) × states ≤
``work_budget`` and (sessions after pruning) × states ≤ ``memory_budget``. When the largest
replica would get fewer than ``min_resolution`` units, ``solve_exact`` returns None and the
caller uses the approximate method (approx.py). U_j is capped at the total cost of the
sessions eligible on j (capacity beyond that never binds), so roomy replicas cost few states
and small instances are solved at token resolution (u = 1).

Reductions, both exact for the discretised problem:
- Pair dominance. Session a dominates b *on replica j* when c_a ≤ c_b and v(a, j) ≥ v(b, j)
  (ties: smaller cost, then row order — a strict order). Exchange argument: while some
  admitted b on j has an unadmitted dominator a on j, putting a in b's place keeps the plan
  feasible and does not lower the objective (and raises a tie-break potential), so some
  optimal plan admits b on j only together with all its dominators on j. If their quantised
  footprints with b's exceed the total capacity Σ U_j·u, the pair (b, j) is dropped; all such
  pairs are dropped at once (they are all absent from that one optimal plan).
- Cache-equivalent replicas (same capacity, same credit and eligibility for every candidate)
  form a group whose state is the multiset of remaining units of its members.

State = remaining units per group (an N-d numpy array, one axis per group); value = best
mixed-radix code (values.encode_values); "budget" form, so every state starts at 0. Per
session the update is vectorised (a shifted slice per single replica, a gather per position
of a multiset group, then ``np.maximum``); the value table after each session is kept and the
plan is recovered by walking back through them.

Tie-breaking (deterministic): rows and columns are processed in the order given (the
policies sort sessions and replicas by id). Walking back from the last session, each session
takes the first option that reproduces the optimal value, in the order: skip, then groups by
their first replica, then multiset positions from the largest remaining budget; within a
group the lowest-index member holding that budget is used.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from services.planner.core.model import Objective
from services.planner.core.values import BoolArray, IntArray, Values, encode_values, objective_of


@dataclass(frozen=True, slots=True)
class Instance:
    """Rows = candidate sessions, columns = replicas; ``eligible`` already implies f ≤ free."""

    values: Values
    free_tokens: IntArray  # (n,) >= 0
    eligible: BoolArray  # (m, n)


SHARE_EXPONENT = 2.0  # replica j gets about R·(F_j / F_max)^SHARE_EXPONENT units


@dataclass(frozen=True, slots=True)
class DpBudget:
    """Limits that pick the resolution; see the module docstring."""

    state_budget: int = 1 << 15
    work_budget: int = 4_000_000
    memory_budget: int = 2_000_000  # kept value-table entries (8 bytes each)
    min_resolution: int = 8
    prune_limit: int = 40_000_000  # skip pruning when m² · n exceeds this


@dataclass(frozen=True, slots=True)
class DpResult:
    choice: npt.NDArray[np.int64]  # (m,) column or -1
    objective: Objective
    units_tokens: IntArray  # (n,) u_j; 0 = capacity never binds (every eligible session fits together)
    capacity_units: IntArray  # (n,) U_j (0 where unconstrained or unused)
    states: int
    pruned_pairs: int
    rounding_excluded: int  # (session, replica) pairs that fit in tokens but not in units
    exact_tokens: bool  # every constrained column has u = 1: the discretised problem is the real one

    @property
    def unit_tokens(self) -> int:
        """The coarsest unit in use (1 at token resolution, 0 when no capacity binds)."""
        return int(self.units_tokens.max()) if self.units_tokens.size else 0


def costs_in_units(footprint: IntArray, units: IntArray) -> IntArray:
    """ceil(f_i / u_j) per (i, j); 0 for unconstrained columns (u_j = 0)."""
    safe = np.maximum(units, 1)
    return np.where(units[None, :] > 0, -(-footprint[:, None] // safe[None, :]), 0).astype(np.int64)


def prune_pairs(codes: npt.NDArray[np.int64] | npt.NDArray[np.object_], cost: IntArray,
                eligible: BoolArray, units: IntArray, caps: IntArray) -> BoolArray:
    """Eligibility with dominated (session, replica) pairs removed (module docstring).

    A session consumes at least q_i = min over its eligible constrained replicas of c_ij·u_j
    tokens of the constrained capacity Σ U_j·u_j (0 if an unconstrained replica can take it)."""
    m, n = eligible.shape
    keep = eligible.copy()
    if m < 2:
        return keep
    constrained = units > 0
    total = float((caps * units)[constrained].sum())
    spend = np.where(eligible & constrained[None, :], cost * units[None, :], np.iinfo(np.int64).max)
    spend = np.where((eligible & ~constrained[None, :]).any(axis=1), 0, spend.min(axis=1)).astype(np.float64)
    rank = np.arange(m)
    earlier = rank[:, None] < rank[None, :]
    for j in range(n):
        if not eligible[:, j].any():
            continue
        c = cost[:, j]
        col = codes[:, j]
        better = np.asarray(col[:, None] > col[None, :], dtype=np.bool_)
        equal = np.asarray(col[:, None] == col[None, :], dtype=np.bool_)
        ties = (c[:, None] < c[None, :]) | ((c[:, None] == c[None, :]) & earlier)
        dom = (c[:, None] <= c[None, :]) & (better | (equal & ties)) & eligible[:, j][:, None]
        needed = spend @ dom.astype(np.float64) + spend
        keep[:, j] &= needed <= total
    return keep


@dataclass(frozen=True, slots=True)
class _Group:
    members: tuple[int, ...]  # column indices, ascending
    capacity: int  # U


@lru_cache(maxsize=32)
def _multiset_states(size: int, top: int) -> npt.NDArray[np.int64]:
    """All non-increasing tuples of ``size`` budgets in [0, top], the full budget first."""
    combos = itertools.combinations_with_replacement(range(top, -1, -1), size)
    return np.array(list(combos), dtype=np.int64).reshape(-1, size)


@lru_cache(maxsize=256)
def _multiset_sources(size: int, top: int, cost: int) -> npt.NDArray[np.int64]:
    """src[b, p] = index of b with its p-th budget reduced by ``cost`` (re-sorted), or -1 when
    p repeats the previous position's budget or the budget is below ``cost``."""
    states = _multiset_states(size, top)
    weights = (top + 1) ** np.arange(size - 1, -1, -1, dtype=np.int64)
    codes = states @ weights
    order = np.argsort(codes)
    sorted_codes = codes[order]
    out = np.full(states.shape, -1, dtype=np.int64)
    for p in range(size):
        ok = states[:, p] >= cost
        if p > 0:
            ok &= states[:, p] != states[:, p - 1]
        if not ok.any():
            continue
        reduced = states[ok].copy()
        reduced[:, p] -= cost
        reduced = -np.sort(-reduced, axis=1)
        out[ok, p] = order[np.searchsorted(sorted_codes, reduced @ weights)]
    return out


def _groups(credit: IntArray, elig: BoolArray, units: IntArray, caps: IntArray) -> list[_Group]:
    """Cache-equivalent columns (equal unit, capacity, credit and eligibility), in first-index order.

    Columns are bucketed by a random projection of their credit and eligibility, then checked
    for exact equality inside each bucket (a projection collision only splits a bucket)."""
    usable = np.nonzero(elig.any(axis=0))[0]
    if usable.size == 0:
        return []
    probe = np.random.default_rng(0x7A0).random(credit.shape[0])
    sig = probe @ credit[:, usable].astype(np.float64) + 0.5 * (probe @ elig[:, usable].astype(np.float64))
    buckets: dict[tuple[int, int, float], list[list[int]]] = {}
    for j, h in zip(usable.tolist(), sig.tolist(), strict=True):
        groups = buckets.setdefault((int(units[j]), int(caps[j]), h), [])
        for g in groups:
            first = g[0]
            if np.array_equal(credit[:, first], credit[:, j]) and np.array_equal(elig[:, first], elig[:, j]):
                g.append(j)
                break
        else:
            groups.append([j])
    found = sorted((tuple(g) for gs in buckets.values() for g in gs), key=lambda g: g[0])
    return [_Group(g, int(caps[g[0]])) for g in found]


def _state_count(groups: list[_Group]) -> int:
    total = 1
    for g in groups:
        total *= math.comb(g.capacity + len(g.members), len(g.members))
    return total


@dataclass(frozen=True, slots=True)
class _Layout:
    units: IntArray
    caps: IntArray
    cost: IntArray  # (m, n)
    elig: BoolArray
    groups: list[_Group]
    states: int
    pruned_pairs: int
    rounding_excluded: int


def _quantise(resolution: int, foot: IntArray, elig: BoolArray, free: IntArray
              ) -> tuple[IntArray, IntArray, IntArray, BoolArray]:
    """(u_j, U_j, c_ij, fits_ij): the largest constrained replica gets ``resolution`` units,
    replica j about resolution·(F_j / F_max)² — the split of a fixed state count that
    minimises the summed rounding loss Σ_j (sessions on j)·u_j/2 ∝ Σ_j F_j²/U_j."""
    demand = foot @ elig.astype(np.int64)
    constrained = elig.any(axis=0) & (demand > free)
    top = float(free[constrained].max()) if constrained.any() else 1.0
    share = np.where(constrained, (free / top) ** SHARE_EXPONENT, 0.0)
    target = np.clip(np.floor(max(1, resolution) * share), 1, np.maximum(free, 1)).astype(np.int64)
    units = np.where(constrained, np.maximum(1, -(-free // target)), 0).astype(np.int64)
    cost = costs_in_units(foot, units)
    caps = np.where(constrained, free // np.maximum(units, 1), 0).astype(np.int64)
    fits = elig & ((cost <= caps[None, :]) | ~constrained[None, :])
    # Capacity beyond what every candidate eligible on j together costs never binds.
    caps = np.minimum(caps, (cost * fits).sum(axis=0))
    return units, caps, cost, fits


def _layout(resolution: int, codes: npt.NDArray[np.int64] | npt.NDArray[np.object_], credit: IntArray,
            foot: IntArray, elig: BoolArray, free: IntArray, prune: bool) -> _Layout:
    units, caps, cost, fits = _quantise(resolution, foot, elig, free)
    kept = prune_pairs(codes, cost, fits, units, caps) if prune else fits
    caps = np.minimum(caps, (cost * kept).sum(axis=0))
    groups = _groups(credit, kept, units, caps)
    return _Layout(units, caps, cost, kept, groups, _state_count(groups), int(fits.sum() - kept.sum()),
                   int(elig.sum() - fits.sum()))


def _choose_layout(codes: npt.NDArray[np.int64] | npt.NDArray[np.object_], credit: IntArray, foot: IntArray,
                   elig: BoolArray, free: IntArray, budget: DpBudget) -> _Layout | None:
    """The finest resolution whose state space and work fit ``budget`` (None below ``min_resolution``).

    ``states_at`` counts the states of the layout before pruning (pruning only shrinks it),
    so the resolution found by bisection always meets ``state_budget``; work and memory,
    which depend on what pruning leaves, are then met by coarsening step by step."""
    m, n = elig.shape
    prune = m * m * n <= budget.prune_limit
    usable_free = free[elig.any(axis=0)]
    # Resolution at which every replica, the smallest included, reaches unit 1.
    top = int(usable_free.max()) * max(1, -(-int(usable_free.max()) // max(1, int(usable_free.min())))) ** 2

    def states_at(resolution: int) -> int:
        units, caps, _, fits = _quantise(resolution, foot, elig, free)
        return _state_count(_groups(credit, fits, units, caps))

    if states_at(budget.min_resolution) > budget.state_budget:
        return None  # hopeless (e.g. dozens of distinct replicas): skip the search
    pairs0 = max(1, int(elig.sum()))
    target = min(budget.state_budget, max(1, 2 * budget.work_budget // pairs0))
    lo, hi = budget.min_resolution, max(budget.min_resolution, top)
    # Cheap bracket first: Π_j (R·share_j + 1) over constrained replicas over-counts the
    # states (no grouping, no demand cap), so where it fits the exact count fits too.
    demand = foot @ elig.astype(np.int64)
    constrained = elig.any(axis=0) & (demand > free)
    if constrained.any():
        share = (free[constrained] / float(free[constrained].max())) ** SHARE_EXPONENT

        def rough(resolution: int) -> float:
            units = np.minimum(np.floor(resolution * share), free[constrained])
            return float(np.prod(units + 1.0))

        r_lo, r_hi = lo, hi
        while r_hi > r_lo * 1.05 and r_hi - r_lo > 1:
            mid = max(r_lo + 1, min(r_hi - 1, int(math.sqrt(r_lo * r_hi))))
            r_lo, r_hi = (mid, r_hi) if rough(mid) <= target else (r_lo, mid)
        lo = max(lo, r_lo)
        hi = max(lo, min(hi, 2 * lo))
    if states_at(hi) <= target:
        lo = hi
    else:
        # Geometric bisection to within 15 %: states_at(lo) fits (or lo is the minimum).
        while hi > lo * 1.15 and hi - lo > 1:
            mid = max(lo + 1, min(hi - 1, int(math.sqrt(lo * hi))))
            lo, hi = (mid, hi) if states_at(mid) <= target else (lo, mid)
    resolution = lo
    for _ in range(12):
        lay = _layout(resolution, codes, credit, foot, elig, free, prune)
        pairs = int(lay.elig.sum())
        rows = int(lay.elig.any(axis=1).sum())
        if (lay.states <= budget.state_budget and pairs * lay.states <= budget.work_budget
                and rows * lay.states <= budget.memory_budget):
            return lay
        if resolution <= budget.min_resolution:
            return None
        over = max(lay.states / budget.state_budget, pairs * lay.states / budget.work_budget,
                   rows * lay.states / budget.memory_budget)
        dims = max(1, sum(len(g.members) for g in lay.groups if g.capacity > 0))
        resolution = max(budget.min_resolution,
                         min(resolution - 1, int(resolution / max(1.25, over ** (1.0 / dims) * 1.05))))
    return None


def solve_exact(instance: Instance, budget: DpBudget = DpBudget()) -> DpResult | None:
    """Optimal plan of the discretised problem, or None when it does not fit ``budget``."""
    values = instance.values
    m, n = instance.eligible.shape
    choice = np.full(m, -1, dtype=np.int64)
    eligible = instance.eligible & (instance.free_tokens[None, :] >= values.footprint[:, None])
    rows = np.nonzero(eligible.any(axis=1))[0]
    if rows.size == 0:
        zeros = np.zeros(n, np.int64)
        return DpResult(choice, (0, 0, 0), zeros, zeros, 1, 0, 0, True)
    elig = eligible[rows]
    foot = values.footprint[rows]
    credit = values.credit[rows]
    # Quick reject: constrained replicas with pairwise different free capacity cannot share a
    # group, and each has at least two states at any resolution, so d of them need 2^d states.
    demand = foot @ elig.astype(np.int64)
    constrained = elig.any(axis=0) & (demand > instance.free_tokens)
    if np.unique(instance.free_tokens[constrained]).size > math.log2(budget.state_budget):
        return None
    codes, _ = encode_values(values, rows)
    lay = _choose_layout(codes, credit, foot, elig, instance.free_tokens, budget)
    if lay is None:
        return None
    live = np.nonzero(lay.elig.any(axis=1))[0]
    picked = _run_dp(codes[live], lay.cost[live], lay.elig[live], lay.groups)
    for local, col in picked.items():
        choice[rows[live[local]]] = col
    constrained = lay.units > 0
    return DpResult(
        choice=choice,
        objective=objective_of(values, choice),
        units_tokens=lay.units,
        capacity_units=lay.caps,
        states=lay.states,
        pruned_pairs=lay.pruned_pairs,
        rounding_excluded=lay.rounding_excluded,
        exact_tokens=bool(np.all(lay.units[constrained] == 1)),
    )


def _run_dp(codes: npt.NDArray[np.int64] | npt.NDArray[np.object_], cost: IntArray, elig: BoolArray,
            groups: list[_Group]) -> dict[int, int]:
    """The DP proper; returns {row: column} of the optimal plan (module docstring).

    Tables are flat C-order arrays: a shift by c units along a single-replica axis is a
    contiguous shift by c·stride, masked where the axis coordinate is below c (those
    positions would read a wrapped neighbour). Multiset axes gather through their tables.
    """
    m = cost.shape[0]
    shape = tuple(math.comb(g.capacity + len(g.members), len(g.members)) for g in groups)
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    strides = [int(np.prod(shape[g + 1:], dtype=np.int64)) for g in range(len(shape))]
    dtype = np.int64 if codes.dtype == np.int64 else object
    first = [g.members[0] for g in groups]
    gok = elig[:, first] if groups else np.zeros((m, 0), dtype=np.bool_)
    gcost = cost[:, first] if groups else np.zeros((m, 0), dtype=np.int64)
    masks: dict[tuple[int, int], BoolArray] = {}
    coords: dict[int, npt.NDArray[np.int32]] = {}

    def mask(gi: int, c: int) -> BoolArray:
        got = masks.get((gi, c))
        if got is None:
            coord = coords.get(gi)
            if coord is None:
                grid = np.arange(shape[gi], dtype=np.int32).reshape([-1 if a == gi else 1 for a in range(len(shape))])
                coord = coords[gi] = np.broadcast_to(grid, shape).ravel()
            got = masks[(gi, c)] = coord[c * strides[gi]:] >= c
        return got

    tmp = np.empty(size, dtype=dtype)
    # One block for every table: row i is the value table after rows < i (row 0 = all zero).
    tables = np.empty((m + 1, size), dtype=dtype)
    tables[0] = 0
    for i in range(m):
        dp = tables[i]
        new = tables[i + 1]
        np.copyto(new, dp)
        for gi in np.nonzero(gok[i])[0].tolist():
            g = groups[gi]
            c = int(gcost[i, gi])
            v = codes[i, g.members[0]]
            if c == 0:
                np.maximum(new, dp + v, out=new)
                continue
            if len(g.members) == 1:
                off = c * strides[gi]
                if c < shape[gi]:
                    t = tmp[: size - off]
                    np.add(dp[: size - off], v, out=t)
                    np.maximum(new[off:], t, out=new[off:], where=mask(gi, c))
                continue
            table = _multiset_sources(len(g.members), g.capacity, c)
            grid, old = new.reshape(shape), dp.reshape(shape)
            for p in range(len(g.members)):
                valid = np.nonzero(table[:, p] >= 0)[0]
                if valid.size:
                    key = tuple(valid if a == gi else slice(None) for a in range(len(shape)))
                    grid[key] = np.maximum(grid[key], np.take(old, table[valid, p], axis=gi) + v)
    return _walk_back(tables, codes, gcost, gok, groups, strides)


def _walk_back(tables: npt.NDArray[np.int64] | npt.NDArray[np.object_],
               codes: npt.NDArray[np.int64] | npt.NDArray[np.object_], gcost: IntArray, gok: BoolArray,
               groups: list[_Group], strides: list[int]) -> dict[int, int]:
    """Recover the plan: from the full budget, each row (last first) takes the first option
    whose predecessor value plus its code reproduces the current value."""
    state = [g.capacity if len(g.members) == 1 else 0 for g in groups]
    budgets = {gi: [g.capacity] * len(g.members) for gi, g in enumerate(groups) if len(g.members) > 1}
    at = sum(x * s for x, s in zip(state, strides, strict=True))  # flat index of ``state``
    out: dict[int, int] = {}
    for i in range(len(tables) - 2, -1, -1):
        here = tables[i + 1, at]
        prev = tables[i]
        if here == prev[at]:
            continue
        found = False
        for gi in np.nonzero(gok[i])[0].tolist():
            g = groups[gi]
            c = int(gcost[i, gi])
            v = codes[i, g.members[0]]
            if c == 0:
                if prev[at] + v == here:
                    out[i] = g.members[0]
                    found = True
                    break
                continue
            if len(g.members) == 1:
                if state[gi] >= c and prev[at - c * strides[gi]] + v == here:
                    state[gi] -= c
                    at -= c * strides[gi]
                    out[i] = g.members[0]
                    found = True
                    break
                continue
            sources = _multiset_sources(len(g.members), g.capacity, c)
            for p in range(len(g.members)):
                src = int(sources[state[gi], p])
                step = (src - state[gi]) * strides[gi]
                if src >= 0 and prev[at + step] + v == here:
                    have = int(_multiset_states(len(g.members), g.capacity)[state[gi], p])
                    state[gi] = src
                    at += step
                    member = budgets[gi].index(have)
                    budgets[gi][member] -= c
                    out[i] = g.members[member]
                    found = True
                    break
            if found:
                break
        if not found:
            raise AssertionError(f"DP walk-back found no option for row {i}")
    return out
