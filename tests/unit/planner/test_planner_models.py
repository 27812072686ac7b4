"""Model eligibility in the planner (issue 16 item 2) and the replicas' own block size (item 3).

Only replicas serving a session's model are eligible: the DP is the optimum over those
placements (brute force), a warm cache on a replica of another model never attracts a
session, and every baseline keeps to the serving replicas. ``cache_aware`` counts blocks
with each replica's block size.
"""

from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import pytest
from planner_brute import brute_force

from services.common.core.evidence import CacheEvidence
from services.common.vocabulary import DEFAULT_BLOCK_SIZE, serves_model
from services.planner.core import make_policy
from services.planner.core.continuum import ContinuumPolicy
from services.planner.core.explain import explain
from services.planner.core.model import ReplicaState, SessionState, Snapshot, SnapshotError
from services.planner.core.policy import plan_pauses, pool_candidates, room_after_pauses, serving_mask
from services.planner.core.routers import CacheAwarePolicy, LeastLoadedPolicy, RoundRobinPolicy
from services.planner.core.tao import TAO_PAPER, TaoPolicy
from services.planner.core.thunderagent import ThunderAgentPolicy
from services.planner.core.values import fold_values

MODELS = (("m1",), ("m2",), ("m1", "m2"))


def _random_snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    n, m = rng.randint(1, 3), rng.randint(1, 6)
    replicas = tuple(ReplicaState(f"r{j}", rng.choice([40, 100, 160]), rng.choice([0, 20, 60]),
                                  healthy=rng.random() < 0.9, models=rng.choice(MODELS)) for j in range(n))
    sessions = tuple(
        SessionState(f"s{i}", "t", rng.choice([10, 25, 40, 70]), rng.random() < 0.5,
                     credits=tuple(CacheEvidence.of_credit(f"r{rng.randrange(n)}", rng.choice([10, 30, 60]), 99.0)
                                   for _ in range(rng.randint(0, 2))),
                     phase=rng.choice(["WAITING", "ACTING", "PAUSED"]), model=rng.choice(["", "m1", "m2"]))
        for i in range(m))
    return Snapshot(100.0, replicas, sessions)


def _optimum(snapshot: Snapshot) -> tuple[int, int, int]:
    """Brute force of (Σk, Σr, Σf) over placements on healthy replicas serving the model."""
    replicas = tuple(sorted(snapshot.replicas, key=lambda r: r.id))
    pool = pool_candidates(snapshot)
    values = fold_values(snapshot.now_s, pool, replicas)
    healthy = np.array([r.healthy for r in replicas], dtype=np.bool_)
    eligible = healthy[None, :] & serving_mask(pool, replicas)
    free = np.maximum(room_after_pauses(replicas, plan_pauses(snapshot, "tao").freed_tokens), 0)
    return brute_force(values, eligible, values.footprint, free)


@pytest.mark.parametrize("seed", range(60))
def test_the_dp_is_the_optimum_over_serving_replicas(seed: int) -> None:
    snapshot = _random_snapshot(seed)
    by_id = {r.id: r for r in snapshot.replicas}
    sessions = {s.id: s for s in snapshot.sessions}
    for sparse in (True, False):  # token-resolution DP, and the quantised DP with its guard
        plan = TaoPolicy("tao-paper", dataclasses.replace(TAO_PAPER, sparse=sparse)).plan(snapshot)
        for a in plan.assignments:
            assert by_id[a.replica].serves(sessions[a.session])
        if sparse:
            assert plan.objective == _optimum(snapshot)
        else:
            assert plan.objective <= _optimum(snapshot)


