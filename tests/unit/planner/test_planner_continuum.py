"""Continuum (arXiv 2511.02230) on the snapshot model: program-level FCFS and the KV TTL."""

from __future__ import annotations

import dataclasses
import math

import pytest

from services.common.core.evidence import CacheEvidence
from services.planner.core import make_policy
from services.planner.core.continuum import (
    ContinuumConfig,
    ContinuumPolicy,
    _Memoryfulness,
    last_replica,
    prefill_reload_s,
    ttl_empirical,
    ttl_exponential,
)
from services.planner.core.model import ReplicaState, SessionState, Snapshot

# Linear prefill of 1e-4 s per token: 20k tokens of context -> B = 2 s (T = 0 at start).
LINEAR = ContinuumConfig(prefill_linear_s=1e-4, prefill_quadratic_s=0.0)


def _waiting(sid: str, tokens: int, since: float, replica: str | None = None) -> SessionState:
    return SessionState(sid, "t", tokens, True, phase="WAITING", waiting_since_s=since, replica=replica)


def _pinned(sid: str, tokens: int, since: float, returns: float | None = None, context: int = 0,
            replica: str = "r0") -> SessionState:
    return SessionState(sid, "t", tokens, False, phase="ACTING", replica=replica, admitted=True,
                        context_tokens=context, acting_since_s=since, tool_return_s=returns)


def test_registered_as_a_sticky_gating_policy() -> None:
    policy = make_policy("continuum")
    assert isinstance(policy, ContinuumPolicy)
    assert policy.gates_admission and policy.sticky


def test_program_level_fcfs_keeps_the_programs_place_and_blocks_the_line() -> None:
    policy = ContinuumPolicy()
    rep = (ReplicaState("r0", 100, 0),)
    # "old" arrives first and goes off to a tool (pool ACTING: no request, nothing admitted).
    first = policy.plan(Snapshot(0.0, rep, (SessionState("old", "t", 80, False, phase="ACTING",
                                                          acting_since_s=0.0),)))
    assert first.assignments == ()
    # Its next request (waiting since 9 s) keeps the program's place ahead of "new" (8 s);
    # "new" (30) no longer fits and blocks "tiny" (10) although "tiny" would fit.
    snap = Snapshot(10.0, rep, (_waiting("new", 30, 8.0), _waiting("old", 80, 9.0), _waiting("tiny", 10, 9.5)))
    plan = policy.plan(snap)
    assert [(a.session, a.replica) for a in plan.assignments] == [("old", "r0")]
    # A fresh instance has no history: the first requests decide (new, old, tiny by arrival).
    fresh = ContinuumPolicy().plan(snap)
    assert [a.session for a in fresh.assignments] == ["new"]


def test_a_paused_program_goes_back_to_the_replica_its_last_request_ran_on() -> None:
    """A paused session's ``replica`` is cleared; its home is its newest usage observation. Until
    2026-12-04 only an admitted session's replica counted, so every paused program was placed on
    the replica with the most room and lost its cache whenever that was another one (a 57 %
    prefix hit rate on a 4-replica SWE-verified trace, against 91–93 % for the others)."""
    reps = (ReplicaState("r0", 1000, 600), ReplicaState("r1", 1000, 0))
    home = SessionState("h", "t", 300, True, phase="WAITING", waiting_since_s=1.0, credits=(
        CacheEvidence("r1", "cached_tokens", 200, 200, 0, 200, 2.0),
        CacheEvidence("r0", "cached_tokens", 280, 280, 200, 280, 5.0),  # its last request: r0
        CacheEvidence("r1", "kv_events", 250, 0, 0, 0, 9.0)))  # a shared prefix there: not home
    assert last_replica(home) == "r0"
    plan = ContinuumPolicy().plan(Snapshot(10.0, reps, (home,)))
    assert [(a.session, a.replica) for a in plan.assignments] == [("h", "r0")]  # fits at home
    # home full: the replica with the most room, as before
    full = (ReplicaState("r0", 1000, 800), ReplicaState("r1", 1000, 0))
    plan = ContinuumPolicy().plan(Snapshot(10.0, full, (home,)))
    assert [(a.session, a.replica) for a in plan.assignments] == [("h", "r1")]
    # nowhere fits: the deadlock rule unpins as few as it can, at home on a tie
    pins = (_pinned("p0", 500, 0.0, replica="r0"), _pinned("p1", 500, 0.0, replica="r1"))
    tight = (ReplicaState("r0", 1000, 800), ReplicaState("r1", 1000, 800))
    plan = ContinuumPolicy().plan(Snapshot(0.5, tight, (home, *pins)))
    assert [(a.session, a.replica) for a in plan.assignments] == [("h", "r0")] and plan.pauses == ("p0",)
    assert last_replica(_waiting("new", 10, 0.0)) is None


