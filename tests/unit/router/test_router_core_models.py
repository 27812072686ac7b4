"""The router's side of model-aware placement and of the replicas' block size (issue 16 items 2
and 3): requests and sessions carry their model, only replicas serving it are granted, routed
or assigned, and the block size a replica's /metrics reports is what its record carries."""

from __future__ import annotations

from services.common.vocabulary import DEFAULT_BLOCK_SIZE
from services.planner.core.registry import make_policy
from services.router.core.breaker import Breaker
from services.router.core.explain import explain_session, session_row
from services.router.core.hold import STUCK, hold_kind
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.snapshot import build_snapshot
from services.router.core.state import RouterCore
from services.router.replicas import ReplicaEntry, ReplicaRegistry, parse_vllm_metrics

CACHE_INFO = ('vllm:cache_config_info{block_size="%d",cache_dtype="auto",engine="0",num_gpu_blocks="%d"} 1.0\n'
              'vllm:num_requests_running{engine="0"} 2.0\n')


def rep(rid: str, *models: str, block_size: int = DEFAULT_BLOCK_SIZE) -> Replica:
    return Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=100_000, healthy=True, models=models,
                   block_size=block_size)


def core_with(gating: bool, policy: str | None = None) -> RouterCore:
    core = RouterCore(CoreConfig(gating=gating, sticky=gating), make_policy(policy) if policy else None)
    core.upsert_replica(rep("a0", "m-a"), 0.0)
    core.upsert_replica(rep("b0", "m-b", "alias-b", block_size=32), 0.0)
    core.upsert_replica(rep("a1", "m-a"), 0.0)
    return core


def ask(rid: str, sid: str, model: str) -> NewRequest:
    return NewRequest(rid, sid, "A", False, 100, 10, model)


def test_per_request_routing_and_its_fallback_keep_to_serving_replicas() -> None:
    for policy in ("round_robin", "least_loaded", "cache_aware"):
        core = core_with(gating=False, policy=policy)
        for i in range(6):
            model = ("m-a", "m-b", "alias-b")[i % 3]
            g = core.arrive(float(i), ask(f"q{i}", f"s{i}", model))
            assert g is not None and core.replicas[g.replica].serves(model), (policy, model, g)
        # a model nobody serves is never routed: held, and why is said
        assert core.arrive(9.0, ask("q9", "s9", "m-z")) is None
        assert core.last_reject["s9"] == "no healthy replica serves model m-z"
        assert hold_kind(core, "q9", plans_live=True)[0] == STUCK


def test_gating_grants_and_revalidation_refuse_a_replica_that_does_not_serve_the_model() -> None:
    core = core_with(gating=True)
    assert core.arrive(0.0, ask("q0", "s", "m-b")) is None
    report = core.apply_plan(1.0, PlanDecision((("s", "a0"),), (), 1.0, "planner"))
    assert report.rejected == (("s", "replica a0 does not serve model m-b"),)
    assert core.apply_plan(1.0, PlanDecision((("s", "b0"),), (), 1.0, "planner")).admitted == (("s", "b0"),)
    grants = core.dispatch(1.0)
    assert [g.replica for g in grants] == ["b0"]
    core.finish(2.0, "q0", Usage(100, 10))
    # the session's next request names another model: its replica does not serve it, so it
    # leaves that replica and waits for a placement on one that does
    assert core.arrive(3.0, ask("q1", "s", "m-a")) is None
    s = core.sessions["s"]
    assert not s.admitted and s.model == "m-a"
    assert core.apply_plan(4.0, PlanDecision((("s", "a1"),), (), 4.0, "planner")).admitted == (("s", "a1"),)
    assert [g.replica for g in core.dispatch(4.0)] == ["a1"]


def test_the_snapshot_carries_models_block_sizes_and_the_sessions_model() -> None:
    core = core_with(gating=True)
    core.arrive(0.0, ask("q0", "s", "alias-b"))
    snap = build_snapshot(core, 1.0, {})
    snap.validate()
    by_id = {r.id: r for r in snap.replicas}
    assert by_id["b0"].models == ("m-b", "alias-b") and by_id["b0"].block_size == 32
    assert by_id["a0"].block_size == DEFAULT_BLOCK_SIZE
    assert snap.sessions[0].model == "alias-b"
    plan = make_policy("tao").plan(snap)
    assert [(a.session, a.replica) for a in plan.assignments] == [("s", "b0")]


