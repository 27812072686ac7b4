"""Exact integer splitting of a slot total (weighted max-min fairness with bounds)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping


def water_fill(
    total: int,
    weights: Mapping[str, float],
    lower: Mapping[str, int],
    upper: Mapping[str, int],
) -> dict[str, int]:
    """Split ``total`` integer slots so that ``lower[t] <= x[t] <= upper[t]`` and the split
    is weighted max-min fair: slots go one at a time to the tenant with the smallest
    ``(x[t] + 1) / weights[t]`` among those below their upper bound (ties by name).

    Requires ``sum(lower) <= total <= sum(upper)``; the result sums to exactly ``total``.
    Deterministic. Cost O((total - sum(lower)) log n).
    """
    names = sorted(weights)
    lo = sum(lower[n] for n in names)
    hi = sum(upper[n] for n in names)
    if not lo <= total <= hi:
        raise ValueError(f"cannot split {total} within bounds summing to [{lo}, {hi}]")
    alloc = {n: lower[n] for n in names}
    heap = [((alloc[n] + 1) / weights[n], n) for n in names if alloc[n] < upper[n]]
    heapq.heapify(heap)
    remaining = total - lo
    while remaining > 0:
        _, name = heapq.heappop(heap)
        alloc[name] += 1
        remaining -= 1
        if alloc[name] < upper[name]:
            heapq.heappush(heap, ((alloc[name] + 1) / weights[name], name))
    return alloc


def weighted_split(total: int, weights: Mapping[str, float], floors: Mapping[str, int]) -> dict[str, int]:
    """The whole ``total`` split by weight, every tenant at least its floor (equal when the
    weights are equal; the remainder of an uneven division goes to names in sorted order)."""
    return water_fill(total, weights, floors, {n: total for n in weights})