def test_a_warm_cache_on_another_models_replica_does_not_attract_the_session() -> None:
    r0 = ReplicaState("r0", 1000, 0, models=("m1",))
    r1 = ReplicaState("r1", 1000, 350, models=("m2",))
    warm = SessionState("s0", "t", 500, True, credits=(CacheEvidence.of_credit("r0", 900, 99.0),), model="m2",
                        waiting_since_s=1.0)
    other = SessionState("s1", "t", 500, True, model="m2", waiting_since_s=2.0)
    for name in ("tao", "tao-paper", "tao-bfd", "sjf", "thunderagent", "continuum"):
        plan = make_policy(name).plan(Snapshot(100.0, (r0, r1), (warm, other)))
        # r1 has room for one of the two m2 sessions; r0 serves m1 only, whatever the credit there
        assert [a.replica for a in plan.assignments] == ["r1"], name
    # without models the credit wins: the same snapshot places s0 on r0
    plain = Snapshot(100.0, (dataclasses.replace(r0, models=()), dataclasses.replace(r1, models=())),
                     (dataclasses.replace(warm, model=""), dataclasses.replace(other, model="")))
    assert ("s0", "r0") in {(a.session, a.replica) for a in make_policy("tao").plan(plain).assignments}


def test_round_robin_cycles_over_the_serving_replicas_only() -> None:
    reps = (ReplicaState("r0", 100, 0, models=("m1",)), ReplicaState("r1", 100, 0, models=("m2",)),
            ReplicaState("r2", 100, 0, models=("m1",)))
    held = tuple(SessionState(f"s{i}", "t", 10, True, waiting_since_s=float(i), model=m)
                 for i, m in enumerate(["m1", "m1", "m2", "m1", "m3"]))
    plan = RoundRobinPolicy().plan(Snapshot(10.0, reps, held))
    assert {a.session: a.replica for a in plan.assignments} == {"s0": "r0", "s1": "r2", "s2": "r1", "s3": "r2"}


def test_least_loaded_and_cache_aware_pick_among_serving_replicas() -> None:
    busy = ReplicaState("r0", 1000, 900, running=9, models=("m2",))
    idle = ReplicaState("r1", 1000, 0, models=("m1",))
    s = SessionState("s0", "t", 100, True, credits=(CacheEvidence.of_credit("r1", 100, 9.0),), model="m2",
                     waiting_since_s=9.0, context_tokens=100)
    for policy in (LeastLoadedPolicy(), CacheAwarePolicy()):
        plan = policy.plan(Snapshot(10.0, (busy, idle), (s,)))
        assert [(a.session, a.replica) for a in plan.assignments] == [("s0", "r0")]
        nowhere = policy.plan(Snapshot(10.0, (busy, idle), (dataclasses.replace(s, model="m3"),)))
        assert nowhere.assignments == ()


def test_cache_aware_counts_blocks_with_each_replicas_block_size() -> None:
    # Same load in tokens; r1's 32-token blocks make its active and prefill block counts half
    # of r0's, so Dynamo's cost (prefill + active + request blocks) prefers r1 (60 vs 30 blocks).
    r0 = ReplicaState("r0", 10_000, 320)
    r1 = ReplicaState("r1", 10_000, 320, block_size=32)
    s = SessionState("s0", "t", 320, True, waiting_since_s=1.0, context_tokens=320)
    assert [a.replica for a in CacheAwarePolicy().plan(Snapshot(2.0, (r0, r1), (s,))).assignments] == ["r1"]
    # one block size for the fleet (Dynamo's --kv-cache-block-size): a tie, broken by id
    fixed = CacheAwarePolicy(block_tokens=16)
    assert [a.replica for a in fixed.plan(Snapshot(2.0, (r0, r1), (s,))).assignments] == ["r0"]
    # overlap is counted in whole blocks of the replica: 40 cached tokens are 2 blocks of 16
    # (32 tokens) on r0 but 1 block of 32 on r1
    warm = dataclasses.replace(s, credits=(CacheEvidence.of_credit("r0", 40, 1.0), CacheEvidence.of_credit("r1", 40, 1.0)))
    assert [a.replica for a in CacheAwarePolicy().plan(Snapshot(2.0, (r0, r1), (warm,))).assignments] == ["r1"]