def test_block_size_from_cache_config_info() -> None:
    m = parse_vllm_metrics(CACHE_INFO % (32, 1000))
    assert (m.block_size, m.kv_capacity_tokens, m.running) == (32, 32_000, 2)
    assert parse_vllm_metrics('vllm:num_requests_running{engine="0"} 1.0\n').block_size == 0
    assert parse_vllm_metrics(CACHE_INFO.replace('block_size="%d"', 'block_size="x"') % 5).block_size == 0

    registry = ReplicaRegistry(lambda e: None, lambda: 0.0, interval_s=1.0, timeout_s=1.0,
                               default_kv_tokens=0, breaker=Breaker())
    entry = ReplicaEntry("r", "http://r:1")
    assert entry.view().block_size == DEFAULT_BLOCK_SIZE  # unknown until a scrape says it
    registry._apply_metrics(entry, parse_vllm_metrics(CACHE_INFO % (32, 1000)))
    assert entry.view().block_size == 32 and entry.view().kv_capacity_tokens == 32_000
    registry._apply_metrics(entry, parse_vllm_metrics('vllm:num_requests_running{engine="0"} 1.0\n'))
    assert entry.view().block_size == 32  # a scrape without the info keeps the last size


def test_explain_says_no_replica_serves_the_sessions_model() -> None:
    core = core_with(gating=True)
    core.arrive(0.0, ask("q0", "s", "m-z"))
    why = explain_session(core, "s", 1.0, 1.0)
    assert why.constraint == "no_replica" and why.reason == "no replica that takes sessions serves model m-z"
    assert not any(c.takes_sessions for c in why.credits)
    core.arrive(0.0, ask("q1", "t", "m-a"))
    assert {c.replica for c in explain_session(core, "t", 1.0, 1.0).credits if c.takes_sessions} == {"a0", "a1"}
    assert session_row(core, "t", 1.0)["model"] == "m-a"  # GET /v1/sessions


def test_a_session_bigger_than_its_models_replicas_counts_as_one_of_them() -> None:
    core = RouterCore(CoreConfig(gating=True, target_utilisation=1.0))
    core.upsert_replica(Replica(id="small", url="http://small", kv_capacity_tokens=10_000, healthy=True,
                                models=("m-a",)), 0.0)
    core.upsert_replica(Replica(id="big", url="http://big", kv_capacity_tokens=40_000, healthy=True,
                                models=("m-b",)), 0.0)
    core.arrive(0.0, NewRequest("q0", "s", "A", False, 20_000, 100, "m-a"))
    assert core.sessions["s"].footprint_tokens == 10_000  # its model's largest replica, not the fleet's
    plan = make_policy("tao").plan(build_snapshot(core, 1.0, {}))
    assert [(a.session, a.replica) for a in plan.assignments] == [("s", "small")]


def test_sessions_leave_a_replica_that_stops_serving_their_model() -> None:
    core = core_with(gating=True)
    core.arrive(0.0, ask("q0", "s", "alias-b"))
    core.arrive(0.0, ask("q1", "t", "m-b"))
    core.apply_plan(1.0, PlanDecision((("s", "b0"), ("t", "b0")), (), 1.0, "planner"))
    assert len(core.dispatch(1.0)) == 2
    core.finish(2.0, "q0", Usage(100, 10))  # s idle between requests, t still running
    core.upsert_replica(rep("b0", "m-b", block_size=32), 3.0)  # restarted without the alias
    s, t = core.sessions["s"], core.sessions["t"]
    assert not s.admitted and s.replica is None  # back to the pool
    assert t.admitted and not t.pause_pending  # m-b is still served there
    core.upsert_replica(rep("b0", "m-c", block_size=32), 4.0)
    t = core.sessions["t"]
    assert t.admitted and t.pause_pending  # leaves when its request ends
    core.finish(5.0, "q1", Usage(100, 10))
    assert not core.sessions["t"].admitted
