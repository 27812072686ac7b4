"""Light load uses every replica: the compute-load tie-break (services/planner/core/spread.py).

32 sessions of three short turns on 2 replicas with room to spare: KV capacity never binds,
so a session's cache value is the same (zero) on both replicas when it first arrives. The
policies that gate admission must still split the requests within ±20 % of even, as the
per-request baselines do, instead of packing them onto one replica."""

from __future__ import annotations

from collections import Counter

import pytest

from services.planner.core.registry import make_policy
from services.sim.cluster.simulator import ClusterSim, SimConfig
from services.sim.workload.trace import Tool, TraceSession, Turn


def _trace(sessions: int = 32, turns: int = 3) -> list[TraceSession]:
    out = []
    for k in range(sessions):
        steps = []
        for t in range(turns):
            tool = None if t == turns - 1 else Tool(name="bash", command="ls", duration_s=2.0 + (k % 5) * 0.5)
            steps.append(Turn(append_tokens=300, output_tokens=120, tool=tool))
        out.append(TraceSession(session_id=f"s{k:02d}", tenant="t", arrival_s=0.25 * k, system_prompt_tokens=500,
                           turns=tuple(steps)))
    return out


@pytest.mark.parametrize("policy", ["tao", "tao-paper", "thunderagent", "round_robin"])
def test_light_load_splits_requests_evenly(policy: str) -> None:
    cfg = SimConfig(replicas=2, profile="qwen3-32b-h100x2")
    run = ClusterSim(_trace(), make_policy(policy), cfg).run()
    assert not run.stalled
    per_replica = Counter(r.replica for r in run.requests)
    assert sum(per_replica.values()) == 96
    assert set(per_replica) == {"r0", "r1"}, per_replica
    for count in per_replica.values():
        assert 0.8 * 48 <= count <= 1.2 * 48, per_replica
