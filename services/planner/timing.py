"""Measure a policy's ``plan`` on a real clock (the pure core reads none).

``timed_plan`` fills ``Plan.solve_ms`` with the time ``policy.plan`` took (value folding,
pauses, solving: everything from snapshot to plan). Use it wherever a real figure is wanted
(CLI, service, benchmarks, the simulator's overhead accounting).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from services.planner.core.model import Plan, Snapshot
from services.planner.core.policy import Policy


def timed_plan(policy: Policy, snapshot: Snapshot, clock: Callable[[], float] = time.perf_counter) -> Plan:
    """``policy.plan(snapshot)`` with ``solve_ms`` measured on ``clock`` (seconds)."""
    start = clock()
    plan = policy.plan(snapshot)
    return dataclasses.replace(plan, solve_ms=(clock() - start) * 1000.0)
