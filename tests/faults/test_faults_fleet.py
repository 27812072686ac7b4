"""The fleet fault suite at a small size (``tao check faults --fleet``; docs/architecture.md#the-fleet-fault-suite):
3 routers, 2 planners, 2 budget services, a Redis Cluster of 3 masters with a replica each, the
predictor and two emulated replicas, all real processes on loopback, under an agent workload
spread over the routers. kill -9 the leader planner, the leader budget service, the Redis master
that holds every TAO key, then one router: the standby / the promoted replica / the other
routers take over, and no request is lost or executed twice and every session finishes.

Every wait has a deadline and recovery times are reported, never asserted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
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


# scenario -> the recovery steps it must report (times are reported, never asserted)
SCENARIOS = [
    (scenarios_fleet.kill_planner, ("standby_leads", "routers_applied")),
    (scenarios_fleet.kill_budget, ("standby_leads", "caps_published")),
    (scenarios_fleet.kill_redis_master, ("replica_promoted", "plan_published")),
    (scenarios_fleet.kill_router, ("sessions_continued",)),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("scenario", "steps"), SCENARIOS, ids=[fn.__name__ for fn, _ in SCENARIOS])
async def test_fleet_survives_the_kill(healthy: FleetEnv, scenario: Callable[..., Awaitable[ScenarioResult]],
                                       steps: tuple[str, ...]) -> None:
    res = await scenario(healthy, **SMALL)
    assert not healthy.dead(), f"processes died: {healthy.dead()} (logs: {healthy.stack.config.log_dir})"
    assert res.faults == 1
    assert res.load.get("requests", 0) > 0
    assert res.ok, res.failures() + f" (logs: {healthy.stack.config.log_dir})"
    assert (res.lost, res.duplicated, res.stuck) == (0, 0, 0), res.failures()
    assert all(step in res.recovery_s for step in steps), (steps, res.recovery_s)
