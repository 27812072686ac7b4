"""The capacity-state DP at token resolution (u = 1), over reachable states only.

Same recurrence as dp.py — each pool session skipped or assigned to one eligible replica,
lexicographic (Σk, Σr, Σf) via the exact mixed-radix codes — but a state is the vector of
tokens used per replica and only states some plan reaches are kept (equal vectors merged,
keeping the best value). Replicas whose remaining candidates all fit together are not
tracked at all (their capacity never binds). Small pools thus get the optimum of the *undiscretised* problem
(nothing excluded by rounding). When the number of states would exceed ``max_states`` the
solver gives up (returns None) and the caller uses the quantised DP.

The (session, replica) pairs are first reduced by dp.prune_pairs at token resolution (exact).

Tie-breaking (deterministic): when two candidates reach the same used-vector with the same
value, the one generated first is kept, in the order skip, then replicas by column, and within
an option by parent order; the final state is the first with the best value.
"""

from __future__ import annotations

import numpy as np

from services.planner.core.dp import DpResult, Instance, prune_pairs
from services.planner.core.values import IntArray, encode_values, objective_of


def solve_sparse(instance: Instance, max_rows: int = 40, max_states: int = 20_000,
                 max_work: int = 200_000) -> DpResult | None:
    """Optimal plan in tokens, or None when it would be too big: more than ``max_rows``
    sessions left after pruning, more than ``max_states`` states after a step or
    ``max_work`` candidate states in total, or codes beyond int64."""
    values = instance.values
    m, n = instance.eligible.shape
    choice = np.full(m, -1, dtype=np.int64)
    free = instance.free_tokens.astype(np.int64)
    eligible = instance.eligible & (free[None, :] >= values.footprint[:, None])
    rows = np.nonzero(eligible.any(axis=1))[0]
    ones = np.ones(n, dtype=np.int64)
    if rows.size == 0:
        return DpResult(choice, (0, 0, 0), ones, free, 1, 0, 0, True)
    if rows.size > 4 * max_rows:
        return None  # pruning rarely brings a pool this large under max_rows: skip its O(m²n) cost
    codes, enc = encode_values(values, rows)
    if not enc.fits_int64:
        return None
    foot = values.footprint[rows]
    elig = eligible[rows]
    cost = np.repeat(foot[:, None], n, axis=1)
    kept = prune_pairs(codes, cost, elig, ones, free)
    live = np.nonzero(kept.any(axis=1))[0]
    if live.size > max_rows:
        return None
    # Replicas whose remaining candidates all fit together never bind: no usage to track.
    demand = foot @ kept.astype(np.int64)
    tracked = np.nonzero(kept.any(axis=0) & (demand > free))[0]
    slot = {int(j): t for t, j in enumerate(tracked.tolist())}
    used = np.zeros((1, tracked.size), dtype=np.int64)
    value = np.zeros(1, dtype=np.int64)
    parents: list[IntArray] = []
    options: list[IntArray] = []
    work = 0
    for t in live.tolist():
        f = int(foot[t])
        parts_u, parts_v, parts_p, parts_o = [used], [value], [np.arange(used.shape[0])], [np.full(used.shape[0], -1)]
        for j in np.nonzero(kept[t])[0].tolist():
            k = slot.get(j)
            if k is None:
                ok = np.arange(used.shape[0])
                nu = used.copy()
            else:
                ok = np.nonzero(used[:, k] + f <= free[j])[0]
                if ok.size == 0:
                    continue
                nu = used[ok].copy()
                nu[:, k] += f
            parts_u.append(nu)
            parts_v.append(value[ok] + int(codes[t, j]))
            parts_p.append(ok)
            parts_o.append(np.full(ok.size, j))
        all_u = np.concatenate(parts_u)
        all_v = np.concatenate(parts_v)
        work += all_u.shape[0]
        if work > max_work:
            return None
        # Keep, per distinct used-vector, the best value (first generated on ties).
        order = np.lexsort((np.arange(all_v.size), -all_v, *all_u.T[::-1]))
        su = all_u[order]
        first = np.ones(order.size, dtype=np.bool_)
        first[1:] = (su[1:] != su[:-1]).any(axis=1)
        pick = order[first]
        if pick.size > max_states:
            return None
        pick.sort()  # generation order: deterministic ties downstream
        used, value = all_u[pick], all_v[pick]
        parents.append(np.concatenate(parts_p)[pick])
        options.append(np.concatenate(parts_o)[pick])
    at = int(np.argmax(value))
    for step in range(len(live) - 1, -1, -1):
        j = int(options[step][at])
        if j >= 0:
            choice[rows[live[step]]] = j
        at = int(parents[step][at])
    return DpResult(
        choice=choice,
        objective=objective_of(values, choice),
        units_tokens=ones,
        capacity_units=free,
        states=int(used.shape[0]),
        pruned_pairs=int(elig.sum() - kept.sum()),
        rounding_excluded=0,
        exact_tokens=True,
    )

