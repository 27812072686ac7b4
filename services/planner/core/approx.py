"""Approximate solver for instances whose state space exceeds the DP budget, and an upper bound.

Method ("knapsack+bfd"), one phase per objective component in lexicographic order:
1. Credit. Per replica a 1-D knapsack DP over the sessions with credit there, maximising
   their (k, r, f) codes (so Σk first) with costs rounded *up* to 1/``KNAPSACK_RESOLUTION``
   of the replica's free tokens (always feasible in tokens) — the "value density" greedy
   done exactly per replica. A session packed by several replicas stays where dropping it
   would cost the most; the others re-pack without it (see ``_credit_phase``).
2. Readiness. Remaining ready sessions, smallest footprint first (maximises how many fit),
   each where it fits tightest (best fit), in exact tokens.
3. Footprint. Remaining sessions, largest first (best-fit decreasing), in exact tokens.

Upper bound (``upper_bound``): a triple no feasible plan exceeds lexicographically, since
each component bounds its own sum over all feasible plans:
- Σk ≤ Σ_j KP_j, where KP_j is the best credit replica j alone could hold if every session
  with credit there were available to it ("each session once" dropped), by a knapsack with
  costs rounded *down* and the capacity rounded *up* (a relaxation, so an upper bound);
  also Σk ≤ Σ_i max_j k(i, j);
- Σr ≤ the largest number of ready sessions whose smallest footprints fit the total free;
- Σf ≤ min(Σ_i f_i, Σ_j min(F_j, demand_j)).
``relative_gap`` gives (bound − achieved) / bound per component; the primary component's gap
is the one the lexicographic objective is judged by.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.planner.core.dp import Instance
from services.planner.core.model import Objective
from services.planner.core.values import IntArray, Values, encode_values, objective_of

KNAPSACK_RESOLUTION = 1024  # units per replica in the heuristic's per-replica knapsacks
BOUND_RESOLUTION = 4096  # units per replica in the bound's (value-only) knapsacks


@dataclass(frozen=True, slots=True)
class ApproxResult:
    choice: npt.NDArray[np.int64]
    objective: Objective
    upper_bound: Objective


def _reduce(values: npt.NDArray[np.int64] | npt.NDArray[np.object_], costs: IntArray, capacity: int
            ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Dembo–Hammer reduction: (items every optimal packing needs, items still undecided).

    With r the density of the LP break item, U the LP bound and L a greedy packing's value,
    forcing item j against its LP choice costs at least |v_j − r·c_j|; when U − |v_j − r·c_j|
    < L that choice cannot be optimal, so j is fixed. The comparison keeps a safety margin
    for float rounding of large codes, so only clear cases are fixed (exactness is kept)."""
    idx = np.nonzero(costs <= capacity)[0]
    if idx.size < 8:
        return np.zeros(0, dtype=np.intp), idx
    v = np.asarray(values[idx], dtype=np.float64)
    c = costs[idx].astype(np.float64)
    density = np.where(c > 0, v / np.maximum(c, 1.0), np.inf)
    order = np.argsort(-density, kind="stable")
    cum = np.cumsum(c[order])
    brk = int(np.searchsorted(cum, capacity, side="right"))
    if brk >= idx.size:
        return idx, np.zeros(0, dtype=np.intp)  # everything fits
    room = capacity - (cum[brk - 1] if brk > 0 else 0.0)
    r = density[order[brk]] if np.isfinite(density[order[brk]]) else 0.0
    lp = float(v[order[:brk]].sum()) + r * room
    greedy, left = 0.0, float(capacity)
    for t in order.tolist():
        if c[t] <= left:
            greedy += v[t]
            left -= c[t]
    margin = 1e-9 * max(1.0, abs(lp)) + 1.0
    slack = np.abs(v - r * c)
    decided = lp - slack < greedy - margin
    in_lp = np.zeros(idx.size, dtype=np.bool_)
    in_lp[order[:brk]] = True
    return idx[decided & in_lp], idx[~decided]


def knapsack(values: npt.NDArray[np.int64] | npt.NDArray[np.object_], costs: IntArray, capacity: int
             ) -> list[int]:
    """Indices of a max-value subset with Σ costs ≤ capacity (0/1 knapsack DP over units,
    after the exact Dembo–Hammer reduction).

    An item replaces the running best only when strictly better, so among optimal subsets the
    walk-back returns the one that prefers earlier undecided items."""
    fixed, keep = _reduce(values, costs, capacity)
    capacity -= int(costs[fixed].sum())
    values, costs = values[keep], costs[keep]
    n = len(costs)
    dtype = np.int64 if values.dtype == np.int64 else object
    dp = np.zeros(capacity + 1, dtype=dtype)
    take = np.zeros((n, capacity + 1), dtype=np.bool_)  # take[t, x]: item t used at budget x
    cost_list = costs.tolist()
    buf = np.empty(capacity + 1, dtype=dtype)
    for t in range(n):
        c = cost_list[t]
        if c > capacity:
            continue
        cand = np.add(dp[: capacity + 1 - c], values[t], out=buf[: capacity + 1 - c])
        better = np.greater(cand, dp[c:], out=take[t, c:])
        np.copyto(dp[c:], cand, where=better)
    picked: list[int] = fixed.tolist()
    x = capacity
    for t in range(n - 1, -1, -1):
        if take[t, x]:
            picked.append(int(keep[t]))
            x -= cost_list[t]
    return sorted(picked)


