"""The fleet fault suite at a small size (``tao check faults --fleet``; docs/architecture.md#the-fleet-fault-suite):
3 routers, 2 planners, 2 budget services, a Redis Cluster of 3 masters with a replica each, the
predictor and two emulated replicas, all real processes on loopback, under an agent workload
spread over the routers. kill -9 the leader planner, the leader budget service, the Redis master
that holds every TAO key, then one router: the standby / the promoted replica / the other
routers take over, and no request is lost or executed twice and every session finishes.

Every wait has a deadline and recovery times are reported, never asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faults import scenarios_fleet
from bench.faults.fleet_env import FleetConfig, FleetEnv
from bench.faults.outcome import ScenarioResult
from services.common.testing import find_redis_binary, redis_cli_binary
from tests.faults.stacks import healed, started

_binary = find_redis_binary()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_binary is None or redis_cli_binary(_binary) is None,
                       reason="needs redis-server and redis-cli (Redis Cluster)"),
]

SMALL = {"agents": 4, "turns": 4}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetEnv]:
    log_dir: Path = tmp_path_factory.mktemp("fleet-logs")
    yield from started(FleetEnv(FleetConfig(log_dir=log_dir)), timeout_s=90)


@pytest.fixture
def healthy(fleet: FleetEnv) -> FleetEnv:
    return healed(fleet, timeout_s=60, serving=("SERVING", "1"))  # "1": one leader per role


def _assert_survived(res: ScenarioResult, env: FleetEnv) -> None:
    assert not env.dead(), f"processes died: {env.dead()} (logs: {env.stack.config.log_dir})"
    assert res.faults == 1
    assert res.load.get("requests", 0) > 0
    assert res.ok, res.failures() + f" (logs: {env.stack.config.log_dir})"
    assert (res.lost, res.duplicated, res.stuck) == (0, 0, 0), res.failures()


@pytest.mark.timeout(180)
async def test_leader_planner_killed_standby_takes_over(healthy: FleetEnv) -> None:
    res = await scenarios_fleet.kill_planner(healthy, **SMALL)
    _assert_survived(res, healthy)
    assert "standby_leads" in res.recovery_s and "routers_applied" in res.recovery_s


@pytest.mark.timeout(180)
async def test_leader_budget_killed_standby_publishes_caps(healthy: FleetEnv) -> None:
    res = await scenarios_fleet.kill_budget(healthy, **SMALL)
    _assert_survived(res, healthy)
    assert "standby_leads" in res.recovery_s and "caps_published" in res.recovery_s


@pytest.mark.timeout(180)
async def test_redis_master_killed_replica_promoted(healthy: FleetEnv) -> None:
    res = await scenarios_fleet.kill_redis_master(healthy, **SMALL)
    _assert_survived(res, healthy)
    assert "replica_promoted" in res.recovery_s and "plan_published" in res.recovery_s


@pytest.mark.timeout(180)
async def test_router_killed_sessions_continue_elsewhere(healthy: FleetEnv) -> None:
    res = await scenarios_fleet.kill_router(healthy, **SMALL)
    _assert_survived(res, healthy)
    assert "sessions_continued" in res.recovery_s
