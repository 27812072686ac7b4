"""Compute-load spreading: a placement tie-break after the lexicographic objective.

KV capacity is not the only resource a replica has. Two sessions placed on one replica
share its decode batch and its prefill budget, while a second replica with the same cache
value for them sits idle. The objective (Σk, Σr, Σf) cannot see that: a session with no
cache anywhere has the same value on every replica, and the solvers break such ties by
column order or tightest fit, so at light load every new session lands on one replica.

``spread`` moves placed sessions between replicas only where the move leaves the objective
exactly unchanged: the session's credit on the new replica equals its credit on the old one
(readiness and footprint do not depend on the replica), and the new replica has the tokens
left for it. Among such replicas it picks the one with the least compute load:

    load(n) = (sessions on n that use the GPU now, sessions admitted on n)

where "use the GPU now" means an admitted session with a request held or in flight
(WAITING/RUNNING), an admitted ACTING session that is ready, or a ready session this plan
places there. Ties go to the replica with more tokens left, then the lower column.

Invariants: the returned choice has the same (Σk, Σr, Σf) as the input, places the same rows,
and keeps every replica within its free tokens. Pure; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from services.planner.core.model import SessionState
from services.planner.core.policy import HOLDS_REQUEST
from services.planner.core.values import IntArray, Values


def replica_load(admitted: Sequence[SessionState], columns: dict[str, int], n: int) -> tuple[list[int], list[int]]:
    """(sessions using the GPU now, sessions admitted) per replica column."""
    busy = [0] * n
    total = [0] * n
    for s in admitted:
        j = columns.get(s.replica or "")
        if j is None:
            continue
        total[j] += 1
        if s.phase in HOLDS_REQUEST or s.ready:
            busy[j] += 1
    return busy, total


def spread(choice: npt.NDArray[np.int64], values: Values, eligible: npt.NDArray[np.bool_],
           free_tokens: IntArray, busy: Sequence[int], total: Sequence[int]) -> npt.NDArray[np.int64]:
    """Re-place placed rows on the least loaded replica among those of equal credit (see module)."""
    m = choice.shape[0]
    if m == 0 or eligible.ndim != 2 or eligible.shape[1] < 2:
        return choice
    out = choice.copy()
    rem = free_tokens.astype(np.int64).copy()
    placed = np.nonzero(out >= 0)[0]
    for row in placed:
        rem[out[row]] -= values.footprint[row]
    load_busy = list(busy)
    load_total = list(total)
    for row in placed:
        load_busy[out[row]] += int(values.ready[row])
        load_total[out[row]] += 1
    # Ready rows first (they load the GPU now), then larger rows (harder to move later), then row.
    order: list[int] = sorted(placed.tolist(), key=lambda i: (-int(values.ready[i]), -int(values.footprint[i]), i))
    for i in order:
        j = int(out[i])
        ready = int(values.ready[i])
        need = int(values.footprint[i])
        load_busy[j] -= ready
        load_total[j] -= 1
        rem[j] += need
        credit = values.credit[i]
        # a row may always stay where it is (``TaoPolicy._reclaim`` keeps the incumbents of a
        # replica left over capacity within the pause band, where rem < need for them)
        stay = np.arange(rem.shape[0]) == j
        same = np.nonzero((eligible[i] & (credit == credit[j]) & (rem >= need)) | stay)[0]
        best = min(same.tolist(), key=lambda c: (load_busy[c], load_total[c], -int(rem[c]), c))
        out[i] = best
        load_busy[best] += ready
        load_total[best] += 1
        rem[best] -= need
    return out
