"""Fault injection against the real stack (redis-server, the four `tao serve` processes and
two `tao vllm-sim` replicas) under a live agent workload: kill -9 Redis and each service,
SIGSTOP the planner, kill a replica mid-stream, and the TCP fault proxy between the
services and Redis and between the router and the replicas
(docs/architecture.md#failure-modes-and-degraded-behaviour).

Every scenario checks its own promises and the request accounting: no request lost, none
executed twice, every ok answer executed exactly once at a replica (replica taps). The
scenarios are ``bench.faults.scenarios`` (shared with ``tao check faults``); one stack serves
the module and is healed (proxies to pass, children thawed and restarted) between tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faults import scenarios
from bench.faults.env import EnvConfig, FaultEnv
from services.common.testing import find_redis_binary
from tests.faults.stacks import healed, started

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_redis_binary() is None, reason="needs a redis-server binary"),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultEnv]:
    log_dir: Path = tmp_path_factory.mktemp("fault-stack-logs")
    yield from started(FaultEnv(EnvConfig(log_dir=log_dir)))


@pytest.fixture
def healthy(env: FaultEnv) -> FaultEnv:
    return healed(env, timeout_s=20)


def _run(result: scenarios.ScenarioResult, env: FaultEnv) -> None:
    assert not env.dead(), f"processes died: {env.dead()} (logs: {env.stack.config.log_dir})"
    assert result.faults > 0
    assert result.ok, result.failures()
    assert result.lost == 0 and result.duplicated == 0 and result.mismatched == 0


@pytest.mark.timeout(60)
async def test_redis_killed_and_restarted_empty(healthy: FaultEnv) -> None:
    _run(await scenarios.redis_wipe(healthy), healthy)


@pytest.mark.timeout(60)
async def test_planner_killed(healthy: FaultEnv) -> None:
    _run(await scenarios.kill_planner(healthy), healthy)


@pytest.mark.timeout(60)
async def test_budget_killed_caps_hold(healthy: FaultEnv) -> None:
    _run(await scenarios.kill_budget(healthy), healthy)


@pytest.mark.timeout(60)
async def test_predictor_killed_no_acked_event_lost(healthy: FaultEnv) -> None:
    _run(await scenarios.kill_predictor(healthy), healthy)


@pytest.mark.timeout(60)
async def test_router_killed_sessions_restored(healthy: FaultEnv) -> None:
    _run(await scenarios.kill_router(healthy), healthy)


@pytest.mark.timeout(90)
async def test_planner_stopped_10s_stale_plan_rejected(healthy: FaultEnv) -> None:
    _run(await scenarios.stop_planner(healthy, stop_s=10.0), healthy)


@pytest.mark.timeout(60)
async def test_replica_killed_mid_stream(healthy: FaultEnv) -> None:
    _run(await scenarios.kill_replica(healthy), healthy)


@pytest.mark.timeout(90)
async def test_fault_proxy_between_services_and_redis(healthy: FaultEnv) -> None:
    _run(await scenarios.proxy_redis(healthy), healthy)


@pytest.mark.timeout(90)
async def test_fault_proxy_between_router_and_replicas(healthy: FaultEnv) -> None:
    _run(await scenarios.proxy_replica(healthy), healthy)
