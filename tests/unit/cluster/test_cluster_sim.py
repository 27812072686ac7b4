"""The discrete-event simulator on tiny traces: conservation, determinism, stickiness, pauses."""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from services.planner.core.model import Assignment, Plan
from services.planner.core.registry import POLICIES, make_policy
from services.sim.cluster import SimConfig
from services.sim.cluster.runner import compare, run_policy
from services.sim.cluster.simulator import _STEP_DONE as STEP_DONE
from services.sim.cluster.simulator import ClusterSim
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.trace import TraceSession, write_trace

SMALL = SimConfig(replicas=2, profile="qwen3-32b-h100x2", num_gpu_blocks=1100, tick_s=0.5)


def _trace(n: int = 8, seed: int = 1) -> list[TraceSession]:
    return generate(GenerateOptions(kind="swe-lite", sessions=n, seed=seed, max_turns=6,
                                    max_context_tokens=9000))


def _hand_session(sid: str, turns: list[tuple[int, int, float | None]], arrival: float = 0.0) -> TraceSession:
    return TraceSession.model_validate({
        "session_id": sid, "tenant": "t", "arrival_s": arrival, "system_prompt_tokens": 32,
        "shared_prefix_id": "sys",
        "turns": [{"append_tokens": a, "output_tokens": o,
                   "tool": None if d is None else {"name": "bash", "command": f"sleep {d}", "duration_s": d}}
                  for a, o, d in turns],
    })


def test_oracle_is_registered() -> None:
    assert "oracle" in POLICIES
    assert make_policy("oracle").gates_admission


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_completes_and_conserves_tokens(policy: str) -> None:
    trace = _trace()
    out = run_policy(trace, policy, SMALL)
    assert out.run.incomplete == []
    assert out.metrics["completed_sessions"] == len(trace)
    by_key = {(r.session_id, r.turn): r for r in out.run.requests}
    assert len(by_key) == len(out.run.requests) == sum(len(s.turns) for s in trace)
    for s in trace:
        for i, t in enumerate(s.turns):
            r = by_key[(s.session_id, i)]
            assert r.prompt_tokens == s.prompt_tokens(i)
            assert r.output_tokens == t.output_tokens
            assert 0 <= r.cached_tokens < r.prompt_tokens
            assert r.ready_s <= r.forwarded_s <= r.first_token_s <= r.end_s
        # turn i+1 becomes ready exactly when turn i's tool returns
        for i, t in enumerate(s.turns[:-1]):
            assert t.tool is not None
            nxt = by_key[(s.session_id, i + 1)]
            assert nxt.ready_s == pytest.approx(by_key[(s.session_id, i)].end_s + t.tool.duration_s)


def test_deterministic_across_runs() -> None:
    trace = _trace(10, seed=4)
    a = run_policy(trace, "tao", SMALL)
    b = run_policy(trace, "tao", SMALL)
    strip = lambda m: {k: v for k, v in m.items() if k != "planner_time_share"}  # noqa: E731
    assert strip(a.metrics) == strip(b.metrics)
    assert a.run.requests == b.run.requests


def test_deterministic_across_hash_seeds(tmp_path: Path) -> None:
    trace_path = tmp_path / "t.jsonl"
    write_trace(_trace(6, seed=2), trace_path)
    outs = []
    for hs in ("1", "2"):
        out = tmp_path / f"o{hs}.json"
        env = dict(os.environ, PYTHONHASHSEED=hs)
        subprocess.run(
            [sys.executable, "-m", "services.cli", "sim", "run", "--trace", str(trace_path), "--replicas", "2",
             "--num-gpu-blocks", "1100", "--policies", "tao,cache_aware", "--json", str(out), "--quiet"],
            check=True, env=env, capture_output=True, cwd=Path(__file__).resolve().parents[3],
        )
        doc = json.loads(out.read_text())
        outs.append({p: {k: v for k, v in m.items() if k != "planner_time_share"}
                     for p, m in doc["policies"].items()})
    assert outs[0] == outs[1]


def test_gating_placement_is_sticky_between_pauses() -> None:
    out = run_policy(_trace(10, seed=3), "tao", SMALL)
    by_session: dict[str, list] = {}
    for r in sorted(out.run.requests, key=lambda r: (r.session_id, r.turn)):
        by_session.setdefault(r.session_id, []).append(r)
    moves_without_pause = 0
    for reqs in by_session.values():
        for prev, cur in zip(reqs, reqs[1:], strict=False):
            if cur.replica != prev.replica and not cur.after_pause:
                moves_without_pause += 1
    assert moves_without_pause == 0
    assert any(r.after_pause for r in out.run.requests)  # the tiny KV cache does force pauses


