"""The fleet's slot decisions (services/router/core/fleet.py, pure)."""

from __future__ import annotations

import itertools

from services.router.core.fleet import local_caps, owner_token, slot_request, slot_target, waiting_for_slot
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica
from services.router.core.state import RouterCore


def test_slot_target_covers_demand_keeps_a_spare_only_when_uncontended_and_never_drops_in_flight() -> None:
    assert slot_target(in_flight=0, held=0, cap=8, others=0, waiters=0) == 4  # half the free slots as a spare
    assert slot_target(in_flight=2, held=1, cap=8, others=2, waiters=0) == 5  # 3 needed + half of 3 free (rounded up)
    assert slot_target(in_flight=2, held=1, cap=8, others=2, waiters=1) == 3  # someone waits: no spare
    assert slot_target(in_flight=5, held=0, cap=3, others=0, waiters=0) == 5  # the cap shrank: keep what runs
    assert slot_target(in_flight=0, held=9, cap=3, others=0, waiters=0) == 3  # never ask past the cap


def test_slot_target_properties() -> None:
    for in_flight, held, cap, others, waiters in itertools.product(range(5), range(5), range(6), range(7), range(2)):
        t = slot_target(in_flight, held, cap, others, waiters)
        assert t >= in_flight
        assert t <= max(in_flight, cap)
        if waiters:
            assert t <= max(in_flight, in_flight + held)


def test_an_idle_router_asks_once_per_term_so_slots_redis_still_holds_under_its_id_come_back() -> None:
    # The seed-4 hang of the randomized fleet test: a router kept a spare slot, its member lease
    # lapsed in Redis (the event loop stalled), it rejoined in a new term with its allotments
    # forgotten (cur 0) while Redis still counted the slot under its id. Idle, it never called
    # again, and the other routers' requests of the tenant waited at cap 0 until hold_timeout_s.
    assert slot_request(0, 0, 0, cap=2, others=0, waiters=1, confirmed=False, fresh=False) == 0  # give it back
    assert slot_request(0, 0, 0, cap=2, others=0, waiters=1, confirmed=True, fresh=False) is None  # known: none
    # a known allotment that is fresh and uncontended is left alone, unless unconfirmed
    assert slot_request(0, 0, 1, cap=2, others=0, waiters=0, confirmed=True, fresh=True) is None
    assert slot_request(0, 0, 1, cap=2, others=0, waiters=0, confirmed=False, fresh=True) == 1
    assert slot_request(0, 0, 1, cap=2, others=0, waiters=0, confirmed=True, fresh=False) == 1  # re-checked
    assert slot_request(0, 0, 1, cap=2, others=1, waiters=1, confirmed=True, fresh=True) == 0  # someone waits
    assert slot_request(1, 2, 1, cap=4, others=0, waiters=0, confirmed=True, fresh=True) == 4  # demand: asks
    for in_flight, held, cur, others, waiters, confirmed, fresh in itertools.product(
            range(3), range(3), range(3), range(3), range(2), (False, True), (False, True)):
        want = slot_request(in_flight, held, cur, 3, others, waiters, confirmed=confirmed, fresh=fresh)
        if not confirmed:
            assert want is not None  # an unconfirmed tenant is always asked
        if want is not None:
            assert want >= in_flight  # never below what runs
        if held:
            assert want is not None


def test_local_caps_are_the_allotments_within_the_budget_cap() -> None:
    assert local_caps({"A": 4, "B": 2}, {"A": 3, "B": 5}) == {"A": 3, "B": 2}
    assert local_caps({"A": 4}, {}) == {"A": 0}  # no slots held: nothing admitted for a capped tenant
    assert owner_token(3, "r1") == "3 r1"


def test_requests_a_slot_would_release_and_one_for_the_pool_count_as_waiting_for_slots() -> None:
    core = RouterCore(CoreConfig(gating=True, sticky=True))
    core.upsert_replica(Replica(id="r0", url="http://r0", kv_capacity_tokens=10_000, healthy=True), 0.0)
    assert core.arrive(1.0, NewRequest("q1", "admitted", "A", False, 100, 50)) is None
    report = core.apply_plan(1.0, PlanDecision((("admitted", "r0"),), (), 1.0, "test"))
    assert report.admitted == (("admitted", "r0"),)
    core.set_caps({"A": 0}, {"A": 0})  # this router holds no slot of A
    assert core.dispatch(1.0) == []  # admitted, but no slot
    assert core.arrive(1.0, NewRequest("q2", "pooled", "A", False, 100, 50)) is None  # the plan holds it
    assert core.arrive(1.0, NewRequest("q3", "pooled2", "A", False, 100, 50)) is None
    assert core.tenant_held["A"] == 3
    assert waiting_for_slot(core, "A") == 2  # the admitted one, plus one for the pool
    assert waiting_for_slot(core, "B") == 0
    core.set_caps({"A": 1}, {"A": 1})
    assert [g.request_id for g in core.dispatch(1.0)] == ["q1"]
    assert waiting_for_slot(core, "A") == 1


def test_demand_of_several_routers_is_summed_per_tenant() -> None:
    from services.common.fleet import demand_field, merge_demand
    from services.common.records import TenantDemandRecord

    def rec(tenant: str, epoch: str, waiting: int, in_flight: int, p99: float, at: float,
            hold: float = 0.0) -> TenantDemandRecord:
        return TenantDemandRecord(epoch=epoch, rev=1, tenant=tenant, waiting=waiting, in_flight=in_flight,
                                  p99_latency_s=p99, p99_hold_s=hold, updated_at_unix_s=at)

    merged = {r.tenant: r for r in merge_demand([rec("A", "e1", 1, 2, 0.5, 10.0, 0.4),
                                                 rec("A", "e2", 3, 4, 0.9, 9.0, 0.3),
                                                 rec("B", "e2", 0, 1, 0.1, 8.0)])}
    assert (merged["A"].waiting, merged["A"].in_flight, merged["A"].p99_latency_s) == (4, 6, 0.9)
    assert merged["A"].p99_hold_s == 0.4, "the worst router's hold: a lent slot may sit behind any of them"
    assert merged["A"].updated_at_unix_s == 10.0 and merged["B"].in_flight == 1
    assert demand_field("A", "r1") == "A@r1"


def test_a_shared_prefix_counts_once_per_replica_over_every_routers_sessions() -> None:
    from services.common.fleet import fleet_used
    from services.common.records import SessionRecord

    def rec(sid: str, replica: str | None, footprint: int, key: str = "", shared: int = 0,
            admitted: bool = True) -> SessionRecord:
        return SessionRecord(epoch="e", rev=1, session_id=sid, tenant="A", phase="ACTING", replica=replica,
                             admitted=admitted, footprint_tokens=footprint, prefix_key=key, prefix_tokens=shared,
                             shared_tokens=shared, created_at_unix_s=0.0, updated_at_unix_s=0.0)

    used = fleet_used([
        rec("a", "r0", 6_000, "sys", 4_000),  # router 1's session
        rec("b", "r0", 7_000, "sys", 4_000),  # router 2's, the same system prompt on the same replica
        rec("c", "r0", 5_000, "other", 1_000),
        rec("d", "r1", 6_000, "sys", 4_000),
        rec("e", "r1", 9_000),  # counts its prefix itself
        rec("f", None, 8_000, "sys", 4_000, admitted=False),  # in the pool: nowhere
    ])
    assert used == {"r0": 6_000 + 7_000 + 4_000 + 5_000 + 1_000, "r1": 6_000 + 4_000 + 9_000}
