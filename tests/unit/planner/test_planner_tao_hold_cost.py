"""``hold_outweighs_recompute`` (the ``tao-hold-cost`` lever's test): a held session may take an
incumbent's reservation once its wait has cost what recomputing the incumbent's context would."""

from __future__ import annotations

from services.planner.core.continuum import ContinuumConfig, prefill_reload_s
from services.planner.core.model import SessionState
from services.planner.core.tao import hold_outweighs_recompute


def test_the_wait_is_weighed_against_the_incumbents_prefill() -> None:
    cfg = ContinuumConfig()
    big = SessionState(id="b", tenant="t", footprint_tokens=95_000, ready=True, phase="ACTING", context_tokens=90_000)
    cost = prefill_reload_s(90_000, cfg)
    assert 10.0 < cost < 20.0
    assert not hold_outweighs_recompute(cost - 0.1, big, cfg)
    assert hold_outweighs_recompute(cost, big, cfg)
    small = SessionState(id="s", tenant="t", footprint_tokens=2_000, ready=True, phase="ACTING")  # no context: footprint
    assert hold_outweighs_recompute(prefill_reload_s(2_000, cfg), small, cfg)