def test_round_robin_reroutes_every_request() -> None:
    trace = [_hand_session("a", [(100, 10, 0.5), (50, 10, 0.5), (50, 10, None)])]
    out = run_policy(trace, "round_robin", SMALL)
    replicas = [r.replica for r in sorted(out.run.requests, key=lambda r: r.turn)]
    assert replicas == ["r0", "r1", "r0"]


def test_closed_loop_bounds_active_sessions() -> None:
    trace = _trace(6, seed=5)
    out = run_policy(trace, "least_loaded", SimConfig(replicas=2, num_gpu_blocks=1100, concurrency=2))
    events = sorted([(s.start_s, 1) for s in out.run.sessions] + [(s.end_s, -1) for s in out.run.sessions])
    active = peak = 0
    for _, d in events:
        active += d
        peak = max(peak, active)
    assert peak <= 2
    assert len(out.run.sessions) == 6


def _run_until(sim: ClusterSim, done) -> None:  # type: ignore[no-untyped-def]
    """Process engine step events only, until ``done()``."""
    while not done():
        t, _, kind, payload = heapq.heappop(sim.heap)
        sim.now = t
        if kind == STEP_DONE:
            sim._on_step_done(*payload)


def _plan(assign: tuple[tuple[str, str], ...] = (), pauses: tuple[str, ...] = ()) -> Plan:
    return Plan(1, tuple(Assignment(a, r) for a, r in assign), pauses, (0, 0, 0), "test", 0.0, policy="test")


def _shrink(sim: ClusterSim, replica: str, kv_tokens: int) -> None:
    rep = sim.core.replicas[replica]
    sim.core.upsert_replica(replace(rep, kv_capacity_tokens=kv_tokens), sim.now)


def test_pause_semantics_acting_now_running_at_request_end() -> None:
    trace = [_hand_session("a", [(200, 5, 5.0), (10, 5, None)]),
             _hand_session("b", [(200, 400, 5.0), (10, 5, None)])]
    # tao-hold: no fast admission (CoreConfig.fast_admit), so both first requests wait for a plan
    sim = ClusterSim(trace, make_policy("tao-hold"), SMALL)
    sim.pending.extend(sim.sessions)
    sim._fill_slots()
    a, b = sim.sessions
    core = sim.core
    assert a.phase == b.phase == "WAITING" and not core.sessions["a"].admitted  # held until admitted
    sim._apply(_plan((("a", "r0"), ("b", "r0"))), sim.now)
    assert core.sessions["a"].admitted and a.phase == b.phase == "RUNNING"
    _run_until(sim, lambda: a.phase != "RUNNING")  # a's 5-token request ends, b's 400 go on
    assert a.phase == "ACTING" and b.phase == "RUNNING" and core.sessions["a"].admitted
    _shrink(sim, "r0", 32)  # r0 is now far over capacity
    sim._apply(_plan(pauses=("a", "b")), sim.now)
    assert not core.sessions["a"].admitted  # ACTING: paused at once
    assert core.sessions["b"].admitted and core.sessions["b"].pause_pending  # RUNNING: never cut
    assert {st.id: st.phase for st in sim.snapshot().sessions}["a"] == "PAUSED"
    _run_until(sim, lambda: b.phase != "RUNNING")
    assert b.phase == "ACTING" and not core.sessions["b"].admitted
    assert [r.output_tokens for r in sim.records if r.session_id == "b"] == [400]  # ran to completion


def test_pauses_already_covered_are_dropped() -> None:
    trace = [_hand_session(x, [(100, 300, 1.0), (10, 5, None)]) for x in ("a", "b", "c")]
    sim = ClusterSim(trace, make_policy("tao"), SMALL)
    sim.pending.extend(sim.sessions)
    sim._fill_slots()
    sim._apply(_plan(tuple((x, "r0") for x in ("a", "b", "c"))), sim.now)
    core = sim.core
    used = core.used["r0"]
    # over capacity by less than one footprint: one mark is enough
    _shrink(sim, "r0", int((used - 1) / SMALL.utilisation_target) + 1)
    assert 0 < core.used["r0"] - core.capacity("r0") < core.sessions["a"].footprint_tokens
    sim._apply(_plan(pauses=("a", "b", "c")), sim.now)
    assert [x for x in "abc" if core.sessions[x].pause_pending] == ["a"]
    assert sim.counters["pauses_dropped"] == 2
    sim._apply(_plan(pauses=("b",)), sim.now)  # a later plan asking again for the same excess
    assert [x for x in "abc" if core.sessions[x].pause_pending] == ["a"]


