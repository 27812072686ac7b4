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
  true next append + the true next output) instead of EWMA estimates;
- credits, capacities and everything else are what every other policy sees.

So it is the same objective and the same exact DP as ``tao`` with the two estimated inputs
replaced by the truth: a reference for how much TAO loses to prediction error, not a
re-tuned TAO and not a global optimum of task latency (no policy here is).
"""

from __future__ import annotations

from services.planner.core.registry import POLICIES
from services.planner.core.tao import TAO, TaoConfig, TaoPolicy


class OraclePolicy(TaoPolicy):
    """TAO's DP on ground-truth snapshots (see module docstring): ``tao`` itself, which the
    simulator feeds the truth because of ``uses_ground_truth``."""

    uses_ground_truth = True

    def __init__(self, name: str = "oracle", config: TaoConfig = TAO) -> None:
        super().__init__(name, config)


def register() -> None:
    """Idempotently add ``oracle`` to the planner registry."""
    POLICIES.setdefault("oracle", OraclePolicy)


register()