def knapsack_value(values: IntArray, costs: IntArray, capacity: int) -> int:
    """Optimal value of the 0/1 knapsack (value only, one in-place DP row)."""
    fixed, keep = _reduce(values, costs, capacity)
    capacity -= int(costs[fixed].sum())
    dp = np.zeros(capacity + 1, dtype=np.int64)
    for v, c in zip(values[keep].tolist(), costs[keep].tolist(), strict=True):
        if c == 0:
            dp += v
        elif c <= capacity:
            np.maximum(dp[c:], dp[: capacity + 1 - c] + v, out=dp[c:])
    return int(values[fixed].sum()) + int(dp[capacity])


def _credit_bound(values: Values, free_tokens: IntArray, elig: npt.NDArray[np.bool_],
                  shared: dict[int, list[int]] | None) -> int:
    """Σk bound by Lagrangian relaxation of "each session at most once".

    For any multipliers μ_i ≥ 0, L(μ) = Σ_i μ_i + Σ_j KP_j(k(·, j) − μ) bounds Σk of every
    feasible plan (weak duality), where KP_j is replica j's best credit if every session with
    credit there were available to it alone. Knapsacks round costs down and capacity up at
    ``BOUND_RESOLUTION`` units, so each KP_j is itself a relaxation. μ = 0 is the plain
    per-replica sum; then, for each session several replicas pack at μ = 0 (``shared``:
    session -> those replicas, as the heuristic's first round found them; derived here when
    not given), μ_i is set to the smallest loss one of those replicas suffers without it.
    The smaller of the two bounds is used.
    """
    credit = np.where(elig, values.credit, 0)
    has = credit > 0
    units = np.maximum(1, -(-free_tokens // BOUND_RESOLUTION))
    caps = -(-free_tokens // units)
    cols = [j for j in range(elig.shape[1]) if has[:, j].any()]

    def kp(j: int, mu: IntArray, packed_by: dict[int, list[int]] | None) -> int:
        rows = np.nonzero(has[:, j] & (credit[:, j] > mu))[0]
        if rows.size == 0:
            return 0
        vals = credit[rows, j] - mu[rows]
        costs = values.footprint[rows] // units[j]
        cap = int(caps[j])
        if int(costs.sum()) <= cap:
            picked: list[int] = list(range(rows.size))
        elif packed_by is None:
            return knapsack_value(vals, costs, cap)
        else:
            picked = knapsack(vals, costs, cap)
        if packed_by is not None:
            for i in rows[picked].tolist():
                packed_by.setdefault(i, []).append(j)
        return int(vals[picked].sum())

    zero = np.zeros(credit.shape[0], dtype=np.int64)
    derived: dict[int, list[int]] | None = {} if shared is None else None
    totals = {j: kp(j, zero, derived) for j in cols}
    if shared is None and derived is not None:
        shared = {i: js for i, js in derived.items() if len(js) > 1}
    bound = sum(totals.values())
    if shared:
        # μ_i = the smallest loss a replica that packs i would suffer without it: the
        # per-replica sum then counts i about once instead of on every replica packing it.
        mu = zero.copy()
        for i, js in shared.items():
            drop = zero.copy()
            drop[i] = np.iinfo(np.int64).max // 4
            mu[i] = min(totals[j] - kp(j, drop, None) for j in js)
        touched = sorted({j for i in shared for j in np.nonzero(has[i])[0].tolist()})
        again = {j: kp(j, mu, None) for j in touched}
        bound = min(bound, int(mu.sum()) + sum(again.get(j, totals[j]) for j in cols))
    best_each = int(credit.max(axis=1).sum()) if credit.size else 0
    return min(bound, best_each)


def upper_bound(values: Values, free_tokens: IntArray, eligible: npt.NDArray[np.bool_],
                shared: dict[int, list[int]] | None = None) -> Objective:
    """A lexicographic upper bound on (Σk, Σr, Σf) over all feasible plans (see module docstring)."""
    elig = eligible & (free_tokens[None, :] >= values.footprint[:, None])
    foot = values.footprint
    rows = elig.any(axis=1)
    if not rows.any():
        return (0, 0, 0)
    k_bound = _credit_bound(values, free_tokens, elig, shared)
    total_free = int(free_tokens[elig.any(axis=0)].sum())
    ready_f = np.sort(foot[rows & (values.ready > 0)])
    r_bound = int(np.searchsorted(np.cumsum(ready_f), total_free, side="right"))
    demand = foot @ elig.astype(np.int64)
    f_bound = min(int(foot[rows].sum()), int(np.minimum(free_tokens, demand).sum()))
    return (k_bound, r_bound, f_bound)


def relative_gap(achieved: Objective, bound: Objective) -> tuple[float, float, float]:
    """Per-component (bound − achieved) / bound (0 when the bound is 0)."""
    k, r, f = ((b - a) / b if b > 0 else 0.0 for a, b in zip(achieved, bound, strict=True))
    return (k, r, f)


def solve_greedy(instance: Instance, with_bound: bool = True) -> ApproxResult:
    """Per-replica credit knapsacks, then best-fit for readiness and footprint (module docstring).
    ``with_bound=False`` skips the upper bound (reported as the plan's own objective)."""
    values = instance.values
    m, n = instance.eligible.shape
    foot = values.footprint
    elig = instance.eligible & (instance.free_tokens[None, :] >= foot[:, None])
    rem = instance.free_tokens.astype(np.int64).copy()
    choice = np.full(m, -1, dtype=np.int64)
    candidates = np.nonzero(elig.any(axis=1))[0]
    codes, _ = encode_values(values, candidates) if candidates.size else (np.zeros((0, n), np.int64), None)
    local = {int(i): t for t, i in enumerate(candidates.tolist())}
    owner, shared = _credit_phase(values, elig, rem, codes, local)
    for i, j in owner.items():
        choice[i] = j
        rem[j] -= foot[i]
    unplaced = np.nonzero((choice < 0) & elig.any(axis=1))[0]
    ready_rows = unplaced[values.ready[unplaced] > 0]
    ready_rows = ready_rows[np.lexsort((ready_rows, foot[ready_rows]))]
    _best_fit(ready_rows.tolist(), foot, elig, choice, rem)
    rest = np.nonzero((choice < 0) & elig.any(axis=1))[0]
    rest = rest[np.lexsort((rest, -foot[rest]))]
    _best_fit(rest.tolist(), foot, elig, choice, rem)
    objective = objective_of(values, choice)
    return ApproxResult(
        choice=choice,
        objective=objective,
        upper_bound=upper_bound(values, instance.free_tokens, instance.eligible, shared) if with_bound else objective,
    )


def _credit_phase(values: Values, elig: npt.NDArray[np.bool_], free: IntArray,
                  codes: npt.NDArray[np.int64] | npt.NDArray[np.object_], local: dict[int, int]
                  ) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Phase 1: ({row: column}, {row packed by several replicas: those replicas}). Every replica first packs all sessions with credit on it. A
    session packed by several replicas goes to the one that would lose the most value by
    re-packing without it (ties: more credit, then lowest column); the replicas that lost it
    re-pack, in column order, without the sessions owned elsewhere."""
    foot = values.footprint
    homes = elig & (values.credit > 0)

    def pack(j: int, banned: set[int]) -> list[int]:
        rows = [int(i) for i in np.nonzero(homes[:, j])[0] if int(i) not in banned]
        if not rows:
            return []
        arr = np.array(rows, dtype=np.int64)
        capacity = int(free[j])
        if int(foot[arr].sum()) <= capacity:
            return rows
        unit = max(1, -(-capacity // KNAPSACK_RESOLUTION))
        picked = knapsack(codes[[local[i] for i in rows], j], -(-foot[arr] // unit), capacity // unit)
        return [rows[t] for t in sorted(picked)]

    def worth(j: int, rows: list[int]) -> int:
        return sum(int(codes[local[i], j]) for i in rows)

    cols = [j for j in range(homes.shape[1]) if homes[:, j].any()]
    packs = {j: pack(j, set()) for j in cols}
    picked_by: dict[int, list[int]] = {}
    for j in cols:
        for i in packs[j]:
            picked_by.setdefault(i, []).append(j)
    owner = {i: js[0] for i, js in picked_by.items() if len(js) == 1}
    for i in sorted(i for i, js in picked_by.items() if len(js) > 1):
        loss = {j: worth(j, packs[j]) - worth(j, pack(j, {i})) for j in picked_by[i]}
        owner[i] = max(picked_by[i], key=lambda j: (loss[j], int(values.credit[i, j]), -j))
    losers = sorted({j for i, js in picked_by.items() for j in js if owner[i] != j})
    for j in losers:
        banned = {i for i, o in owner.items() if o != j}
        for i in [i for i, o in owner.items() if o == j]:
            del owner[i]
        for i in pack(j, banned):
            owner[i] = j
    return owner, {i: js for i, js in picked_by.items() if len(js) > 1}


def _best_fit(rows: list[int], foot: IntArray, elig: npt.NDArray[np.bool_], choice: npt.NDArray[np.int64],
              rem: IntArray) -> None:
    """Place each row where it leaves the least room (ties: lowest column); skip if it fits nowhere."""
    top = int(rem.max()) if rem.size else 0
    big = np.iinfo(np.int64).max
    for i in rows:
        need = int(foot[i])
        if need > top:
            continue
        slack = np.where(elig[i] & (rem >= need), rem - need, big)
        j = int(slack.argmin())
        if slack[j] == big:
            continue
        choice[i] = j
        rem[j] -= need
        top = int(rem.max())
