"""``CoreConfig.lend`` (the ``tao-lend`` lever): a plan's assignment may take, besides the free
room, the reservations of the sessions admitted on its replica that are between requests; the
planner decides which (it has the tool-return predictions) and pauses the borrower first."""

from __future__ import annotations

from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.state import RouterCore


def core(lend: bool) -> RouterCore:
    c = RouterCore(CoreConfig(gating=True, fast_admit="cache", target_utilisation=1.0, lend=lend))
    c.upsert_replica(Replica(id="r0", url="http://r0", kv_capacity_tokens=1500, healthy=True, models=("m",)), 0.0)
    assert c.arrive(0.0, NewRequest("q0", "a", "A", False, 1000, 100, "m")) is not None  # fast admit: a's room
    assert c.arrive(0.0, NewRequest("q1", "b", "A", False, 1000, 100, "m")) is None  # no room: held
    return c


def loan(c: RouterCore, now_s: float) -> list[str]:
    report = c.apply_plan(now_s, PlanDecision((("b", "r0"),), (), now_s, "planner"))
    return [sid for sid, _ in report.admitted]


def test_a_loan_takes_the_reservation_of_a_session_between_requests() -> None:
    c = core(lend=True)
    assert loan(c, 1.0) == []  # a's request still runs: its reservation is in use
    c.finish(2.0, "q0", Usage(1000, 100, cached_tokens=None))
    assert loan(c, 3.0) == ["b"] and c.sessions["a"].admitted
    assert [g.request_id for g in c.dispatch(3.0)] == ["q1"]
    assert c.used["r0"] > c.capacity("r0")


def test_without_lend_the_assignment_needs_free_room() -> None:
    c = core(lend=False)
    c.finish(2.0, "q0", Usage(1000, 100, cached_tokens=None))
    assert loan(c, 3.0) == []
