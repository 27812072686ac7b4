"""What `tao` changes over `tao-paper`, one lever at a time (docs/algorithms.md#policies-tao-and-tao-paper)."""

from __future__ import annotations

from services.planner.core import make_policy
from services.planner.core.model import CreditEvidence, ReplicaState, SessionState, Snapshot
from services.planner.core.policy import plan_pauses


def S(sid: str, f: int, ready: bool = False, credit: dict[str, int] | None = None, **kw: object) -> SessionState:
    creds = tuple(CreditEvidence(r, t, 100.0) for r, t in (credit or {}).items())
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


def test_spread_keeps_the_objective_and_uses_every_replica() -> None:
    reps = (ReplicaState("r0", 10_000, 0), ReplicaState("r1", 10_000, 0))
    snap = Snapshot(0.0, reps, tuple(S(f"s{i}", 500, ready=True, phase="WAITING") for i in range(6)))
    packed = make_policy("tao-no-spread").plan(snap)
    spread = make_policy("tao").plan(snap)
    assert packed.objective == spread.objective
    per = [sum(a.replica == r.id for a in spread.assignments) for r in reps]
    assert per == [3, 3]
