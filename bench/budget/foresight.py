"""The foresight reference: gap lending by a controller that knows when every burst starts.

Not a policy the service can run (it reads the scenario's future); a yardstick for the shipped
controller (issue 19, docs/benchmarks.md#budget). The dynamic controller lends a bursty tenant's
idle slots to the others in its gaps and must have them back before its next burst: a lent slot
returns only when the borrower's request in it ends (nothing is preempted), and the controller
acts only at its 2 s ticks. Everything it learns (that a gap has begun, how long gaps last, how
long a call-back takes) it learns from the router's demand records. This reference is told the
ON windows of every on/off tenant instead (``foresee``, the windows the workload drew), so it
lends at the first tick of every gap and calls back exactly ``horizon_s`` plus one tick before
the next burst; everything else is as the service runs it: the same tick, the same settlement
and draining rules as the static policy (``toward_targets``: Σ caps = B, no preemption, no step
limit).

At each tick an on/off tenant lends everything above its floor when it has no request held or in
flight, is outside its ON windows and its next window starts at least one tick plus
``horizon_s`` later (slots lent now are refilled until the next tick and held for up to the
borrowers' slot hold after it; ``horizon_s`` None: that hold itself, the longest p99 slot hold
the tenants without ON windows report, as the shipped controller starts from, and nothing is
lent until each of them has reported one); otherwise its
target is its static share. What it lends is split
by weight among the tenants that do not lend. With ``horizon_s`` at least the borrowers' slot
hold, no lent slot is still out when a burst starts; shorter horizons lend into the bursts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from services.budget.core.model import Allocation, BudgetState
from services.budget.core.policies import fresh_observations, static_targets, toward_targets
from services.budget.core.split import weighted_split

Windows = Sequence[tuple[float, float]]


class ForesightPolicy:
    """Gap lending with the on/off tenants' ON windows known in advance (see the module)."""

    name = "foresight"

    def __init__(self, horizon_s: float | None, tick_s: float = 2.0, stale_after_s: float = 10.0) -> None:
        if (horizon_s is not None and horizon_s < 0) or tick_s <= 0:
            raise ValueError("horizon_s must be >= 0 (or None: the borrowers' hold) and tick_s > 0")
        self.horizon_s = horizon_s
        self.tick_s = tick_s
        self.stale_after_s = stale_after_s
        self.windows: dict[str, Windows] = {}

    def foresee(self, windows: Mapping[str, Windows]) -> None:
        """The ON windows of each on/off tenant, [start, end) in model seconds."""
        self.windows = {n: sorted(w) for n, w in windows.items()}

    def lends(self, tenant: str, now_s: float, busy: int, horizon_s: float) -> bool:
        """``tenant`` (with ``busy`` requests held or in flight) lends its slots at ``now_s`` for
        borrowers that hold a slot up to ``horizon_s``."""
        wins = self.windows.get(tenant)
        if not wins or busy > 0 or any(a <= now_s < b for a, b in wins):
            return False
        nxt = min((a for a, _ in wins if a > now_s), default=float("inf"))
        return now_s + self.tick_s + horizon_s <= nxt

    def reallocate(self, state: BudgetState) -> Allocation:
        config = state.config
        share = static_targets(config)
        observed = fresh_observations(state, self.stale_after_s)
        floors = {t.name: t.floor for t in config.tenants}
        if self.horizon_s is not None:
            horizon = self.horizon_s
        else:  # the longest p99 slot hold the tenants that never lend report; none yet: lend nothing
            holds = [o.p99_hold_s for n, o in observed.items() if n not in self.windows]
            known = [h for h in holds if h is not None]
            horizon = max(known) if known and len(known) == len(holds) else math.inf
        lenders = [n for n in config.names
                   if (o := observed.get(n)) is not None and self.lends(n, state.now_s, o.waiting + o.in_flight, horizon)]
        targets = dict(share)
        for n in lenders:
            targets[n] = floors[n]
        rest = [n for n in config.names if n not in lenders]
        if lenders and rest:
            spare = config.total - sum(targets[n] for n in lenders)
            weights = {t.name: t.weight for t in config.tenants if t.name in rest}
            targets.update(weighted_split(spare, weights, {n: share[n] for n in rest}))
        return toward_targets(state, targets, self.name, self.stale_after_s, "its foresight target",
                              "foresight targets met")
