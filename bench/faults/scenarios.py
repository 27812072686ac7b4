"""Fault scenarios against a live stack (``FaultEnv``), shared by ``tests/faults`` and
``tao check faults``.

Each scenario runs an ``AgentLoad`` through the router, injects its fault(s) mid-workload,
checks the behaviour docs/architecture.md#failure-modes-and-degraded-behaviour promises, restores the stack, and returns a
``ScenarioResult`` (``bench.faults.outcome``): the checks (name, passed, detail), faults
injected, and the accounting of every request: attempts by outcome, lost attempts (no
proper answer; a connection cut counts unless the router itself was down), duplicated
attempts (one client attempt that replicas executed to completion more than once for a
client still reading, from the taps) and answers that disagree with the replicas (an ``ok``
answer whose attempt did not complete exactly once there).

Control-plane scenarios live in ``scenarios_control``, data-path ones in ``scenarios_data``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from bench.faults.env import FaultEnv
from bench.faults.outcome import Check, ScenarioResult
from bench.faults.scenarios_control import (
    kill_budget,
    kill_planner,
    kill_predictor,
    kill_router,
    redis_wipe,
    stop_planner,
)
from bench.faults.scenarios_data import kill_replica, proxy_redis, proxy_replica

__all__ = ["SCENARIOS", "Check", "ScenarioResult", "kill_budget", "kill_planner", "kill_predictor", "kill_replica",
           "kill_router", "proxy_redis", "proxy_replica", "redis_wipe", "stop_planner"]

SCENARIOS: dict[str, Callable[[FaultEnv], Coroutine[Any, Any, ScenarioResult]]] = {
    "redis_wipe": redis_wipe,
    "kill_planner": kill_planner,
    "kill_budget": kill_budget,
    "kill_predictor": kill_predictor,
    "kill_router": kill_router,
    "stop_planner": stop_planner,
    "kill_replica": kill_replica,
    "proxy_redis": proxy_redis,
    "proxy_replica": proxy_replica,
}