def _homed(sid: str, tokens: int, since: float, home: str) -> SessionState:
    return dataclasses.replace(_waiting(sid, tokens, since), credits=(
        CacheEvidence(home, "cached_tokens", tokens, tokens, 0, tokens, since - 1.0),))


def test_continuum_affine_queues_each_program_at_its_own_engine() -> None:
    """One Continuum engine per replica behind a sticky router: a program waits for its own
    replica, and a blocked head holds back only that replica's queue (the fleet-wide
    ``continuum`` moves the head to the roomiest replica and keeps one line)."""
    reps = (ReplicaState("r0", 1000, 900), ReplicaState("r1", 1000, 0))
    snap = Snapshot(10.0, reps, (_homed("a", 300, 1.0, "r0"), _homed("b", 300, 2.0, "r1"),
                                 _waiting("c", 600, 3.0)))
    affine = make_policy("continuum-affine").plan(snap)
    assert sorted((a.session, a.replica) for a in affine.assignments) == [("b", "r1"), ("c", "r1")]
    fleet = make_policy("continuum").plan(snap)  # a leaves its cache for r1; c no longer fits
    assert sorted((a.session, a.replica) for a in fleet.assignments) == [("a", "r1"), ("b", "r1")]
    # the deadlock rule unpins on the head's own engine only
    pins = (_pinned("p0", 500, 9.5, replica="r0"), _pinned("p1", 500, 9.5, replica="r1"))
    tight = (ReplicaState("r0", 1000, 900), ReplicaState("r1", 1000, 800))
    plan = make_policy("continuum-affine").plan(Snapshot(10.0, tight, (_homed("a", 300, 1.0, "r0"), *pins)))
    assert [(a.session, a.replica) for a in plan.assignments] == [("a", "r0")] and plan.pauses == ("p0",)


def test_pool_sessions_without_a_request_are_not_admitted() -> None:
    snap = Snapshot(5.0, (ReplicaState("r0", 1000, 0),), (
        SessionState("acting", "t", 10, True, phase="ACTING", acting_since_s=1.0),
        SessionState("paused", "t", 10, True, phase="PAUSED"),
        _waiting("held", 10, 4.0)))
    assert [a.session for a in ContinuumPolicy().plan(snap).assignments] == ["held"]


def test_tenant_headroom_skips_without_blocking() -> None:
    snap = Snapshot(5.0, (ReplicaState("r0", 1000, 0),), (
        SessionState("a", "full", 10, True, phase="WAITING", waiting_since_s=1.0),
        SessionState("b", "free", 10, True, phase="WAITING", waiting_since_s=2.0)), {"full": 0})
    assert [a.session for a in ContinuumPolicy().plan(snap).assignments] == ["b"]


def test_pinned_session_stays_admitted_within_its_ttl_and_pauses_when_it_ends() -> None:
    policy = ContinuumPolicy(config=LINEAR)
    rep = (ReplicaState("r0", 1000, 100),)
    s = _pinned("s", 100, since=10.0, returns=10.5, context=20_000)  # d = 0.5 s, B = 2 s
    within = policy.plan(Snapshot(10.6, rep, (s,)))
    assert within.pauses == ()
    ttl, expires = policy.pin_of("s") or (0.0, 0.0)
    assert ttl == pytest.approx(0.5 * math.log(4.0))  # d·ln(B/d)
    assert expires == pytest.approx(10.0 + ttl)
    assert policy.plan(Snapshot(10.0 + ttl - 0.01, rep, (s,))).pauses == ()
    assert policy.plan(Snapshot(10.0 + ttl + 0.01, rep, (s,))).pauses == ("s",)
    assert policy.plan(Snapshot(10.0 + ttl + 0.02, rep, (s,))).pauses == ("s",)  # a deferred pause repeats
    assert policy.pin_of("s") == (ttl, expires)  # computed once per tool call
    policy.plan(Snapshot(10.0 + ttl + 0.03, rep, (dataclasses.replace(s, admitted=False, replica=None),)))
    assert policy.pin_of("s") is None


def test_tool_return_within_the_ttl_keeps_the_session_admitted() -> None:
    policy = ContinuumPolicy(config=LINEAR)
    rep = (ReplicaState("r0", 1000, 100),)
    assert policy.plan(Snapshot(10.1, rep, (_pinned("s", 100, 10.0, 10.5, 20_000),))).pauses == ()
    back = SessionState("s", "t", 100, True, phase="RUNNING", replica="r0", admitted=True, acting_since_s=10.0)
    assert policy.plan(Snapshot(11.0, rep, (back,))).pauses == ()
    assert policy.pin_of("s") is None  # the pin was used by the next request


def test_cold_start_without_a_prediction_pins_for_the_default_ttl() -> None:
    policy = ContinuumPolicy()
    rep = (ReplicaState("r0", 1000, 100),)
    s = _pinned("s", 100, since=10.0)
    assert policy.plan(Snapshot(11.9, rep, (s,))).pauses == ()
    assert policy.pin_of("s") == (2.0, 12.0)  # T_default (FIXED_THRESHOLD_CONTINUUM)
    assert policy.plan(Snapshot(12.0, rep, (s,))).pauses == ("s",)