def test_without_revalidation_every_requested_pause_is_applied() -> None:
    trace = [_hand_session(x, [(100, 300, 1.0), (10, 5, None)]) for x in ("a", "b")]
    sim = ClusterSim(trace, make_policy("tao"), replace(SMALL, pause_revalidation=False))
    sim.pending.extend(sim.sessions)
    sim._fill_slots()
    sim._apply(_plan((("a", "r0"), ("b", "r0"))), sim.now)
    sim._apply(_plan(pauses=("a", "b")), sim.now)  # not even over capacity
    assert sim.core.sessions["a"].pause_pending and sim.core.sessions["b"].pause_pending


def test_oracle_readiness_comes_from_the_true_tool_end() -> None:
    trace = [_hand_session("fast", [(100, 5, 0.5), (10, 5, None)]),
             _hand_session("slow", [(100, 5, 30.0), (10, 5, None)])]
    for policy, expect_slow in (("oracle", False), ("tao", False)):
        sim = ClusterSim(trace, make_policy(policy), SMALL)
        sim.pending.extend(sim.sessions)
        sim._fill_slots()
        sim._apply(_plan((("fast", "r0"), ("slow", "r1"))), sim.now)
        _run_until(sim, lambda: all(x.phase == "ACTING" for x in sim.sessions))  # noqa: B023
        ready = {st.id: st.ready for st in sim.snapshot().sessions}
        assert ready == {"fast": True, "slow": expect_slow}, policy
    assert ClusterSim(trace, make_policy("oracle"), SMALL).truth


@pytest.mark.parametrize("policy", ["tao", "round_robin"])
def test_a_request_past_max_model_len_ends_its_session_as_vllm_400_does(policy: str) -> None:
    # SMALL: max_model_len 17,584 (1,099 usable blocks of 16). "long"'s turn 1 prompt (17,132
    # tokens) fits, but prompt + max_tokens (17,732) does not: vLLM answers 400 and the live
    # driver ends the session there, uncompleted. The simulator used to run it to the length
    # limit and count the task as completed, so its latency entered the mean only there.
    long = _hand_session("long", [(9000, 100, 5.0), (8000, 600, 1.0), (10, 10, None)])
    huge = _hand_session("huge", [(20000, 10, None)])  # a prompt past max_model_len: 400 too
    short = _hand_session("short", [(500, 50, 2.0), (300, 40, None)])
    out = run_policy([long, huge, short], policy, SMALL)
    assert out.run.incomplete == []
    assert sorted(out.run.failed) == ["huge", "long"]
    assert [s.session_id for s in out.run.sessions] == ["short"]
    assert out.metrics["completed_sessions"] == 1
    assert sorted((r.session_id, r.turn) for r in out.run.requests) == [("long", 0), ("short", 0), ("short", 1)]
    short_latency = out.run.sessions[0].end_s - out.run.sessions[0].start_s
    assert out.metrics["mean_task_latency_s"] == pytest.approx(short_latency)


def test_compare_json_shape() -> None:
    doc, outs = compare(_trace(4), ["tao", "round_robin"], SMALL, trace_name="x")
    assert set(doc) == {"config", "lower_bound", "capacity_bound", "policies"}
    assert set(doc["policies"]) == {"tao", "round_robin"}
    assert set(doc["policies"]["tao"]) == {
        "mean_task_latency_s", "p90_task_latency_s", "mean_ttft_s", "mean_ttft_after_tool_s",
        "decode_tok_s_makespan", "decode_tok_s_busy", "prefix_hit_rate", "mean_pause_wait_s", "preemptions",
        "planner_time_share", "completed_sessions", "latency_over_lower_bound", "latency_over_capacity_bound",
        "busy_over_work_bound"}
    for m in doc["policies"].values():  # Σ busy seconds <= replicas x makespan
        assert m["decode_tok_s_busy"] >= m["decode_tok_s_makespan"] / SMALL.replicas > 0
        assert m["latency_over_lower_bound"] >= 1.0
        assert m["latency_over_capacity_bound"] >= 1.0 and m["busy_over_work_bound"] >= 1.0
    assert doc["config"]["replicas"] == 2 and doc["config"]["machine"]["cpu_count"] >= 1


