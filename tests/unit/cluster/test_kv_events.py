"""Dynamo's KV-router cost (``cache_aware``) on the replicas' real prefix residency.

The simulated per-request router gets, for every held request, the leading blocks of its prompt
each replica's engine holds (KV events, ``services.sim.cluster.kv_events``). Before that the policy only
saw the session's own usage-derived evidence, which (a) never credits a prefix another session
left behind (a common system prompt) and (b) still claims the whole last context after the
engine has evicted it. Both scenarios below routed the wrong way on that evidence.
"""

from __future__ import annotations

from services.common.core.evidence import CacheEvidence
from services.planner.core.model import ReplicaState, SessionState, Snapshot
from services.planner.core.registry import make_policy
from services.sim.cluster import SimConfig
from services.sim.cluster.kv_events import with_kv_events
from services.sim.cluster.metrics import RequestRecord
from services.sim.cluster.runner import run_policy
from services.sim.engine import Engine, EngineRequest, get_profile
from services.sim.engine.tokens import ChainCache
from services.sim.workload.trace import TraceSession

TINY = SimConfig(replicas=2, profile="qwen3-32b-h100x2", num_gpu_blocks=1100, tick_s=0.5)


def _session(sid: str, arrival: float, turns: list[tuple[int, int, float | None]],
             shared: str | None = None, system: int = 0) -> TraceSession:
    return TraceSession.model_validate({
        "session_id": sid, "tenant": "t", "arrival_s": arrival, "system_prompt_tokens": system,
        "shared_prefix_id": shared,
        "turns": [{"append_tokens": a, "output_tokens": o,
                   "tool": None if d is None else {"name": "bash", "command": f"sleep {d}", "duration_s": d}}
                  for a, o, d in turns],
    })


def _records(trace: list[TraceSession], policy: str = "cache_aware") -> dict[tuple[str, int], RequestRecord]:
    out = run_policy(trace, policy, TINY)
    assert out.run.incomplete == []
    return {(r.session_id, r.turn): r for r in out.run.requests}


def test_a_new_session_goes_where_its_shared_system_prompt_is_cached() -> None:
    """w (no shared prefix) takes r0 at t=0 (equal costs, lowest id), x (4000-token system
    prompt "sys") then takes r1 (r0 carries w's blocks). At t=30 both idle; y, behind the same
    system prompt, has 250 of its blocks cached on r1 and none on r0: Dynamo's overlap picks
    r1 (cost 2 + 257 against 257 + 257). Without the KV events y had no evidence anywhere and
    went to r0 (the tie), recomputing the 4000 tokens r1 held."""
    trace = [
        _session("w", 0.0, [(500, 10, 100.0), (10, 5, None)]),
        _session("x", 0.0, [(100, 10, 100.0), (10, 5, None)], shared="sys", system=4000),
        _session("y", 30.0, [(100, 10, None)], shared="sys", system=4000),
    ]
    rec = _records(trace)
    assert rec[("w", 0)].replica == "r0" and rec[("x", 0)].replica == "r1"
    assert rec[("y", 0)].replica == "r1"
    assert rec[("y", 0)].cached_tokens == 4000


def test_a_returning_session_is_not_held_to_an_evicted_context() -> None:
    """a (6000-token context) ran on r0 and acts for 60 s. c (16000 tokens) and then d (3000
    tokens, a long decode) run on r0 and evict all of a's blocks there (1100 blocks per replica).
    When a returns, r0 still runs d and r1 is idle; neither holds a's prefix, so Dynamo's cost is
    load alone and picks r1. The usage evidence still said "6010 tokens resident on r0", and
    the cost sent a to the busy r0 for a prefix that was gone (0 tokens cached there either way)."""
    trace = [
        _session("a", 0.0, [(6000, 10, 60.0), (100, 10, None)]),
        _session("c", 10.0, [(16000, 10, None)]),
        _session("d", 40.0, [(3000, 2000, None)]),
    ]
    rec = _records(trace)
    assert rec[("a", 0)].replica == "r0" and rec[("c", 0)].replica == "r0" and rec[("d", 0)].replica == "r0"
    back = rec[("a", 1)]
    assert back.ready_s < rec[("d", 0)].end_s  # d still runs on r0 when a returns
    assert back.replica == "r1" and back.cached_tokens == 0


