"""``tao-lend`` (``TaoConfig.lend``): a ready session the DP leaves out borrows the reservation of
an admitted ACTING session when that session's tool is predicted to return after the borrower's
turn (prefill of its uncached prompt + decode at the replica's step time, ``turn_s``) ends; the
borrower is paused first once the replica is over capacity, so it gives the tokens back when its
request ends and the lender keeps its admission."""

from __future__ import annotations

from services.common.core.evidence import CacheEvidence
from services.planner.core import make_policy
from services.planner.core.model import ReplicaState, SessionState, Snapshot
from services.planner.core.tao import TAO, turn_s

NOW = 1000.0
CAP = 100_000


def lender(returns_in_s: float | None, footprint: int = 90_000) -> SessionState:
    return SessionState("lender", "t", footprint, False, phase="ACTING", replica="r0", admitted=True,
                        context_tokens=footprint - 1_000, acting_since_s=NOW - 5.0,
                        tool_return_s=None if returns_in_s is None else NOW + returns_in_s)


def borrower(cached: int = 0) -> SessionState:
    credits = (CacheEvidence.of_credit("r0", cached, NOW),) if cached else ()
    return SessionState("borrower", "t", 30_000, True, credits=credits, phase="WAITING",
                        context_tokens=29_500, waiting_since_s=NOW - 20.0)


def snap(*sessions: SessionState, used: int = 90_000, running: int = 0) -> Snapshot:
    return Snapshot(NOW, (ReplicaState("r0", CAP, used, running=running),), sessions)


def the_turn() -> float:
    return turn_s(borrower(), 0, 0, 0, TAO)


def test_the_turn_is_prefill_of_the_uncached_prompt_plus_decode_at_the_replica_step_time() -> None:
    cold = the_turn()
    assert 5.0 < cold < 20.0  # 30k tokens to prefill (~2.6 s), 500 new tokens at ~16 ms per step
    assert turn_s(borrower(), 29_000, 0, 0, TAO) < cold  # a cached prefix shortens the prefill
    assert turn_s(borrower(), 0, 8, 400_000, TAO) > cold  # a busier replica decodes slower


def test_lends_when_the_lenders_tool_outlasts_the_borrowers_turn() -> None:
    plan = make_policy("tao-lend").plan(snap(lender(the_turn() + 1.0), borrower()))
    assert [(a.session, a.replica) for a in plan.assignments] == [("borrower", "r0")]
    assert plan.pauses == ()
    assert make_policy("tao-hold").plan(snap(lender(the_turn() + 1.0), borrower())).assignments == ()


def test_does_not_lend_when_the_tool_returns_before_the_turn_ends() -> None:
    assert make_policy("tao-lend").plan(snap(lender(the_turn() - 1.0), borrower())).assignments == ()


def test_does_not_lend_a_tool_past_its_predicted_return_or_without_a_prediction() -> None:
    assert make_policy("tao-lend").plan(snap(lender(-30.0), borrower())).assignments == ()
    assert make_policy("tao-lend").plan(snap(lender(None), borrower())).assignments == ()


def test_does_not_lend_on_a_replica_already_over_capacity() -> None:
    over = snap(lender(600.0), borrower(), used=CAP + 1_000)
    assert make_policy("tao-lend").plan(over).assignments == ()


def test_does_not_lend_more_than_the_lenders_reservations_cover() -> None:
    small = lender(600.0, footprint=20_000)
    assert make_policy("tao-lend").plan(snap(small, borrower(), used=91_000)).assignments == ()  # 9k + 20k
    assert make_policy("tao-lend").plan(snap(small, borrower(), used=90_000)).assignments != ()  # 10k + 20k


def test_the_borrower_is_paused_first_and_the_lender_keeps_its_reservation() -> None:
    policy = make_policy("tao-lend")
    first = policy.plan(snap(lender(600.0), borrower()))
    assert [a.session for a in first.assignments] == ["borrower"]
    running = SessionState("borrower", "t", 30_000, True, phase="RUNNING", replica="r0", admitted=True,
                           context_tokens=29_500)
    later = snap(lender(590.0), running, used=120_000, running=1)
    assert policy.plan(later).pauses == ("borrower",)  # marked: it leaves when its request ends
    assert make_policy("tao-hold").plan(later).pauses == ("lender",)  # by value the lender would go
