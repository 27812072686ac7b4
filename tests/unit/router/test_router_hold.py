"""Why a request is held (``services.router.core.hold``): on purpose by the plan (held long)
or because nothing can serve it (503 after the short hold timeout)."""

from __future__ import annotations

from services.planner.core.registry import make_policy
from services.router.core.hold import PLAN, STUCK, hold_kind
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.state import RouterCore


def rep(rid: str, kv: int = 10_000, healthy: bool = True) -> Replica:
    return Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=kv, healthy=healthy)


def make(gating: bool = True, pause_revalidation: bool = True) -> RouterCore:
    core = RouterCore(CoreConfig(gating=gating, sticky=gating, pause_revalidation=pause_revalidation),
                      None if gating else make_policy("round_robin"))
    core.upsert_replica(rep("r0"), 0.0)
    return core


def req(rid: str, sid: str, tenant: str = "A") -> NewRequest:
    return NewRequest(rid, sid, tenant, False, 100, 50)


def test_a_session_waiting_for_a_live_plan_is_held_on_purpose() -> None:
    core = make()
    assert core.arrive(1.0, req("q1", "s1")) is None
    assert hold_kind(core, "q1", plans_live=True)[0] == PLAN
    kind, why = hold_kind(core, "q1", plans_live=False)  # planner silent and fallback not running
    assert kind == STUCK and "no live plan" in why


def test_nothing_to_serve_it_is_stuck() -> None:
    core = make()
    core.arrive(1.0, req("q1", "s1"))
    core.upsert_replica(rep("r0", healthy=False), 1.5)
    kind, why = hold_kind(core, "q1", plans_live=True)
    assert kind == STUCK and "no replica" in why
    assert hold_kind(core, "unknown", plans_live=True)[0] == STUCK


def test_a_tenant_at_its_budget_cap_is_overload() -> None:
    core = make()
    core.set_caps({"A": 1}, {"A": 1})
    core.arrive(0.0, req("q0", "s0"))
    core.apply_plan(0.1, PlanDecision((("s0", "r0"),), (), 0.1, "test"))
    assert [g.request_id for g in core.dispatch(0.1)] == ["q0"]  # A's one slot is taken
    core.arrive(1.0, req("q1", "s1"))
    kind, why = hold_kind(core, "q1", plans_live=True)
    assert kind == STUCK and "budget cap" in why


def test_a_session_marked_to_pause_is_held_on_purpose() -> None:
    core = make(pause_revalidation=False)  # the pause applies although r0 has room
    core.arrive(0.0, req("q0", "s0"))
    core.apply_plan(0.1, PlanDecision((("s0", "r0"),), (), 0.1, "test"))
    core.dispatch(0.1)
    core.apply_plan(0.5, PlanDecision((), ("s0",), 0.2, "test"))  # RUNNING: marked, pauses at its end
    assert core.sessions["s0"].pause_pending
    core.arrive(0.6, req("q1", "s0"))  # a second request of the session while the first runs
    assert hold_kind(core, "q1", plans_live=True)[0] == PLAN
    core.finish(1.0, "q0", Usage(100, 50, None))  # now paused: back in the pool, waiting for the plan
    assert not core.sessions["s0"].admitted
    assert hold_kind(core, "q1", plans_live=True)[0] == PLAN


def test_per_request_policies_hold_only_when_nothing_can_serve() -> None:
    core = make(gating=False)
    core.upsert_replica(rep("r0", healthy=False), 0.0)
    assert core.arrive(1.0, req("q1", "s1")) is None
    assert hold_kind(core, "q1", plans_live=True)[0] == STUCK
