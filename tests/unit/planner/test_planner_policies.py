"""Behaviour of TAO, its ablations and the baselines on hand-made snapshots."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_brute import brute_force

from services.common.core.evidence import CacheEvidence
from services.planner.core import make_policy
from services.planner.core.dp import DpBudget
from services.planner.core.explain import explain
from services.planner.core.model import ReplicaState, SessionState, Snapshot
from services.planner.core.policy import plan_pauses
from services.planner.core.tao import TaoConfig, TaoPolicy
from services.planner.core.values import fold_values, objective_of, ready_first


def S(sid: str, f: int, ready: bool = False, credit: dict[str, tuple[int, float]] | None = None,
      **kw: object) -> SessionState:
    creds = tuple(CacheEvidence.of_credit(r, t, at) for r, (t, at) in (credit or {}).items())
    return SessionState(sid, str(kw.pop("tenant", "t")), f, ready, credits=creds, **kw)  # type: ignore[arg-type]


def R(rid: str, cap: int, used: int = 0, **kw: object) -> ReplicaState:
    return ReplicaState(rid, cap, used, **kw)  # type: ignore[arg-type]


def placed(snapshot: Snapshot, name: str) -> dict[str, str]:
    return {a.session: a.replica for a in make_policy(name).plan(snapshot).assignments}


# ------------------------------------------------------------------------------------ TAO


def test_credit_decides_the_replica() -> None:
    snap = Snapshot(100.0, (R("r0", 100), R("r1", 100)), (S("s", 40, credit={"r1": (30, 100.0)}),))
    assert placed(snap, "tao") == {"s": "r1"}


def test_dp_beats_best_fit_decreasing() -> None:
    """BFD takes the single most valuable session; the DP finds the better pair."""
    snap = Snapshot(100.0, (R("r0", 10),), (
        S("a", 6, credit={"r0": (6, 100.0)}), S("b", 5, credit={"r0": (5, 100.0)}),
        S("c", 5, credit={"r0": (5, 100.0)})))
    tao, bfd = make_policy("tao").plan(snap), make_policy("tao-bfd").plan(snap)
    assert {a.session for a in tao.assignments} == {"b", "c"} and tao.objective == (10, 0, 10)
    assert {a.session for a in bfd.assignments} == {"a"} and bfd.objective == (6, 0, 6)


def test_readiness_breaks_credit_ties_and_its_ablation_does_not() -> None:
    snap = Snapshot(0.0, (R("r0", 10),), (S("big", 10), S("ready", 6, ready=True)))
    assert placed(snap, "tao") == {"ready": "r0"}
    assert placed(snap, "tao-no-readiness") == {"big": "r0"}


def test_decay_prefers_fresh_evidence_and_its_ablation_does_not() -> None:
    snap = Snapshot(100.0, (R("r0", 10),), (
        S("stale", 10, credit={"r0": (9000, 0.0)}),  # 9000 · 2^-10 ≈ 8 tokens now
        S("fresh", 10, credit={"r0": (500, 100.0)})))
    assert placed(snap, "tao") == {"fresh": "r0"}
    assert placed(snap, "tao-no-decay") == {"stale": "r0"}


def test_sjf_takes_the_smallest_first() -> None:
    snap = Snapshot(0.0, (R("r0", 10),), (S("a", 9, credit={"r0": (9, 0.0)}), S("b", 3), S("c", 4)))
    assert placed(snap, "sjf") == {"b": "r0", "c": "r0"}
    assert placed(snap, "tao") == {"a": "r0"}


def test_tenant_headroom_keeps_the_best_sessions() -> None:
    snap = Snapshot(0.0, (R("r0", 100),), (S("a1", 10, tenant="a"), S("a2", 10, ready=True, tenant="a"),
                                            S("b1", 10, tenant="b")), tenant_headroom={"a": 1})
    assert placed(snap, "tao") == {"a2": "r0", "b1": "r0"}


@st.composite
def pools(draw: st.DrawFn) -> Snapshot:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 3))
    reps = tuple(R(f"r{j}", rng.choice([0, 10, 25, 45]), rng.choice([0, 5, 20]), healthy=rng.random() < 0.85)
                 for j in range(n))
    sessions = tuple(
        S(f"s{i}", rng.choice([0, 3, 7, 12, 20]), rng.random() < 0.4,
          credit={f"r{rng.randrange(n)}": (rng.choice([10, 40]), rng.uniform(60, 100))} if rng.random() < 0.6 else None,
          phase=rng.choice(["WAITING", "PAUSED", "ACTING"]))
        for i in range(draw(st.integers(0, 6)))
    )
    return Snapshot(100.0, reps, sessions)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools())
def test_tao_plan_is_the_brute_force_optimum_in_tokens(snap: Snapshot) -> None:
    """End to end (folding, eligibility, DP): small capacities are solved at token resolution,
    so each TAO policy's plan is optimal for the real (undiscretised) problem in its own order:
    tao-paper (Σk, Σr, Σf), tao (Σr, Σk, Σf). The compute-load spread never changes either."""
    replicas = sorted(snap.replicas, key=lambda r: r.id)
    pool = sorted(snap.sessions, key=lambda s: s.id)
    values = fold_values(snap.now_s, pool, replicas)
    free = np.array([max(0, r.free_tokens) if r.healthy else 0 for r in replicas], dtype=np.int64)
    healthy = np.array([r.healthy for r in replicas])
    elig = healthy[None, :] & (values.footprint[:, None] <= free[None, :])
    paper = make_policy("tao-paper").plan(snap)
    assert paper.solver == "exact-dp" and paper.unit_tokens in (0, 1)
    assert paper.objective == brute_force(values, elig, values.footprint, free)
    plan = make_policy("tao").plan(snap)
    assert plan.solver == "exact-dp" and plan.unit_tokens in (0, 1)
    order = ready_first(values)
    col = {r.id: j for j, r in enumerate(replicas)}
    row = {s.id: i for i, s in enumerate(pool)}
    choice = np.full(len(pool), -1, dtype=np.int64)
    for a in plan.assignments:
        choice[row[a.session]] = col[a.replica]
    assert objective_of(order, choice) == brute_force(order, elig, values.footprint, free)


def test_large_instances_fall_back_with_an_upper_bound() -> None:
    reps = tuple(R(f"r{j:02d}", 1000 + 37 * j) for j in range(24))
    rng = random.Random(5)
    sessions = tuple(S(f"s{i:03d}", rng.randint(50, 400), rng.random() < 0.3,
                       credit={f"r{rng.randrange(24):02d}": (rng.randint(10, 300), 99.0)}) for i in range(300))
    plan = make_policy("tao-paper").plan(Snapshot(100.0, reps, sessions))
    assert plan.solver == "knapsack+bfd" and plan.upper_bound is not None
    assert plan.objective[0] <= plan.upper_bound[0]
    assert plan.objective[0] >= 0.97 * plan.upper_bound[0]


def test_rounding_top_up_counts_what_quantisation_excluded() -> None:
    """A 3-state budget gives 2 units of 34 tokens: the DP admits 2 units' worth (60 tokens);
    a 30-token session still fits in the 40 exact tokens left and the top-up places it."""
    coarse = TaoPolicy("tao", TaoConfig(budget=DpBudget(state_budget=3, min_resolution=1), sparse=False, guard=False))
    snap = Snapshot(0.0, (R("r0", 100),), (S("a", 30), S("b", 30), S("c", 30), S("d", 60)))
    plan = coarse.plan(snap)
    assert plan.unit_tokens == 34 and plan.dp_states == 3
    assert plan.solver == "exact-dp+topup" and plan.excluded_by_rounding == 1
    assert plan.objective == (0, 0, 90)


# ------------------------------------------------------------------------------------ pauses


def _crowded() -> Snapshot:
    sessions = (
        S("ready-hot", 30, True, {"r0": (30, 100.0)}, phase="ACTING", replica="r0", admitted=True),
        S("cold-hot", 30, False, {"r0": (30, 100.0)}, phase="ACTING", replica="r0", admitted=True),
        S("cold-big", 40, False, {"r0": (5, 100.0)}, phase="ACTING", replica="r0", admitted=True),
        S("cold-small", 10, False, {"r0": (5, 100.0)}, phase="ACTING", replica="r0", admitted=True),
        S("running", 20, False, phase="RUNNING", replica="r0", admitted=True),
    )
    return Snapshot(100.0, (R("r0", 100, used=130),), sessions)


def test_tao_pauses_lowest_value_first() -> None:
    # 30 tokens over: not ready first, then lowest credit, then smallest footprint.
    assert plan_pauses(_crowded(), "tao").pauses == ("cold-small", "cold-big")
    assert make_policy("tao").plan(_crowded()).pauses == ("cold-small", "cold-big")


def test_thunderagent_order_pauses_smallest_first() -> None:
    # Footprint ties go by id ("cold-hot" < "ready-hot"): readiness and credit play no part.
    assert plan_pauses(_crowded(), "thunderagent").pauses == ("cold-small", "cold-hot")
    assert make_policy("tao-ta-pause").plan(_crowded()).pauses == ("cold-small", "cold-hot")


def test_running_sessions_are_marked_only_after_acting_ones() -> None:
    snap = Snapshot(0.0, (R("r0", 100, used=150),), (
        S("acting", 20, phase="ACTING", replica="r0", admitted=True),
        S("run-a", 20, phase="RUNNING", replica="r0", admitted=True),
        S("run-b", 25, phase="RUNNING", replica="r0", admitted=True),
        S("run-c", 30, phase="RUNNING", replica="r0", admitted=True)))
    # 50 over: the ACTING one frees 20 now; RUNNING ones are marked until the rest is covered.
    assert plan_pauses(snap, "tao").pauses == ("acting", "run-a", "run-b")


def test_no_pause_within_capacity_or_on_unhealthy_replicas() -> None:
    snap = Snapshot(0.0, (R("r0", 100, used=100), R("r1", 10, used=50, healthy=False)), (
        S("a", 50, phase="ACTING", replica="r0", admitted=True),
        S("b", 50, phase="ACTING", replica="r1", admitted=True)))
    assert make_policy("tao").plan(snap).pauses == ()


# ------------------------------------------------------------------------------------ routers


def _held(n: int) -> tuple[SessionState, ...]:
    return tuple(S(f"s{i}", 100, waiting_since_s=float(i), context_tokens=100) for i in range(n))


def test_round_robin_cycles_across_plans() -> None:
    rr = make_policy("round_robin")
    reps = (R("b", 10), R("a", 10), R("c", 10, healthy=False))
    first = rr.plan(Snapshot(0.0, reps, _held(3)))
    assert [a.replica for a in first.assignments] == ["a", "b", "a"]
    second = rr.plan(Snapshot(1.0, reps, _held(1)))
    assert [a.replica for a in second.assignments] == ["b"]


def test_least_loaded_counts_requests() -> None:
    reps = (R("a", 10, running=3), R("b", 10, running=1, waiting=1))
    plan = make_policy("least_loaded").plan(Snapshot(0.0, reps, _held(3)))
    # b (2 requests) first; then 3 each: ties go to fewer used tokens, then the id.
    assert [a.replica for a in plan.assignments] == ["b", "a", "b"]


def test_cache_aware_uses_dynamo_cost() -> None:
    """cost = 1.0 × prefill blocks + decode blocks (Dynamo docs): 160-token prompt = 10 blocks.
    r0: 8 of them cached, 20 active blocks -> 2 + (20 + 10) = 32.
    r1: nothing cached, 4 active blocks -> 10 + (4 + 10) = 24 -> r1 wins.
    With 25 active blocks on r1 instead: 10 + 35 = 45 > 32 -> r0 wins."""
    ses = (S("s", 200, credit={"r0": (128, 0.0)}, context_tokens=160),)
    light = Snapshot(0.0, (R("r0", 1000, used=320), R("r1", 1000, used=64)), ses)
    heavy = Snapshot(0.0, (R("r0", 1000, used=320), R("r1", 1000, used=400)), ses)
    assert placed(light, "cache_aware") == {"s": "r1"}
    assert placed(heavy, "cache_aware") == {"s": "r0"}


def test_routers_route_only_held_requests() -> None:
    snap = Snapshot(0.0, (R("a", 10),), (S("held", 5), S("paused", 5, phase="PAUSED"),
                                         S("run", 5, phase="RUNNING", replica="a", admitted=True)))
    for name in ("round_robin", "least_loaded", "cache_aware"):
        assert placed(snap, name) == {"held": "a"}


# ------------------------------------------------------------------------------------ ThunderAgent


def test_thunderagent_places_new_programs_only_when_nothing_waits() -> None:
    reps = (R("a", 10_000, used=3000), R("b", 10_000, used=1000))
    ta = make_policy("thunderagent")
    first = ta.plan(Snapshot(0.0, reps, (S("new", 500),)))  # tick at t=0 places it anyway
    assert {a.session: a.replica for a in first.assignments} == {"new": "b"}
    ta2 = make_policy("thunderagent")
    ta2.plan(Snapshot(0.0, (R("a", 600, used=500),), (S("old", 400, credit={"a": (100, 0.0)}),)))
    # Between ticks (t=1 < 5 s) a new program waits because "old" is still queued.
    second = ta2.plan(Snapshot(1.0, (R("a", 10_000),), (S("old", 400, credit={"a": (100, 0.0)}), S("new", 10))))
    assert second.assignments == ()
    third = ta2.plan(Snapshot(5.0, (R("a", 10_000),), (S("old", 400, credit={"a": (100, 0.0)}), S("new", 10))))
    assert {a.session for a in third.assignments} == {"old", "new"}


def test_thunderagent_resume_priority_and_bfd_onto_the_roomiest() -> None:
    # Room for only two programs (+100-token buffers) in total: reasoning first, then new, then acting.
    reps = (R("a", 1000, used=0), R("b", 1000, used=500))
    pool = (
        S("acting", 100, credit={"a": (50, 0.0)}, phase="PAUSED"),
        S("new", 300),
        S("reasoning", 600, credit={"b": (50, 0.0)}),
        S("reasoning-2", 700, credit={"b": (50, 0.0)}),
    )
    plan = make_policy("thunderagent").plan(Snapshot(0.0, reps, pool))
    got = {a.session: a.replica for a in plan.assignments}
    # Capacity 1500: reasoning (700) + reasoning-2 (800) fill it; largest first onto the roomiest.
    assert got == {"reasoning-2": "a"}  # 600+100 no longer fits b (500) nor a (300 left)
    assert "acting" not in got and "new" not in got


def test_thunderagent_pauses_smallest_acting_then_marks_reasoning() -> None:
    snap = Snapshot(0.0, (R("a", 1000, used=1300),), (
        S("act-small", 100, phase="ACTING", replica="a", admitted=True),
        S("act-big", 200, phase="ACTING", replica="a", admitted=True),
        S("reason", 400, phase="RUNNING", replica="a", admitted=True)))
    # used + 3 × 100 buffer = 1600 > 1000: pauses both acting (600 freed incl. buffers), then marks reason.
    assert make_policy("thunderagent").plan(snap).pauses == ("act-small", "act-big", "reason")


# ------------------------------------------------------------------------------------ explain


def test_explain_says_what_won() -> None:
    snap = Snapshot(100.0, (R("r0", 10),), (S("a", 6, credit={"r0": (6, 100.0)}), S("b", 5, credit={"r0": (5, 100.0)}),
                                            S("c", 5, credit={"r0": (5, 100.0)}), S("huge", 50)))
    plan = make_policy("tao").plan(snap)
    lost = explain(snap, plan, "a")
    assert not lost.admitted and "b (k=5" in lost.reason and "c (k=5" in lost.reason
    assert lost.values[0].credit_tokens == 6 and lost.values[0].eligible
    assert explain(snap, plan, "b").admitted
    assert "fits nowhere: needs 50 tokens" in explain(snap, plan, "huge").reason
