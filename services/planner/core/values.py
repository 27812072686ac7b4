"""The value triple v(s, n) = (k(s, n), r(s), f(s)) in exact integers
(docs/algorithms.md#value-triple).

Cache credit k(s, n) = floor(k0(s, n) · 2^(−τ/h)), h = 10 s, τ = max(0, now − observed_at).
k0 comes from the best evidence the session has on replica n, strongest first
(docs/algorithms.md#cache-credit):
(1) ``kv_events``, (2) ``cached_tokens``, (3) ``volume`` × the replica's observed prefix hit
rate; within one kind the newest observation wins (then the larger one). No evidence → 0.
``kv_events`` evidence is not decayed: it is the replica's residency as its live event stream
says now (the router updates it when it changes and withdraws it when the stream is lost).
The fold is one pass over the evidence, O(n·m) at most, and the decay is vectorised.
Credit is a scheduling value only: nothing here moves or pins physical KV.

r(s) is the predictor's / router's readiness bit, f(s) the session's footprint in tokens.
Triples are compared lexicographically; ``encode_values`` turns them into one exact integer
per (s, n) by a mixed radix (never a weighted float sum), so sums compare the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from services.planner.core.model import EVIDENCE_KINDS, Objective, ReplicaState, SessionState

HALF_LIFE_S = 10.0  # the TAO paper: k = k0 · 2^(−τ/h), h = 10 s (docs/algorithms.md#cache-credit)
EVIDENCE_RANK: dict[str, int] = {kind: rank for rank, kind in enumerate(EVIDENCE_KINDS)}

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class ValueConfig:
    """How a policy values sessions: ``half_life_s=None`` disables decay (k = k0)."""

    half_life_s: float | None = HALF_LIFE_S
    use_readiness: bool = True


FULL_VALUES = ValueConfig()


def raw_credit_matrix(
    sessions: Sequence[SessionState], replicas: Sequence[ReplicaState]
) -> tuple[IntArray, npt.NDArray[np.float64]]:
    """Best-evidence k0 and its observation time per (session, replica); (0, -inf) without evidence.

    Best = strongest kind, then newest observation, then most tokens."""
    k0, seen, _ = _best_evidence(sessions, replicas)
    return k0, seen


def _best_evidence(
    sessions: Sequence[SessionState], replicas: Sequence[ReplicaState]
) -> tuple[IntArray, npt.NDArray[np.float64], IntArray]:
    """``raw_credit_matrix`` plus the rank of the winning kind (``len(EVIDENCE_RANK)`` where none)."""
    index = {r.id: j for j, r in enumerate(replicas)}
    m, n = len(sessions), len(replicas)
    k0 = np.zeros((m, n), dtype=np.int64)
    seen = np.full((m, n), -np.inf)
    rank, worst = EVIDENCE_RANK, len(EVIDENCE_RANK)
    won = np.full((m, n), worst, dtype=np.int64)
    rows = [
        (i, index.get(c.replica, -1), rank.get(c.kind, worst), c.observed_at_s, c.credit_tokens)
        for i, ses in enumerate(sessions)
        for c in ses.credits
    ]
    rows = [r for r in rows if r[1] >= 0]
    if not rows:
        return k0, seen, won
    ii, jj, kinds, times, tokens = zip(*rows, strict=True)
    i_a = np.array(ii, dtype=np.int64)
    j_a = np.array(jj, dtype=np.int64)
    kind_a = np.array(kinds, dtype=np.int64)
    t_a = np.array(times, dtype=np.float64)
    tok_a = np.array(tokens, dtype=np.int64)
    hit = np.array([r.prefix_hit_rate for r in replicas], dtype=np.float64)
    volume = kind_a == rank["volume"]
    tok_a[volume] = np.floor(tok_a[volume] * hit[j_a[volume]]).astype(np.int64)
    pair = i_a * n + j_a
    order = np.lexsort((-tok_a, -t_a, kind_a, pair))
    first = np.ones(order.size, dtype=np.bool_)
    first[1:] = pair[order][1:] != pair[order][:-1]
    best = order[first]
    k0[i_a[best], j_a[best]] = tok_a[best]
    seen[i_a[best], j_a[best]] = t_a[best]
    won[i_a[best], j_a[best]] = kind_a[best]
    return k0, seen, won


def credit_matrix(
    now_s: float,
    sessions: Sequence[SessionState],
    replicas: Sequence[ReplicaState],
    half_life_s: float | None = HALF_LIFE_S,
) -> IntArray:
    """k(s, n) in integer tokens (floor) at ``now_s``; shape (len(sessions), len(replicas))."""
    k0, seen, won = _best_evidence(sessions, replicas)
    if half_life_s is None:
        return k0
    has = k0 > 0
    out = np.zeros_like(k0)
    if has.any():
        tau = np.maximum(0.0, now_s - seen[has])  # clock skew (observation in the future) -> no decay
        tau[won[has] == EVIDENCE_RANK["kv_events"]] = 0.0  # live residency: current, not decayed
        out[has] = np.floor(k0[has].astype(np.float64) * np.exp2(-tau / half_life_s)).astype(np.int64)
    return out


@dataclass(frozen=True, slots=True)
class Values:
    """Value triples of ``sessions`` × ``replicas`` (rows and columns in the given order)."""

    credit: IntArray  # (m, n) tokens
    ready: IntArray  # (m,) 0/1
    footprint: IntArray  # (m,) tokens


def fold_values(
    now_s: float,
    sessions: Sequence[SessionState],
    replicas: Sequence[ReplicaState],
    config: ValueConfig = FULL_VALUES,
) -> Values:
    """Fold the cache observations into a value matrix (done once, before any solving)."""
    credit = credit_matrix(now_s, sessions, replicas, config.half_life_s)
    ready = np.fromiter(
        (1 if (s.ready and config.use_readiness) else 0 for s in sessions), dtype=np.int64, count=len(sessions)
    )
    footprint = np.fromiter((s.footprint_tokens for s in sessions), dtype=np.int64, count=len(sessions))
    return Values(credit=credit, ready=ready, footprint=footprint)


def objective_of(values: Values, choice: npt.NDArray[np.int64]) -> Objective:
    """(Σk, Σr, Σf) of an assignment vector (``choice[i]`` = replica column, or -1 = not admitted)."""
    placed = choice >= 0
    if not placed.any():
        return (0, 0, 0)
    rows = np.nonzero(placed)[0]
    k = int(values.credit[rows, choice[rows]].sum())
    return (k, int(values.ready[rows].sum()), int(values.footprint[rows].sum()))


@dataclass(frozen=True, slots=True)
class Encoding:
    """Mixed-radix code: code = (k·R + r)·F + f, exact while Σ r < R and Σ f < F."""

    radix_ready: int
    radix_footprint: int
    fits_int64: bool

    def decode(self, code: int) -> Objective:
        kr, f = divmod(code, self.radix_footprint)
        k, r = divmod(kr, self.radix_ready)
        return (k, r, f)


def encode_values(values: Values, rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int64] | npt.NDArray[np.object_], Encoding]:
    """Per-(s, n) codes for ``rows`` such that summing codes and comparing sums is the
    lexicographic comparison of (Σk, Σr, Σf). int64 when the largest possible total fits,
    otherwise Python ints in an object array (exact, slower)."""
    credit = values.credit[rows]
    ready = values.ready[rows]
    foot = values.footprint[rows]
    radix_f = int(foot.sum()) + 1
    radix_r = int(ready.sum()) + 1
    k_total = int(credit.max(axis=1).sum()) if credit.size else 0
    bound = ((k_total + 1) * radix_r) * radix_f
    fits = bound < 2**62
    enc = Encoding(radix_ready=radix_r, radix_footprint=radix_f, fits_int64=fits)
    if fits:
        codes = (credit * radix_r + ready[:, None]) * radix_f + foot[:, None]
        return codes.astype(np.int64), enc
    big = np.empty(credit.shape, dtype=object)
    for i in range(credit.shape[0]):
        for j in range(credit.shape[1]):
            big[i, j] = (int(credit[i, j]) * radix_r + int(ready[i])) * radix_f + int(foot[i])
    return big, enc



def with_tier(values: Values, tier: IntArray, keep_ready: bool = True) -> Values:
    """Values whose lexicographic order is (Σtier, Σk, Σr, Σf): ``tier`` (per session, >= 0)
    is folded into the credit column by a mixed radix, k'(s, n) = tier(s)·M + k(s, n) with
    M = Σ_s max_n k(s, n) + 1, so Σk' = Σtier·M + Σk and Σk ≤ M − 1 for any plan: comparing
    Σk' compares Σtier first, then Σk, exactly (integers, no weights). Every solver takes the
    result unchanged; cache-equivalent replicas stay equivalent (the tier is per session).
    ``keep_ready=False`` zeroes r (when the tier already is readiness)."""
    if values.credit.size == 0:
        return values
    radix = int(values.credit.max(axis=1).sum()) + 1
    credit = tier.astype(np.int64)[:, None] * radix + values.credit
    ready = values.ready if keep_ready else np.zeros_like(values.ready)
    return Values(credit=credit.astype(np.int64), ready=ready, footprint=values.footprint)


def ready_first(values: Values) -> Values:
    """Values whose lexicographic order is (Σr, Σk, Σf) instead of (Σk, Σr, Σf) (``with_tier``)."""
    return with_tier(values, values.ready, keep_ready=False)
