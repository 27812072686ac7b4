"""Brute-force reference for the planner: enumerate every assignment, keep the lexicographic best.

Vectorised over all (n+1)^m assignments so thousands of instances stay fast.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from services.planner.core.values import Values


def brute_force(values: Values, eligible: npt.NDArray[np.bool_], costs: npt.NDArray[np.int64],
                capacity: npt.NDArray[np.int64]) -> tuple[int, int, int]:
    """Max (Σk, Σr, Σf) over assignments where session i goes to an eligible replica j (at
    cost ``costs[i, j]``, or ``costs[i]`` on every replica) or nowhere, and every replica's
    Σ cost ≤ ``capacity``."""
    m, n = eligible.shape
    if m == 0:
        return (0, 0, 0)
    costs = np.broadcast_to(costs[:, None], (m, n)) if costs.ndim == 1 else costs
    combos = np.array(list(itertools.product(range(-1, n), repeat=m)), dtype=np.int64)  # (C, m)
    placed = combos >= 0
    cols = np.where(placed, combos, 0)
    rows = np.broadcast_to(np.arange(m), combos.shape)
    ok = np.where(placed, eligible[rows, cols], True).all(axis=1)
    for j in range(n):
        load = ((combos == j) * costs[None, :, j]).sum(axis=1)
        ok &= load <= capacity[j]
    k = np.where(placed, values.credit[rows, cols], 0).sum(axis=1)
    r = (placed * values.ready[None, :]).sum(axis=1)
    f = (placed * values.footprint[None, :]).sum(axis=1)
    k, r, f = k[ok], r[ok], f[ok]
    best = np.lexsort((f, r, k))[-1]
    return (int(k[best]), int(r[best]), int(f[best]))
