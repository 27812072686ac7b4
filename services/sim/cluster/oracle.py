"""The ``oracle`` policy: TAO's decision procedure with perfect information (upper reference).

Which of the two designs the brief allowed: the simulator supplies an *oracle readiness and
footprint source* and the decision is TAO's own DP, unchanged. ``OraclePolicy`` is registered
into ``services.planner.core.registry.POLICIES`` under ``"oracle"`` when this module is
imported (``services.sim.cluster`` imports it), and it declares ``uses_ground_truth = True``; the
simulator then builds its snapshots from the trace's truth instead of the router's estimates:

- readiness r(s) = 1 iff the session's running tool will *actually* return within the
  predictor's horizon (1 s), or a request is already waiting — no prediction error, no
  stale or overdue predictions, no exploration;
- footprint f(s) = the exact size of the session's next request (current context + the
  true next append + the true next output) instead of EWMA estimates: the simulator reveals
  them to the router core as each request completes (``RouterCore.reveal_next_request``; the
  first request keeps the default output estimate). Until 2026-12-04 it did not, and the oracle
  had the truth about tool ends only;
- credits, capacities and everything else are what every other policy sees.

So it is the same objective and the same exact DP as ``tao`` with the two estimated inputs
replaced by the truth: a reference for how much TAO loses to prediction error, not a
re-tuned TAO and not a global optimum of task latency (no policy here is).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from services.planner.core.model import Snapshot
from services.planner.core.registry import POLICIES
from services.planner.core.tao import TAO, TaoConfig, TaoPolicy
from services.planner.core.values import IntArray, Values


class OraclePolicy(TaoPolicy):
    """TAO's DP on ground-truth snapshots (see module docstring): ``tao`` itself, which the
    simulator feeds the truth because of ``uses_ground_truth``."""

    uses_ground_truth = True

    def __init__(self, name: str = "oracle", config: TaoConfig = TAO) -> None:
        super().__init__(name, config)


@dataclass(frozen=True, slots=True)
class RemainingWork:
    """What is left of a session, from the trace: its context now, what is left of the tool it
    runs (0 when it runs none), and its turns to come (each: append, output, then its tool)."""

    context_tokens: int
    tool_left_s: float
    turns: tuple[tuple[int, int, float], ...]  # (append_tokens, output_tokens, tool duration_s)


class RemainingOraclePolicy(TaoPolicy):
    """``oracle-remaining``: ``tao`` told each session's true remaining work, an upper reference
    for the remaining-work lever of docs/benchmarks.md (a Gittins-style or shortest-remaining
    order needs an estimate of it; this is what a perfect one could buy).

    The index of a session is the KV it will hold until it ends, in token-seconds, as if alone:
    Σ over what is left of context × time, the current tool's rest at today's context, each
    turn's decode (its output × the policy's decode step for one sequence at that context) and
    its tool at the context after it. Among the snapshot's sessions the index falls in one of
    ``QUANTILES`` bands; a ready pool session ranks ``QUANTILES`` − band (the least work left
    highest) and a session that is not ready 0, as the first term of the objective
    (``objective="tiered"``: Σtier, Σk, Σf, with readiness inside the tier as in ``tao``'s
    ready-first order). Everything else is ``tao``: the reclaim's own tiers, pauses, placement.
    Simulator only: the simulator sets ``remaining_work`` because of ``uses_remaining_work``;
    without it (or for a session it does not know) every ready session ranks alike, as in
    ``tao``, the way ``oracle`` without the simulator's truth is ``tao``."""

    uses_remaining_work = True
    QUANTILES = 4

    def __init__(self, name: str = "oracle-remaining", config: TaoConfig = replace(TAO, objective="tiered")) -> None:
        super().__init__(name, config)
        self.remaining_work: Callable[[str], RemainingWork | None] | None = None

    def kv_seconds(self, work: RemainingWork) -> float:
        """The index: KV token-seconds the session holds until it ends, alone on a replica."""
        step = self.config.decode_model.step_s
        ctx = work.context_tokens
        total = ctx * work.tool_left_s
        for append, output, tool_s in work.turns:
            ctx += append + output
            total += ctx * (output * step(1, ctx) + tool_s)
        return total

    def _tier(self, snapshot: Snapshot, ids: list[str], values: Values) -> IntArray:
        if self.remaining_work is None:
            return super()._tier(snapshot, ids, values)  # readiness alone: `tao`'s order
        index: dict[str, float] = {}
        for sess in snapshot.sessions:
            work = self.remaining_work(sess.id)
            if work is not None:
                index[sess.id] = self.kv_seconds(work)
        ranked = sorted(index.values())
        tiers = []
        for sid, ready in zip(ids, values.ready.tolist(), strict=True):
            if not ready:
                tiers.append(0)
                continue
            below = bisect.bisect_left(ranked, index.get(sid, ranked[-1] if ranked else 0.0))
            band = min(self.QUANTILES - 1, self.QUANTILES * below // max(1, len(ranked)))
            tiers.append(self.QUANTILES - band)
        return np.array(tiers, dtype=np.int64)


_SIM_POLICIES: dict[str, type[TaoPolicy]] = {"oracle": OraclePolicy, "oracle-remaining": RemainingOraclePolicy}

SIM_ONLY: tuple[str, ...] = tuple(_SIM_POLICIES)
"""Policies that read the trace's future: the simulator runs them, a live stack cannot."""


def register() -> None:
    """Idempotently add the ``SIM_ONLY`` policies to the planner registry."""
    for name, cls in _SIM_POLICIES.items():
        POLICIES.setdefault(name, cls)


register()