def test_ttl_grows_with_reload_cost_and_shrinks_with_long_predicted_tools() -> None:
    policy = ContinuumPolicy()  # default quadratic prefill fit
    assert prefill_reload_s(40_000, policy.config) > 2 * prefill_reload_s(20_000, policy.config)

    def ttl(context: int, tool_s: float) -> float:
        return policy.ttl_s(_pinned("s", 1, 0.0, tool_s, context), 0.0)

    assert 0.0 < ttl(10_000, 0.2) < ttl(40_000, 0.2) < ttl(100_000, 0.2)
    b = prefill_reload_s(40_000, policy.config)
    assert ttl(40_000, b / math.e) > ttl(40_000, b / 2) > ttl(40_000, 0.9 * b) > 0.0  # past d = B/e
    assert ttl(40_000, b) == 0.0 and ttl(40_000, 10 * b) == 0.0  # tool longer than the benefit
    # TTL 0 is end-of-turn eviction: the session is paused at once.
    snap = Snapshot(0.1, (ReplicaState("r0", 1000, 100),), (_pinned("s", 100, 0.0, 60.0, 1_000),))
    assert ContinuumPolicy().plan(snap).pauses == ("s",)


def test_ttl_closed_forms_match_the_paper_objective() -> None:
    # Exp(d): the argmax of (1 - exp(-τ/d))·B - τ on a fine grid.
    d, b = 0.7, 3.0
    grid = [i / 1000 for i in range(0, 5000)]
    best = max(grid, key=lambda t: (1 - math.exp(-t / d)) * b - t)
    assert ttl_exponential(d, b) == pytest.approx(best, abs=1e-3)
    # Empirical CDF over {0} ∪ samples: short tools are worth waiting for, the long tail is not.
    samples = [1.0, 1.0, 1.0, 10.0]
    assert ttl_empirical(samples, 5.0) == 1.0
    assert ttl_empirical(samples, 100.0) == 10.0
    assert ttl_empirical(samples, 1.0) == 0.0
    assert ttl_empirical([], 5.0) == 0.0


def test_recorded_prediction_errors_replace_the_cold_start() -> None:
    policy = ContinuumPolicy(config=ContinuumConfig(history_threshold=2, prefill_linear_s=1e-3,
                                                    prefill_quadratic_s=0.0))
    rep = (ReplicaState("r0", 1000, 0),)
    t = 0.0
    for _ in range(3):  # three tool calls predicted at 1 s that take 3 s
        policy.plan(Snapshot(t, rep, (_pinned("s", 10, t, t + 1.0, 100_000),)))
        back = SessionState("s", "t", 10, True, phase="WAITING", replica="r0", admitted=True,
                            acting_since_s=t, waiting_since_s=t + 3.0)
        policy.plan(Snapshot(t + 3.0, rep, (back,)))
        t += 4.0
    # B = 100 s; with the ratios (3.0) the predicted 1 s tool is pinned for 3 s, not d·ln(B/d).
    assert policy.ttl_s(_pinned("s", 10, t, t + 1.0, 100_000), t) == pytest.approx(3.0)


def test_queue_head_unpins_latest_arrivals_first() -> None:
    policy = ContinuumPolicy()
    policy.plan(Snapshot(0.0, (ReplicaState("r0", 100, 50),), (_pinned("z-early", 50, 0.0),)))
    # At 1.5 s the head (waiting since 1 s) does not fit; "a-late" was first seen at 1.4 s.
    head = _waiting("head", 50, 1.0)
    snap = Snapshot(1.5, (ReplicaState("r0", 100, 100),), (_pinned("z-early", 50, 0.0), _pinned("a-late", 50, 1.4), head))
    plan = policy.plan(snap)
    assert plan.pauses == ("a-late",)  # the latest program arrival, not the last id
    assert [(a.session, a.replica) for a in plan.assignments] == [("head", "r0")]
    assert policy.pin_of("z-early") == (2.0, 2.0)


def test_over_capacity_releases_pins_but_not_running_requests() -> None:
    policy = ContinuumPolicy()
    snap = Snapshot(1.0, (ReplicaState("r0", 100, 160),), (
        _pinned("a", 40, 0.9),
        SessionState("run", "t", 80, False, phase="RUNNING", replica="r0", admitted=True)))
    assert policy.plan(snap).pauses == ("a",)


def test_memoryfulness_is_one_for_fixed_turns_and_lower_for_mixed() -> None:
    fixed, mixed = _Memoryfulness(), _Memoryfulness()
    for _ in range(3):
        fixed.observe(5)
    assert fixed.value(0.5) == pytest.approx(1.0)
    for n in (1, 2, 20):
        mixed.observe(n)
    assert mixed.value(0.5) < 1.0
    assert _Memoryfulness().value(0.5) == 0.5