def test_a_session_bigger_than_the_admissible_capacity_still_runs_and_a_stall_is_reported() -> None:
    # footprint (prompt + expected output) > 0.95 x KV but within max_model_len: the router
    # core counts it as one whole replica, so TAO admits it alone and the engine serves it
    big = [_hand_session("big", [(10450, 50, None)])]
    cfg = SimConfig(replicas=1, num_gpu_blocks=700, stall_timeout_s=30.0)
    out = run_policy(big, "tao", cfg)
    assert out.run.incomplete == [] and out.metrics["completed_sessions"] == 1
    # ThunderAgent's scheduler wants room for tokens + its 100-token buffer and only
    # force-resumes after 30 minutes: on TAO's reservations against 95 % of the cache that room
    # never comes, and past the stall timeout the run is reported, not hung
    out = run_policy(big, "thunderagent-reserved", cfg)
    assert out.run.stalled and out.run.incomplete == ["big"]
    assert out.metrics["completed_sessions"] == 0
    # counted as ThunderAgent counts (the prompt, against the whole cache) it fits and runs
    out = run_policy(big, "thunderagent", cfg)
    assert not out.run.stalled and out.run.incomplete == [] and out.metrics["completed_sessions"] == 1
    # a per-request router just queues it in vLLM, which serves it
    assert run_policy(big, "round_robin", cfg).run.incomplete == []


def test_sessions_ended_by_vllms_400_count_as_progress() -> None:
    """Three sessions whose first prompt is past ``max_model_len``, one worker, ThunderAgent:
    each waits its 30-minute force-resume, then gets vLLM's 400. Before 2026-12-05 a session
    ending that way did not count as progress, so the third one, force-resumed an hour after the
    last step, was reported as a stall (found by the capacity bound's property test)."""
    trace = [_hand_session(f"s{i}", [(6000, 50, None)]) for i in range(3)]  # 6,000 > 300 blocks · 16
    cfg = SimConfig(replicas=1, num_gpu_blocks=300, concurrency=1)
    out = run_policy(trace, "thunderagent", cfg)
    assert not out.run.stalled and out.run.incomplete == []
    assert out.run.failed == ["s0", "s1", "s2"] and out.run.sim_end_s == pytest.approx(3 * 1800.0, abs=5.0)


def test_oracle_remaining_ranks_ready_sessions_by_their_true_remaining_work() -> None:
    from services.common.core.evidence import CacheEvidence
    from services.planner.core.model import ReplicaState, SessionState, Snapshot
    from services.sim.cluster.oracle import RemainingOraclePolicy, RemainingWork

    # room for one of four equal ready sessions; "b" holds a little cache credit, so `tao`
    # (readiness, then credit) takes it; the oracle takes "d", which has the least work left
    snap = Snapshot(100.0, (ReplicaState("r0", 1000, 0),), tuple(
        SessionState(sid, "t", 900, True, phase="WAITING",
                     credits=(CacheEvidence.of_credit("r0", 100, 100.0),) if sid == "b" else ())
        for sid in "abcd"))
    work = {"a": 5, "b": 9, "c": 3, "d": 1}  # turns left, 1,000 tokens of context each
    oracle = RemainingOraclePolicy()
    oracle.remaining_work = lambda sid: RemainingWork(1000, 0.0, ((10, 50, 2.0),) * work[sid])
    assert [a.session for a in make_policy("tao").plan(snap).assignments] == ["b"]
    assert [a.session for a in oracle.plan(snap).assignments] == ["d"]
    # each turn adds KV held through its decode and its tool: more turns, a larger index
    idx = {sid: oracle.kv_seconds(oracle.remaining_work(sid)) for sid in work}  # type: ignore[arg-type]
    assert sorted(idx, key=idx.__getitem__) == ["d", "c", "a", "b"]
    # without the simulator's truth it is `tao`, as the oracle is
    assert [a.session for a in RemainingOraclePolicy().plan(snap).assignments] == ["b"]


def test_the_simulator_tells_oracle_remaining_what_is_left_of_each_session() -> None:
    from services.sim.cluster.oracle import RemainingOraclePolicy, RemainingWork

    trace = [_hand_session("a", [(100, 5, 10.0), (10, 5, 2.0), (20, 6, None)])]
    policy = make_policy("oracle-remaining")
    assert isinstance(policy, RemainingOraclePolicy)
    sim = ClusterSim(trace, policy, SMALL)
    assert policy.remaining_work is not None
    assert policy.remaining_work("a") is None  # not started yet
    sim.pending.extend(sim.sessions)
    sim._fill_slots()
    sim._apply(_plan((("a", "r0"),)), sim.now)
    _run_until(sim, lambda: sim.by_id["a"].phase == "ACTING")
    s = sim.by_id["a"]
    assert policy.remaining_work("a") == RemainingWork(s.context_tokens, pytest.approx(s.tool_end_s - sim.now),
                                                       ((10, 5, 2.0), (20, 6, 0.0)))
    assert s.context_tokens == 32 + 100 + 5 and s.tool_end_s - sim.now == pytest.approx(10.0)
    assert "oracle-remaining" in POLICIES and run_policy(trace, "oracle-remaining", SMALL).run.incomplete == []