def test_thunderagent_places_new_and_resumed_programs_on_serving_replicas() -> None:
    roomy = ReplicaState("r0", 10_000, 0, models=("m1",))
    small = ReplicaState("r1", 2_000, 0, models=("m2",))
    fresh = SessionState("new", "t", 500, True, waiting_since_s=1.0, model="m2")
    plan = ThunderAgentPolicy().plan(Snapshot(2.0, (roomy, small), (fresh,)))
    assert [(a.session, a.replica) for a in plan.assignments] == [("new", "r1")]
    # resume tick: the m2 pool fits r1 only up to its own capacity (the m1 replica's room does
    # not count for m2); smallest first, so b (800) goes and c (1500) waits
    paused = tuple(SessionState(sid, "t", f, False, credits=(CacheEvidence.of_credit("r1", 10, 1.0),), phase="PAUSED",
                                model="m2") for sid, f in (("b", 800), ("c", 1500)))
    plan = ThunderAgentPolicy().plan(Snapshot(2.0, (roomy, small), paused))
    assert [(a.session, a.replica) for a in plan.assignments] == [("b", "r1")]


def test_continuum_head_of_line_blocking_is_per_model() -> None:
    full = ReplicaState("r0", 1_000, 900, models=("m1",))
    free = ReplicaState("r1", 1_000, 0, models=("m2",))
    head = SessionState("head", "t", 500, True, waiting_since_s=1.0, model="m1")
    behind = SessionState("behind", "t", 500, True, waiting_since_s=2.0, model="m2")
    plan = ContinuumPolicy().plan(Snapshot(3.0, (full, free), (head, behind)))
    assert [(a.session, a.replica) for a in plan.assignments] == [("behind", "r1")]
    # one model: the head that does not fit blocks the queue (Continuum's FCFS)
    same = dataclasses.replace(behind, model="m1")
    both = ReplicaState("r1", 1_000, 900, models=("m1",))
    assert ContinuumPolicy().plan(Snapshot(3.0, (full, both), (head, same))).assignments == ()


def test_explain_names_a_model_no_healthy_replica_serves() -> None:
    snap = Snapshot(1.0, (ReplicaState("r0", 100, 0, models=("m1",)),),
                    (SessionState("s0", "t", 10, True, model="m2"),))
    plan = make_policy("tao").plan(snap)
    assert plan.assignments == ()
    why = explain(snap, plan, "s0")
    assert why.reason == "no healthy replica serves model 'm2'" and not why.values[0].eligible


def test_snapshot_json_carries_models_block_size_and_model() -> None:
    snap = Snapshot(1.0, (ReplicaState("r0", 100, 0, models=("a", "b"), block_size=32),),
                    (SessionState("s0", "t", 10, True, model="b"),))
    data = snap.to_json()
    assert data["replicas"][0]["models"] == ["a", "b"] and data["replicas"][0]["block_size"] == 32
    assert Snapshot.from_json(data) == snap
    old = {"now_s": 1.0, "replicas": [{"id": "r0", "capacity_tokens": 1, "used_tokens": 0}],
           "sessions": [{"id": "s0", "tenant": "t", "footprint_tokens": 1, "ready": True}]}
    parsed = Snapshot.from_json(old)  # written before models existed: any model, block size 16
    assert parsed.replicas[0].models == () and parsed.replicas[0].block_size == DEFAULT_BLOCK_SIZE
    assert parsed.sessions[0].model == ""
    for bad, where in ((("models", ["a", ""]), "replicas[0].models"), (("block_size", 0), "replicas[0].block_size"),
                       (("models", "a"), "replicas[0].models")):
        broken = {**old, "replicas": [{**old["replicas"][0], bad[0]: bad[1]}]}
        with pytest.raises(SnapshotError, match=re.escape(where)):
            Snapshot.from_json(broken)
    with pytest.raises(SnapshotError, match=r"sessions\[0\]\.model"):
        Snapshot.from_json({**old, "sessions": [{**old["sessions"][0], "model": 3}]})


def test_the_eligibility_rule() -> None:
    assert serves_model(("a",), "a") and serves_model((), "") and serves_model(("a",), "")
    assert not serves_model((), "a") and not serves_model(("b",), "a")
