"""The capacity bound (``services.sim.cluster.lower_bound.capacity_bound``): the closed loop's
identity it rests on holds in the simulator, no policy's simulated mean latency is below it,
it binds where the fleet is the bottleneck, and it stops a session's work where vLLM's 400
ends the session."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.planner.core.registry import POLICIES as REGISTERED
from services.sim.cluster import SimConfig
from services.sim.cluster import oracle as _oracle  # noqa: F401  (registers the oracles)
from services.sim.cluster.lower_bound import capacity_bound, lower_bound
from services.sim.cluster.runner import compare, run_policy, sim_capacity_bound
from services.sim.engine import get_profile
from services.sim.workload.generate import GenerateOptions, generate

PROFILE = "qwen3-32b-h100x2"
POLICIES = ["tao", "thunderagent", "sjf", "round_robin", "continuum-affine"]


def test_the_closed_loop_latency_sum_is_the_last_completions_and_no_policy_beats_the_bound() -> None:
    sessions = generate(GenerateOptions(kind="swe-lite", sessions=12, seed=3, max_turns=6, max_context_tokens=9000))
    assert all(s.arrival_s == 0.0 for s in sessions)
    cfg = SimConfig(replicas=2, profile=PROFILE, num_gpu_blocks=900, concurrency=5, tick_s=0.5)
    doc, outcomes = compare(sessions, POLICIES, cfg)
    cb = capacity_bound(sessions, get_profile(PROFILE), 2, 5, 900)
    assert doc["capacity_bound"] == cb.to_json()
    for o in outcomes:
        assert not o.run.failed and len(o.run.sessions) == len(sessions)
        ends = sorted(r.end_s for r in o.run.sessions)
        total = sum(r.end_s - r.start_s for r in o.run.sessions)
        assert total == pytest.approx(sum(ends[-5:]), rel=1e-9)  # section 1 of the bound
        assert o.metrics["mean_task_latency_s"] >= cb.mean_task_latency_s
        assert o.metrics["latency_over_capacity_bound"] == pytest.approx(
            o.metrics["mean_task_latency_s"] / cb.mean_task_latency_s)
        assert o.metrics["busy_over_work_bound"] == pytest.approx(o.run.busy_s / cb.work_s)
        assert o.run.busy_s >= cb.work_s


def test_it_binds_where_the_fleet_is_the_bottleneck() -> None:
    """Many sessions, no worker limit, one small replica: the sessions queue for the engine,
    the per-session bound says almost nothing and the capacity bound says most of it."""
    sessions = generate(GenerateOptions(kind="swe-lite", sessions=16, seed=1, arrival_rate_per_s=0,
                                        max_turns=4, max_context_tokens=6000))
    cfg = SimConfig(replicas=1, profile=PROFILE, num_gpu_blocks=500, tick_s=0.5)
    doc, outcomes = compare(sessions, ["tao", "round_robin"], cfg)
    cb = capacity_bound(sessions, get_profile(PROFILE), 1, None, 500)
    assert cb.binding == "capacity" and cb.mean_task_latency_s > 1.5 * cb.no_contention_s
    for o in outcomes:
        ratio = o.metrics["latency_over_capacity_bound"]
        assert 1.0 <= ratio < o.metrics["latency_over_lower_bound"]


def test_one_session_alone_is_the_no_contention_bound() -> None:
    sessions = generate(GenerateOptions(kind="terminal-bench", sessions=1, seed=4, max_turns=5,
                                        max_context_tokens=20_000))
    profile = get_profile(PROFILE)
    cb = capacity_bound(sessions, profile, 4, 8)
    assert cb.binding == "no-contention"
    assert cb.mean_task_latency_s == pytest.approx(lower_bound(sessions, profile).mean_task_latency_s)
    assert cb.min_steps > 0 and 0 < cb.work_s < cb.mean_task_latency_s


def test_a_session_ended_by_vllms_400_counts_its_work_up_to_the_refused_request() -> None:
    profile = get_profile(PROFILE)
    long = generate(GenerateOptions(kind="terminal-bench", sessions=1, seed=2, max_turns=30,
                                    max_context_tokens=60_000))
    s = long[0]
    blocks = 2000  # max_model_len (blocks − 1) · 16 = 31,984 tokens: the trace outgrows it
    ctx, cut = s.system_prompt_tokens, len(s.turns)
    for i, t in enumerate(s.turns):
        if ctx + t.append_tokens + t.output_tokens > (blocks - 1) * profile.block_size:
            cut = i
            break
        ctx += t.append_tokens + t.output_tokens
    assert 0 < cut < len(s.turns)
    head = s.model_copy(update={"turns": s.turns[:cut]})
    full_blocks = capacity_bound([s], profile, 1, None, 20_000)
    ended = capacity_bound([s], profile, 1, None, blocks)
    truncated = capacity_bound([head], profile, 1, None, 20_000)
    assert ended.no_contention_s == pytest.approx(truncated.no_contention_s)
    assert ended.no_contention_s < full_blocks.no_contention_s


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="replicas"):
        capacity_bound([], get_profile(PROFILE), 0)
    assert capacity_bound([], get_profile(PROFILE), 1).sessions == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["swe-lite", "terminal-bench", "swe-verified", "chat-bursty"]),
       sessions=st.integers(2, 7), seed=st.integers(0, 10_000), replicas=st.integers(1, 3),
       concurrency=st.one_of(st.none(), st.integers(1, 6)), blocks=st.integers(300, 1500),
       poisson=st.booleans(), policy=st.sampled_from(sorted(REGISTERED)))
def test_no_simulated_run_beats_the_bound(kind: str, sessions: int, seed: int, replicas: int,
                                         concurrency: int | None, blocks: int, poisson: bool, policy: str) -> None:
    """Random small fleets and traces (closed and open loops, Poisson arrivals, KV caches small
    enough that vLLM's 400 ends some sessions) under every registered policy: every session
    completes or ends at a 400 (no stall), the engine is never busy for less than the least
    work, and the sum of the simulated latencies is never below the bound's (checked where every
    session completed: the run keeps no end time for a session a 400 ended)."""
    trace = generate(GenerateOptions(kind=kind, sessions=sessions, seed=seed, max_turns=5, max_context_tokens=24_000,
                                     arrival_rate_per_s=0.5 if poisson else 0))
    cfg = SimConfig(replicas=replicas, profile=PROFILE, num_gpu_blocks=blocks, concurrency=concurrency, tick_s=0.5)
    out = run_policy(trace, policy, cfg)
    cb = sim_capacity_bound(trace, cfg)
    ended = {s.session_id: s.end_s - s.start_s for s in out.run.sessions}
    assert len(ended) + len(out.run.failed) == sessions
    assert out.run.busy_s >= cb.work_s - 1e-9
    if not out.run.failed:
        assert sum(ended.values()) >= cb.mean_task_latency_s * sessions - 1e-6