def test_with_kv_events_credits_every_replica_of_held_sessions_only() -> None:
    chains = ChainCache()
    profile = get_profile("qwen3-32b-h100x2")
    engines = {"r0": Engine(profile, num_gpu_blocks=200), "r1": Engine(profile, num_gpu_blocks=200)}
    warm = engines["r1"]
    warm.add_request(EngineRequest("p", chains.synthetic("s", "sys", 64), 100, 4))
    while warm.has_work():
        warm.step()
    usage_before = (warm.free_blocks, list(warm.pool.free_queue), warm.prefix_cache_queries)
    held = SessionState("s", "t", 300, True, credits=(CacheEvidence.of_credit("r0", 900, 1.0),), waiting_since_s=5.0)
    acting = SessionState("q", "t", 300, False, phase="ACTING")
    snap = Snapshot(7.0, (ReplicaState("r0", 3000, 0), ReplicaState("r1", 3000, 0)), (held, acting))
    prompts = {"s": (chains.synthetic("s", "sys", 64), 150)}
    out = with_kv_events(snap, prompts.get, engines)
    s, q = out.sessions
    assert q == acting
    # s's first prompt computed 103 tokens on r1 (its last output is sampled, never computed):
    # 6 full blocks; the 150-token request's 9 full blocks start with those 6.
    assert {c.replica: (c.credit_tokens, c.observed_at_s) for c in s.credits if c.kind == "kv_events"} == {
        "r0": (0, 7.0), "r1": (96, 7.0)}
    assert CacheEvidence.of_credit("r0", 900, 1.0) in s.credits  # the router's own evidence stays (fallback)
    assert (warm.free_blocks, list(warm.pool.free_queue), warm.prefix_cache_queries) == usage_before
    # every full block of the query counts (the router matches them all; vLLM's scheduler
    # would recompute the last one of a 96-token prompt)
    content = chains.synthetic("s", "sys", 64)
    assert warm.resident_prefix_blocks(content, 96) == 6 and warm.cached_prefix_tokens(content, 96) == 80
    # the policy reads the strongest kind: the stale 900 tokens on r0 no longer count
    plan = make_policy("cache_aware").plan(out)
    assert {a.session: a.replica for a in plan.assignments} == {"s": "r1"}


def test_pool_sessions_get_kv_events_credit_for_gating_policies() -> None:
    """``only_held=False`` (``SimConfig.kv_events_credit``): every session between requests is
    credited, admitted or not (the live router refreshes every idle session, so admitted and pool
    sessions compare on the same evidence), a running one never; ``ClusterSim`` hands its gating
    policy such snapshots."""
    from services.sim.cluster.simulator import ClusterSim, SimConfig

    chains = ChainCache()
    profile = get_profile("qwen3-32b-h100x2")
    engines = {"r0": Engine(profile, num_gpu_blocks=200)}
    eng = engines["r0"]
    eng.add_request(EngineRequest("p", chains.synthetic("q", None, 0), 100, 4))
    while eng.has_work():
        eng.step()
    acting = SessionState("q", "t", 300, False, phase="ACTING")
    admitted = SessionState("a", "t", 300, False, phase="ACTING", admitted=True, replica="r0")
    running = SessionState("b", "t", 300, False, phase="RUNNING", admitted=True, replica="r0")
    snap = Snapshot(7.0, (ReplicaState("r0", 3000, 0),), (acting, admitted, running))
    content = chains.synthetic("q", None, 0)
    prompts = {"q": (content, 100), "a": (content, 100), "b": (content, 100)}
    assert with_kv_events(snap, prompts.get, engines) == snap  # held sessions only: nothing here
    q, a, b = with_kv_events(snap, prompts.get, engines, only_held=False).sessions
    assert [(c.replica, c.credit_tokens, c.kind) for c in q.credits] == [("r0", 96, "kv_events")]
    assert [(c.replica, c.credit_tokens, c.kind) for c in a.credits] == [("r0", 96, "kv_events")]
    assert b == running

    trace = [_session("x", 0.0, [(2000, 10, 5.0), (100, 10, None)]), _session("y", 1.0, [(3000, 10, None)])]
    seen: list[int] = []
    sim = ClusterSim(trace, make_policy("tao"), SimConfig(replicas=1, num_gpu_blocks=260, kv_events_credit=True))
    inner = sim.policy.annotate
    assert inner is not None
    def counting(snap: Snapshot) -> Snapshot:
        out = inner(snap)
        seen.append(sum(c.kind == "kv_events" for ses in out.sessions for c in ses.credits))
        return out

    sim.policy.annotate = counting
    sim.run()
    assert max(seen) > 0  # some plan saw kv_events credit