def test_the_oracle_sees_the_exact_size_of_each_next_request() -> None:
    # turn 1 appends 700 tokens and answers 300; after turn 0 (100 + 32 in, 5 out) `tao`'s
    # footprint is its estimate (no append sample yet, output EWMA = 5); the oracle's is exact.
    # Both reserve the 32-token system prompt once on the replica (docs/algorithms.md#footprint),
    # so the admitted session's footprint is without it and the replica counts it once.
    trace = [_hand_session("a", [(100, 5, 10.0), (700, 300, 2.0), (20, 6, None)])]
    for policy, expected in (("tao", 137 + 0 + 5), ("oracle", 137 + 700 + 300)):
        sim = ClusterSim(trace, make_policy(policy), SMALL)
        sim.pending.extend(sim.sessions)
        sim._fill_slots()
        sim._apply(_plan((("a", "r0"),)), sim.now)
        _run_until(sim, lambda: sim.by_id["a"].phase == "ACTING")  # noqa: B023
        assert sim.core.sessions["a"].footprint_tokens == expected - 32, policy
        assert sim.core.sessions["a"].shared_tokens == 32, policy
        assert sim.core.used["r0"] == expected, policy
        sim.core.reveal_next_request("unknown", 1, 1)  # ignored
        assert set(sim.core.sessions) == {"a"}
    out = run_policy(trace, "oracle", SMALL)
    assert out.run.incomplete == [] and out.metrics["completed_sessions"] == 1


def test_tao_reserves_a_shared_system_prompt_once_on_a_small_cache() -> None:
    """Three sessions whose 6,000-token system prompt is shared, on one replica of 16,000 KV
    tokens (15,200 admissible): a first request's footprint is 6,400 prompt + 256 expected
    output, so counted once per session two fit (13,312), counted once per replica all three do
    (6,000 + 3 × 656: the first plan admits two at full price, the next one the third beside the
    copy they hold). ``tao-per-session`` keeps the third waiting (docs/algorithms.md#footprint)."""
    def session(sid: str) -> TraceSession:
        return TraceSession.model_validate({
            "session_id": sid, "tenant": "t", "arrival_s": 0.0, "system_prompt_tokens": 6_000,
            "shared_prefix_id": "harness",
            "turns": [{"append_tokens": 400, "output_tokens": 200,
                       "tool": {"name": "bash", "command": "make test", "duration_s": 1.0}},
                      {"append_tokens": 300, "output_tokens": 200, "tool": None}],
        })

    cfg = SimConfig(replicas=1, profile="qwen3-32b-h100x2", num_gpu_blocks=1_000, tick_s=0.5)
    trace = [session(f"s{i}") for i in range(3)]
    peak: dict[str, int] = {}
    for name in ("tao", "tao-per-session"):
        sim = ClusterSim(trace, make_policy(name), cfg)
        apply = sim._apply

        def counting(plan: Plan, at: float, sim: ClusterSim = sim, apply=apply, name: str = name) -> None:  # type: ignore[no-untyped-def]
            apply(plan, at)
            peak[name] = max(peak.get(name, 0), sum(1 for s in sim.core.sessions.values() if s.admitted))

        sim._apply = counting  # type: ignore[method-assign]
        run = sim.run()
        assert run.incomplete == [] and not run.stalled, name
    assert peak == {"tao": 3, "tao-per-session": 2}
    assert make_policy("tao").shares_prefixes_below_tokens >= 16_000  # type: ignore[attr-defined]


def test_the_simulator_counts_thunderagent_as_thunderagent_does_and_runs_it_to_the_end() -> None:
    """``thunderagent``'s core counts program tokens against the whole KV cache (its
    ``total_tokens_capacity``); ``thunderagent-reserved`` TAO's footprints against the configured
    fraction; both complete every session of a contended trace."""
    trace = _trace(8)
    published = ClusterSim(trace, make_policy("thunderagent"), SMALL)
    reserved = ClusterSim(trace, make_policy("thunderagent-reserved"), SMALL)
    assert published.core.config.accounting == "program" and reserved.core.config.accounting == "reservation"
    published.run()
    reserved.run()
    engine = published.replicas[0].engine
    kv = engine.num_gpu_blocks * engine.block_size
    assert published.core.capacity("r0") == kv
    assert reserved.core.capacity("r0") == int(kv * SMALL.utilisation_target)
    for sim in (published, reserved):
        assert len(sim.done) == len(trace) and not sim.failed
