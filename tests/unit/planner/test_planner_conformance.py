"""Every registered policy through the same invariants (STYLE: explicit registries, conformance).

Admission-gating policies: on each healthy replica the footprints newly admitted fit in
capacity − used + footprints of the ACTING sessions the plan pauses there (``tao-lend``: plus
those of the ACTING sessions not ready whose tool is predicted back later, which it may lend). Per-request
routers: every held request that a healthy replica serving its model exists for is routed
exactly once, to a healthy replica, and nothing else. All: no session twice, nothing on an
unhealthy replica or on one that does not serve the session's model, pauses only of admitted sessions,
deterministic (fresh instances, same snapshots -> same plans) and independent of the order
of the snapshot's lists, objective = the full TAO value of the assignments.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.planner.instances import random_snapshot
from services.common.core.evidence import CacheEvidence
from services.planner.core import POLICIES, Plan, Snapshot, UnknownPolicyError, make_policy
from services.planner.core.model import ReplicaState, SessionState
from services.planner.core.policy import CANDIDATE_PHASES, full_objective

TAO_FAMILY = ("tao", "tao-no-decay", "tao-no-readiness", "tao-bfd", "tao-ta-pause", "sjf")


def _sequence(seed: int) -> list[Snapshot]:
    """Three snapshots 0 s, 2 s and 6 s apart (ticks for ThunderAgent, cursor for round robin)."""
    rng = random.Random(seed)
    base = random_snapshot(seed, rng.randint(1, 5), rng.randint(0, 40), capacity_tokens=rng.choice([60_000, 200_000]),
                           used_range=(0.1, 1.2), admitted_per_replica=rng.randint(0, 4))
    return [dataclasses.replace(base, now_s=base.now_s + dt) for dt in (0.0, 2.0, 6.0)]


@st.composite
def small_snapshots(draw: st.DrawFn) -> Snapshot:
    n = draw(st.integers(1, 3))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    replicas = tuple(
        ReplicaState(f"r{j}", rng.choice([0, 10, 40, 100]), rng.choice([0, 5, 30, 120]), healthy=rng.random() < 0.8,
                     running=rng.randint(0, 3), waiting=rng.randint(0, 3), prefix_hit_rate=rng.random(),
                     models=rng.choice(MODEL_SETS), block_size=rng.choice([16, 32]))
        for j in range(n)
    )
    sessions = []
    for i in range(draw(st.integers(0, 8))):
        admitted = rng.random() < 0.3
        home = f"r{rng.randrange(n)}"
        credits = tuple(
            CacheEvidence.of_credit(f"r{rng.randrange(n)}", rng.choice([0, 5, 20, 50]), rng.uniform(80, 100),
                           rng.choice(["kv_events", "cached_tokens", "volume"]))
            for _ in range(rng.randint(0, 2))
        )
        sessions.append(SessionState(
            f"s{i}", rng.choice(["a", "b"]), rng.choice([0, 5, 10, 25, 60]), rng.random() < 0.5, credits=credits,
            phase=rng.choice(["RUNNING", "ACTING"] if admitted else ["WAITING", "ACTING", "PAUSED", "RUNNING", "ENDED"]),
            replica=home if admitted else None, admitted=admitted, context_tokens=rng.choice([0, 8, 30]),
            acting_since_s=rng.uniform(90, 100), waiting_since_s=rng.uniform(90, 100),
            model=rng.choice(["", "m1", "m2"]),
        ))
    headroom = {"a": rng.randint(0, 2)} if rng.random() < 0.3 else None
    return Snapshot(100.0, replicas, tuple(sessions), headroom)


def check_plan(name: str, snapshot: Snapshot, plan: Plan) -> None:
    policy = make_policy(name)
    by_id = {s.id: s for s in snapshot.sessions}
    replicas = {r.id: r for r in snapshot.replicas}
    assigned = [a.session for a in plan.assignments]
    assert len(assigned) == len(set(assigned)), "a session placed twice"
    for a in plan.assignments:
        ses = by_id[a.session]
        assert not ses.admitted and ses.phase in CANDIDATE_PHASES, f"{a.session} is not a pool candidate"
        assert replicas[a.replica].healthy, f"{a.session} placed on unhealthy {a.replica}"
        assert replicas[a.replica].serves(ses), f"{a.session} ({ses.model}) placed on {a.replica} {replicas[a.replica].models}"
    assert len(plan.pauses) == len(set(plan.pauses))
    for sid in plan.pauses:
        assert by_id[sid].admitted and sid not in assigned
    assert plan.objective == full_objective(snapshot, plan.assignments)
    if policy.gates_admission:
        for rid, rep in replicas.items():
            new = sum(by_id[a.session].footprint_tokens for a in plan.assignments if a.replica == rid)
            freed = sum(by_id[s].footprint_tokens for s in plan.pauses
                        if by_id[s].replica == rid and by_id[s].phase == "ACTING")
            # tao-lend: plus the reservations of admitted ACTING sessions whose tool is predicted back later
            lent = sum(s.footprint_tokens for s in snapshot.sessions
                       if getattr(policy, "lend", False) and s.admitted and s.replica == rid and s.phase == "ACTING"
                       and not s.ready and s.id not in plan.pauses and s.tool_return_s is not None
                       and s.tool_return_s > snapshot.now_s)
            assert new <= max(0, rep.capacity_tokens - rep.used_tokens) + freed + lent, f"{rid} over capacity"
        if name in TAO_FAMILY and snapshot.tenant_headroom:
            for tenant, slots in snapshot.tenant_headroom.items():
                assert sum(by_id[s].tenant == tenant for s in assigned) <= slots
    else:
        assert plan.pauses == ()
        expected = {s.id for s in snapshot.sessions if not s.admitted and s.phase == "WAITING"
                    and any(r.healthy and r.serves(s) for r in snapshot.replicas)}
        assert set(assigned) == expected


MODEL_SETS: tuple[tuple[str, ...], ...] = (("m1",), ("m2",), ("m1", "m2"), ())


def _with_models(snapshot: Snapshot, seed: int) -> Snapshot:
    """``snapshot`` with a two-model fleet: each replica serves m1, m2 or both, each session
    names m1, m2 or no model (admitted ones keep a model their replica serves)."""
    rng = random.Random(seed)
    replicas = tuple(dataclasses.replace(r, models=rng.choice(MODEL_SETS[:3]), block_size=rng.choice([16, 32]))
                     for r in snapshot.replicas)
    by_id = {r.id: r for r in replicas}
    sessions = []
    for s in snapshot.sessions:
        model = rng.choice(["", "m1", "m2"])
        if s.replica is not None and not by_id[s.replica].serves(dataclasses.replace(s, model=model)):
            model = by_id[s.replica].models[0]
        sessions.append(dataclasses.replace(s, model=model))
    return dataclasses.replace(snapshot, replicas=replicas, sessions=tuple(sessions))


def _shuffled(snapshot: Snapshot, seed: int) -> Snapshot:
    rng = random.Random(seed)
    reps, sess = list(snapshot.replicas), list(snapshot.sessions)
    rng.shuffle(reps)
    rng.shuffle(sess)
    return dataclasses.replace(snapshot, replicas=tuple(reps), sessions=tuple(sess))


def test_registry_has_the_contract_names() -> None:
    assert set(TAO_FAMILY) | {"round_robin", "least_loaded", "cache_aware", "thunderagent"} <= set(POLICIES)
    with pytest.raises(UnknownPolicyError, match="registered: .*tao"):
        make_policy("nope")
    a, b = make_policy("tao"), make_policy("tao")
    assert a is not b and a.name == "tao"


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(8))
def test_policy_invariants_and_determinism(name: str, seed: int) -> None:
    snaps = _sequence(seed)
    first, second, third = make_policy(name), make_policy(name), make_policy(name)
    plans = [first.plan(s) for s in snaps]
    for snap, plan in zip(snaps, plans, strict=True):
        check_plan(name, snap, plan)
    assert [second.plan(s) for s in snaps] == plans
    assert [third.plan(_shuffled(s, seed)) for s in snaps] == plans
    assert [p.revision for p in plans] == [1, 2, 3]


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(4))
def test_policy_invariants_with_two_models(name: str, seed: int) -> None:
    snaps = [_with_models(s, seed) for s in _sequence(seed + 100)]
    first, second = make_policy(name), make_policy(name)
    plans = [first.plan(s) for s in snaps]
    for snap, plan in zip(snaps, plans, strict=True):
        check_plan(name, snap, plan)
    assert [second.plan(_shuffled(s, seed)) for s in snaps] == plans


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_invariants_on_small_edge_cases(name: str) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(small_snapshots())
    def run(snapshot: Snapshot) -> None:
        plan = make_policy(name).plan(snapshot)
        check_plan(name, snapshot, plan)
        assert make_policy(name).plan(_shuffled(snapshot, 7)) == plan

    run()


@pytest.mark.parametrize("name", ["tao", "thunderagent", "round_robin"])
def test_the_sequences_exercise_admissions_and_pauses(name: str) -> None:
    assignments = pauses = 0
    for seed in range(8):
        policy = make_policy(name)
        for snap in _sequence(seed):
            plan = policy.plan(snap)
            assignments += len(plan.assignments)
            pauses += len(plan.pauses)
    assert assignments > 20
    assert pauses > 0 or not make_policy(name).gates_admission


def test_the_checker_catches_violations() -> None:
    snap = Snapshot(0.0, (ReplicaState("r0", 100, 90), ReplicaState("r1", 100, 0, healthy=False)), (
        SessionState("s0", "a", 50, True), SessionState("s1", "a", 5, True, phase="RUNNING", replica="r0",
                                                         admitted=True)))
    good = make_policy("tao").plan(snap)
    check_plan("tao", snap, good)
    from services.planner.core.model import Assignment

    for bad in (
        dataclasses.replace(good, assignments=(Assignment("s0", "r0"),)),  # 50 > 10 free
        dataclasses.replace(good, assignments=(Assignment("s0", "r1"),)),  # unhealthy
        dataclasses.replace(good, assignments=(Assignment("s1", "r0"),)),  # not in the pool
        dataclasses.replace(good, pauses=("s0",)),  # not admitted
    ):
        bad = dataclasses.replace(bad, objective=full_objective(snap, bad.assignments))
        with pytest.raises(AssertionError):
            check_plan("tao", snap, bad)
    two = dataclasses.replace(snap, replicas=(ReplicaState("r0", 100, 0, models=("m1",)),
                                              ReplicaState("r1", 100, 0, models=("m2",))),
                              sessions=(SessionState("s0", "a", 50, True, model="m2"),))
    placed = make_policy("tao").plan(two)
    assert [(a.session, a.replica) for a in placed.assignments] == [("s0", "r1")]
    check_plan("tao", two, placed)
    wrong = dataclasses.replace(placed, assignments=(Assignment("s0", "r0"),))  # r0 does not serve m2
    wrong = dataclasses.replace(wrong, objective=full_objective(two, wrong.assignments))
    with pytest.raises(AssertionError, match="placed on r0"):
        check_plan("tao", two, wrong)
