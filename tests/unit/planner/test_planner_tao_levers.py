"""What `tao` changes over `tao-paper`, one lever at a time (docs/algorithms.md#policies-tao-and-tao-paper)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from services.common.core.evidence import CacheEvidence
from services.planner.core import make_policy
from services.planner.core.model import ReplicaState, SessionState, Snapshot
from services.planner.core.policy import plan_pauses
from services.planner.core.tao import TaoConfig, turn_s


def S(sid: str, f: int, ready: bool = False, credit: dict[str, int] | None = None, **kw: object) -> SessionState:
    creds = tuple(CacheEvidence.of_credit(r, t, 100.0) for r, t in (credit or {}).items())
    return SessionState(sid, "t", f, ready, credits=creds, **kw)  # type: ignore[arg-type]


def test_ready_first_admits_the_session_that_can_run_over_a_warm_cache_whose_tool_runs() -> None:
    snap = Snapshot(100.0, (ReplicaState("r0", 1000, 0),), (
        S("warm-acting", 900, ready=False, credit={"r0": 800}, phase="ACTING"),
        S("cold-waiting", 900, ready=True, phase="WAITING"),
    ))
    assert [a.session for a in make_policy("tao-paper").plan(snap).assignments] == ["warm-acting"]
    assert [a.session for a in make_policy("tao").plan(snap).assignments] == ["cold-waiting"]


def test_ready_first_still_prefers_credit_among_ready_sessions() -> None:
    snap = Snapshot(100.0, (ReplicaState("r0", 1000, 0),), (
        S("a", 900, ready=True, phase="WAITING"),
        S("b", 900, ready=True, credit={"r0": 700}, phase="WAITING"),
    ))
    assert [a.session for a in make_policy("tao").plan(snap).assignments] == ["b"]


def _over(used: int) -> Snapshot:
    sessions = tuple(S(f"s{i}", 250, phase="ACTING", admitted=True, replica="r0") for i in range(4))
    return Snapshot(100.0, (ReplicaState("r0", 1000, used),), sessions)


def test_pause_hysteresis_tolerates_a_small_excess_and_then_returns_to_capacity() -> None:
    assert plan_pauses(_over(1040), "tao").pauses != ()  # the paper pauses at once
    assert make_policy("tao-paper").plan(_over(1040)).pauses != ()
    assert make_policy("tao").plan(_over(1040)).pauses == ()  # 4 % over: within the 5 % band
    pauses = make_policy("tao").plan(_over(1100)).pauses  # 10 % over: back down to capacity
    assert len(pauses) == 1


def test_belady_pauses_the_furthest_predicted_return_first() -> None:
    sessions = (
        S("soon", 300, phase="ACTING", admitted=True, replica="r0", tool_return_s=105.0),
        S("late", 300, phase="ACTING", admitted=True, replica="r0", tool_return_s=190.0),
        S("mid", 300, phase="ACTING", admitted=True, replica="r0", tool_return_s=130.0),
    )
    snap = Snapshot(100.0, (ReplicaState("r0", 700, 900),), sessions)
    assert plan_pauses(snap, "belady").pauses == ("late",)


def test_small_pause_pauses_the_smallest_not_ready_session_first() -> None:
    """`tao` pauses the lowest credit first (here the large context whose credit decayed);
    `tao-small-pause` keeps the largest contexts running and covers the excess with the
    smallest footprints, never a ready session before a not-ready one."""
    sessions = (
        S("large", 600, phase="ACTING", admitted=True, replica="r0", credit={"r0": 50}),
        S("small-a", 200, phase="ACTING", admitted=True, replica="r0", credit={"r0": 190}),
        S("small-b", 250, phase="ACTING", admitted=True, replica="r0", credit={"r0": 240}),
        S("tiny-ready", 100, ready=True, phase="ACTING", admitted=True, replica="r0", credit={"r0": 90}),
    )
    snap = Snapshot(100.0, (ReplicaState("r0", 900, 1150),), sessions)  # 250 over, 28 % past capacity
    assert make_policy("tao").plan(snap).pauses == ("large",)
    assert make_policy("tao-small-pause").plan(snap).pauses == ("small-a", "small-b")


def test_spread_keeps_the_objective_and_uses_every_replica() -> None:
    reps = (ReplicaState("r0", 10_000, 0), ReplicaState("r1", 10_000, 0))
    snap = Snapshot(0.0, reps, tuple(S(f"s{i}", 500, ready=True, phase="WAITING") for i in range(6)))
    packed = make_policy("tao-no-spread").plan(snap)
    spread = make_policy("tao").plan(snap)
    assert packed.objective == spread.objective
    per = [sum(a.replica == r.id for a in spread.assignments) for r in reps]
    assert per == [3, 3]


def _reclaim_snapshot(incumbent_ready: bool, pool_ready: bool) -> Snapshot:
    """r0 holds 700 of 1000 tokens for one admitted session whose tool runs; a 600-token
    session waits in the pool and fits only if that reservation is taken back."""
    return Snapshot(100.0, (ReplicaState("r0", 1000, 700),), (
        S("tool", 700, ready=incumbent_ready, credit={"r0": 650}, phase="ACTING", admitted=True, replica="r0"),
        S("next", 600, ready=pool_ready, phase="WAITING" if pool_ready else "ACTING"),
    ))


def test_reclaim_takes_a_tool_reservation_back_for_a_ready_session() -> None:
    snap = _reclaim_snapshot(incumbent_ready=False, pool_ready=True)
    assert make_policy("tao-hold").plan(snap).assignments == ()  # the holding policy leaves it waiting
    plan = make_policy("tao-reclaim").plan(snap)
    assert plan.pauses == ("tool",)
    assert [(a.session, a.replica) for a in plan.assignments] == [("next", "r0")]


def test_reclaim_keeps_a_tool_predicted_back_and_never_yields_to_a_session_that_cannot_run() -> None:
    # The incumbent's tool is predicted back within the horizon (ready): it keeps its KV.
    plan = make_policy("tao-reclaim").plan(_reclaim_snapshot(incumbent_ready=True, pool_ready=True))
    assert plan.pauses == () and plan.assignments == ()
    # The pool session is not ready either: cache credit alone never displaces an incumbent.
    plan = make_policy("tao-reclaim").plan(_reclaim_snapshot(incumbent_ready=False, pool_ready=False))
    assert plan.pauses == () and plan.assignments == ()


def test_reclaim_drops_the_fewest_incumbents_and_keeps_the_rest_in_place() -> None:
    reps = (ReplicaState("r0", 1000, 900), ReplicaState("r1", 1000, 1000))
    snap = Snapshot(100.0, reps, (
        S("small", 200, phase="ACTING", admitted=True, replica="r0"),
        S("big", 700, phase="ACTING", admitted=True, replica="r0"),
        S("other", 1000, phase="ACTING", admitted=True, replica="r1"),
        S("ready", 250, ready=True, phase="WAITING"),
    ))
    plan = make_policy("tao-reclaim").plan(snap)
    assert len(plan.pauses) == 1 and plan.pauses[0] in ("small", "big")
    assert [(a.session, a.replica) for a in plan.assignments] == [("ready", "r0")]


def _ttl_snapshot(now: float, context: int, tool_return: float | None) -> Snapshot:
    """r0 holds 700 of 1000 tokens for one admitted session whose tool started at t = 100; a
    ready 600-token session waits and fits only if that reservation is taken back."""
    return Snapshot(now, (ReplicaState("r0", 1000, 700),), (
        S("tool", 700, credit={"r0": 650}, phase="ACTING", admitted=True, replica="r0",
          context_tokens=context, acting_since_s=100.0, tool_return_s=tool_return),
        S("next", 600, ready=True, phase="WAITING"),
    ))


def test_ttl_takes_back_a_long_tool_whose_context_is_cheap_to_reload() -> None:
    # Tool predicted to run 60 s; reloading 700 tokens takes ~0.04 s: TTL 0, reclaim at once.
    snap = _ttl_snapshot(101.0, 700, 160.0)
    assert make_policy("tao-hold").plan(snap).assignments == ()
    plan = make_policy("tao-ttl").plan(snap)
    assert plan.pauses == ("tool",)
    assert [(a.session, a.replica) for a in plan.assignments] == [("next", "r0")]


def test_ttl_keeps_a_short_tool_whose_context_is_dear_to_reload_until_its_ttl_runs_out() -> None:
    # 100k-token context: B = 5.10e-5·1e5 + 1.18e-9·1e10 = 16.9 s; tool predicted 5 s:
    # TTL = 5·ln(16.9 / 5) = 6.09 s, so the pin expires at t = 106.09.
    from services.planner.core.continuum import ContinuumConfig
    from services.planner.core.tao import ttl_s
    ttl = ttl_s(_ttl_snapshot(103.0, 100_000, 105.0).sessions[0], 103.0, ContinuumConfig())
    assert 6.0 < ttl < 6.2
    held = make_policy("tao-ttl").plan(_ttl_snapshot(103.0, 100_000, 105.0))
    assert held.pauses == () and held.assignments == ()  # tao-reclaim would take it now
    assert make_policy("tao-reclaim").plan(_ttl_snapshot(103.0, 100_000, 105.0)).pauses == ("tool",)
    expired = make_policy("tao-ttl").plan(_ttl_snapshot(106.2, 100_000, 105.0))
    assert expired.pauses == ("tool",)
    assert [a.session for a in expired.assignments] == ["next"]


def test_ttl_without_a_prediction_uses_the_cold_start_ttl() -> None:
    assert make_policy("tao-ttl").plan(_ttl_snapshot(101.5, 700, None)).pauses == ()  # 1.5 s < 2 s
    assert make_policy("tao-ttl").plan(_ttl_snapshot(102.0, 700, None)).pauses == ("tool",)


def test_ttl_q_learns_the_pool_wait_of_reclaimed_sessions_and_holds_longer() -> None:
    policy = make_policy("tao-ttl-q")
    assert policy.plan(_ttl_snapshot(101.0, 700, 160.0)).pauses == ("tool",)  # T = 0: as tao-ttl
    back = Snapshot(200.0, (ReplicaState("r0", 1000, 0),), (
        S("tool", 700, ready=True, credit={"r0": 650}, phase="WAITING", waiting_since_s=190.0),
    ))
    assert [a.session for a in policy.plan(back).assignments] == ["tool"]
    assert policy.queue_delay_s == 10.0  # type: ignore[attr-defined]
    # A 5 s tool, 2 s in: B = 10 s + reload; TTL = 5·ln(B / 5) ≈ 3.5 s, so it keeps its KV,
    # where tao-ttl (T = 0, B < 5 s: TTL 0) takes it back.
    later = _ttl_snapshot(102.0, 700, 105.0)
    assert make_policy("tao-ttl").plan(later).pauses == ("tool",)
    assert policy.plan(later).pauses == ()


def test_ttl_turn_takes_back_a_tool_only_if_it_outlasts_the_waiting_sessions_turn() -> None:
    # The waiting session's turn: 600-token footprint, context 400, so 200 new tokens at one
    # decode step of the empty replica (~14.5 ms) plus a ~0.03 s prefill: about 2.9 s.
    def snap(tool_return: float | None, now: float = 101.0) -> Snapshot:
        base = _ttl_snapshot(now, 700, tool_return)
        waiting = replace(base.sessions[1], context_tokens=400)
        return replace(base, sessions=(base.sessions[0], waiting))
    turn = turn_s(snap(None).sessions[1], 0, 0, 0, TaoConfig())
    assert 2.5 < turn < 3.5
    policy = make_policy("tao-ttl-turn")
    assert policy.plan(snap(101.0 + turn - 0.5)).pauses == ()  # back before the turn would end
    plan = policy.plan(snap(101.0 + turn + 0.5))  # 3.4 s left: tao-ttl-long's 10 s would keep it
    assert plan.pauses == ("tool",)
    assert [a.session for a in plan.assignments] == ["next"]
    assert make_policy("tao-ttl-long").plan(snap(101.0 + turn + 0.5)).pauses == ()
    assert make_policy("tao-ttl-turn").plan(snap(None, now=102.0)).pauses == ("tool",)  # no prediction: cold-start TTL


def test_tao_borrow_gives_reclaimed_tokens_only_to_a_session_whose_turn_ends_before_the_tool_returns() -> None:
    # The tool (TTL run out) is predicted back in 5 s. Two ready 600-token sessions wait and only
    # one fits once it is taken back: "long" has 550 new tokens (~8 s of decode) and cache credit
    # on r0, so the solve prefers it; "short" has 50 (~0.8 s). The shortest turn lends, so tao's
    # turn bound passes the tool, and its solve gives the tokens to "long", still running when
    # the tool returns. tao-borrow gives them to a session that ends its turn first.
    snap = Snapshot(101.0, (ReplicaState("r0", 1000, 700),), (
        S("tool", 700, phase="ACTING", admitted=True, replica="r0", context_tokens=700,
          acting_since_s=100.0, tool_return_s=106.0),
        S("long", 600, ready=True, credit={"r0": 200}, phase="WAITING", context_tokens=50),
        S("short", 600, ready=True, phase="WAITING", context_tokens=550),
    ))
    cfg = TaoConfig()
    assert turn_s(snap.sessions[1], 200, 0, 0, cfg) > 6.0 > 5.0 > 1.0 > turn_s(snap.sessions[2], 0, 0, 0, cfg)
    loose = make_policy("tao").plan(snap)
    assert loose.pauses == ("tool",) and [a.session for a in loose.assignments] == ["long"]
    plan = make_policy("tao-borrow").plan(snap)
    assert plan.pauses == ("tool",) and [a.session for a in plan.assignments] == ["short"]
    # no left-out session's turn ends in time: neither takes the tool back
    slow = replace(snap, sessions=snap.sessions[:2])
    assert make_policy("tao-borrow").plan(slow).pauses == ()
    assert make_policy("tao").plan(slow).pauses == ()  # the shortest turn is "long"'s


def test_ttl_long_takes_back_only_a_tool_predicted_to_run_long() -> None:
    # Both tools are past their TTL (700-token context: reload ~0.04 s, TTL 0).
    short = _ttl_snapshot(101.0, 700, 105.0)  # 4 s left
    long = _ttl_snapshot(101.0, 700, 160.0)  # 59 s left
    assert make_policy("tao-ttl").plan(short).pauses == ("tool",)
    assert make_policy("tao-ttl-long").plan(short).pauses == ()
    plan = make_policy("tao-ttl-long").plan(long)
    assert plan.pauses == ("tool",)
    assert [a.session for a in plan.assignments] == ["next"]


def _within_band(next_footprint: int) -> Snapshot:
    """r0 is 4 % over its 1000 tokens (inside ``tao``'s 5 % pause band, so nothing is paused for
    the excess): a 700-token tool reservation past its TTL and a 340-token running request; a
    ready session of ``next_footprint`` waits. Taking the tool back leaves 1000 − 1040 + 700 =
    660 tokens."""
    return Snapshot(101.0, (ReplicaState("r0", 1000, 1040),), (
        S("tool", 700, phase="ACTING", admitted=True, replica="r0", context_tokens=700,
          acting_since_s=100.0, tool_return_s=160.0),
        S("run", 340, phase="RUNNING", admitted=True, replica="r0"),
        S("next", next_footprint, ready=True, phase="WAITING", context_tokens=100),
    ))


@pytest.mark.parametrize("name", ["tao", "tao-reclaim", "tao-ttl", "tao-ttl-long"])
def test_reclaim_counts_the_excess_a_replica_keeps_inside_the_pause_band(name: str) -> None:
    # Until 2026-12-03 the reclaim started from the free tokens floored at 0, so it paused the
    # tool to admit a 680-token session into 660 tokens; the router refused the admission ("no
    # room") after applying the pause (83 such plans on the grid's GLM c48, seed 0).
    plan = make_policy(name).plan(_within_band(680))
    assert plan.pauses == () and plan.assignments == ()
    fits = make_policy(name).plan(_within_band(650))
    assert fits.pauses == ("tool",)
    assert [(a.session, a.replica) for a in fits.assignments] == [("next", "r0")]


@pytest.mark.parametrize("seed", range(40))
def test_a_reclaiming_plan_admits_no_more_than_its_own_pauses_make_room_for(seed: int) -> None:
    """What the router core accepts: on every replica the plan's admissions fit in its capacity
    less what it holds plus the ACTING reservations the same plan pauses."""
    rng = random.Random(seed)
    reps = tuple(ReplicaState(f"r{j}", 1000, 0) for j in range(2))
    sessions: list[SessionState] = []
    used = {"r0": 0, "r1": 0}
    for i in range(rng.randint(2, 6)):
        rid, f = f"r{rng.randrange(2)}", rng.randrange(100, 500)
        phase = rng.choice(["ACTING", "ACTING", "RUNNING"])
        sessions.append(S(f"a{i}", f, phase=phase, admitted=True, replica=rid, context_tokens=f // 2,
                          acting_since_s=90.0 if phase == "ACTING" else None,
                          tool_return_s=rng.choice([None, 130.0, 200.0]) if phase == "ACTING" else None))
        used[rid] += f
    sessions += [S(f"p{i}", rng.randrange(100, 600), ready=True, phase="WAITING", context_tokens=50)
                 for i in range(rng.randint(1, 4))]
    # each replica's capacity just below or above what it holds, often inside the 5 % pause band
    reps = tuple(replace(r, used_tokens=used[r.id], capacity_tokens=max(100, round(used[r.id] / rng.uniform(0.97, 1.049))))
                 for r in reps)
    snap = Snapshot(100.0, reps, tuple(sessions))
    by_id = {s.id: s for s in sessions}
    for name in ("tao", "tao-reclaim", "tao-ttl", "tao-hold-cost"):
        plan = make_policy(name).plan(snap)
        for r in reps:
            freed = sum(by_id[p].footprint_tokens for p in plan.pauses
                        if by_id[p].replica == r.id and by_id[p].phase == "ACTING")
            taken = sum(by_id[a.session].footprint_tokens for a in plan.assignments if a.replica == r.id)
            assert taken <= max(0, r.capacity_tokens - r.used_tokens + freed), (name, r.id, plan)


def test_an_idle_replica_waives_the_turn_bound() -> None:
    # 1 s of tool left (its TTL has run out), less than the waiting session's ~2.9 s turn: the turn
    # bound (``tao``) keeps the reservation; ``tao-idle`` takes it while no session admitted on r0
    # runs a request, and only then. Idle is the sessions' phases (the router's own
    # state), not the replica's scraped running count, which can be stale.
    def snap(busy: bool = False, ready: bool = False, scraped_running: int = 0) -> Snapshot:
        base = _ttl_snapshot(101.0, 700, 102.0)
        r0 = replace(base.replicas[0], running=scraped_running, used_tokens=750 if busy else 700)
        sessions = (replace(base.sessions[0], ready=ready), base.sessions[1])
        if busy:
            sessions += (S("runs", 50, phase="RUNNING", admitted=True, replica="r0", context_tokens=40),)
        return replace(base, replicas=(r0,), sessions=sessions)
    assert make_policy("tao").plan(snap()).pauses == ()
    plan = make_policy("tao-idle").plan(snap())
    assert plan.pauses == ("tool",)
    assert [(a.session, a.replica) for a in plan.assignments] == [("next", "r0")]
    assert make_policy("tao-idle").plan(snap(scraped_running=3)).pauses == ("tool",)  # a stale scrape
    assert make_policy("tao-idle").plan(snap(busy=True)).pauses == ()  # busy: the turn bound holds
    assert make_policy("tao-idle").plan(snap(ready=True)).pauses == ()  # a ready incumbent stays


def test_an_idle_replica_still_keeps_a_tool_whose_ttl_runs() -> None:
    # 100k-token context (reload ~16.9 s), a 5 s tool 3 s in: its TTL (6.1 s) has not run out
    base = _ttl_snapshot(103.0, 100_000, 105.0)
    assert base.replicas[0].running == 0
    assert make_policy("tao-idle").plan(base).pauses == ()
