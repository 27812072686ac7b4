"""Router core: session state machine, admission, caps, plans, replicas (pure, no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.planner.core.registry import make_policy
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.plans import outcome_counts
from services.router.core.snapshot import build_snapshot
from services.router.core.state import RouterCore, SessionBusy, SessionConflict, UnknownSession, policy_flags


def rep(rid: str, kv: int = 10_000, healthy: bool = True, draining: bool = False) -> Replica:
    return Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=kv, healthy=healthy, draining=draining)


def make(gating: bool = True, policy: str | None = None, replicas: int = 2, **cfg: object) -> RouterCore:
    config = CoreConfig(gating=gating, sticky=gating, **cfg)  # type: ignore[arg-type]
    core = RouterCore(config, make_policy(policy) if policy else None)
    for i in range(replicas):
        core.upsert_replica(rep(f"r{i}"), 0.0)
    return core


def req(rid: str, sid: str, tenant: str = "A", prompt: int = 100, max_tokens: int | None = 50,
        single: bool = False) -> NewRequest:
    return NewRequest(rid, sid, tenant, single, prompt, max_tokens)


def check_invariants(core: RouterCore) -> None:
    used: dict[str, int] = {}
    copies: set[tuple[str, str]] = set()  # (replica, prefix key) with one shared copy counted
    for s in core.sessions.values():
        assert s.held >= 0 and s.in_flight >= 0
        assert s.shared_tokens == 0 or core.config.share_prefixes_below_tokens > 0
        if s.admitted:
            assert s.replica is not None
            used[s.replica] = used.get(s.replica, 0) + s.footprint_tokens
            if s.shared_tokens:
                copies.add((s.replica, s.prefix_key))
    assert set(core._prefix_held) == copies
    for (rid, _), tokens in core._prefix_held.items():
        used[rid] = used.get(rid, 0) + tokens
    for rid in core.replicas:
        assert core.used.get(rid, 0) == used.get(rid, 0), rid
    assert not set(core.held) & set(core.in_flight)
    held_by_session: dict[str, int] = {}
    for h in core.held.values():
        held_by_session[h.session_id] = held_by_session.get(h.session_id, 0) + 1
    for sid, s in core.sessions.items():
        assert s.held == held_by_session.get(sid, 0)
        assert s.in_flight == sum(1 for f in core.in_flight.values() if f.session_id == sid)
    for tenant, n in core.tenant_in_flight.items():
        assert n == sum(1 for f in core.in_flight.values() if f.tenant == tenant)
        assert n >= 0
    for tenant, n in core.tenant_held.items():
        assert n == sum(1 for h in core.held.values() if h.tenant == tenant)
        assert list(core._held_by_tenant.get(tenant, {})) == [r for r, h in core.held.items() if h.tenant == tenant]


def admit(core: RouterCore, sid: str, replica: str, now_s: float) -> None:
    report = core.apply_plan(now_s, PlanDecision(((sid, replica),), (), now_s, "test"))
    assert report.admitted == ((sid, replica),), report


def test_gating_holds_until_a_plan_admits_then_sticks() -> None:
    core = make()
    assert core.arrive(1.0, req("q1", "s1")) is None
    assert core.phase(core.sessions["s1"]) == "WAITING"
    assert core.dispatch(1.0) == []
    admit(core, "s1", "r1", 1.1)
    grants = core.dispatch(1.1)
    assert [(g.request_id, g.replica) for g in grants] == [("q1", "r1")]
    assert core.phase(core.sessions["s1"]) == "RUNNING"
    core.finish(2.0, "q1", Usage(100, 50, None))
    s = core.sessions["s1"]
    assert core.phase(s) == "ACTING" and s.admitted and s.replica == "r1"
    # the next request of an admitted session goes straight to the same replica
    g = core.arrive(3.0, req("q2", "s1", prompt=200))
    assert g is not None and g.replica == "r1"
    check_invariants(core)


def test_footprint_and_cache_evidence_follow_usage() -> None:
    core = make()
    core.arrive(0.0, req("q1", "s1", prompt=1000, max_tokens=100))
    assert core.sessions["s1"].footprint_tokens == 1000 + 100  # held prompt + min(max_tokens, default)
    admit(core, "s1", "r0", 0.0)
    core.dispatch(0.0)
    core.finish(1.0, "q1", Usage(1000, 80, None))
    s = core.sessions["s1"]
    assert s.tokens.context_tokens == 1080 and s.footprint_tokens == 1080 + 80
    assert s.cache[0].kind == "volume"  # replica never reported cached tokens
    core.arrive(2.0, req("q2", "s1", prompt=1280))
    core.finish(3.0, "q2", Usage(1280, 40, 1072))
    s = core.sessions["s1"]
    # append sample = 1280 - 1080 = 200; output EWMA = 0.3*40 + 0.7*80 = 68
    assert s.tokens.expected_append_tokens == 200
    assert s.footprint_tokens == 1320 + 200 + 68
    ev = s.cache[0]
    assert ev.kind == "cached_tokens" and ev.resident_tokens == 1320 and ev.cached_tokens == 1072
    assert s.last_cached_tokens == 1072
    assert core.replicas["r0"].reports_cached_tokens
    check_invariants(core)


def test_a_session_bigger_than_any_replica_counts_as_one_whole_replica() -> None:
    """kv 10,000 × 0.95 = 9,500 admissible: a 9,800-token prompt (it fits a 10,000-token
    max_model_len) must still be admissible, alone. (ThunderAgent, faithfully, wants room for
    tokens + a 100-token buffer and only force-resumes such a program after 30 minutes.)"""
    for policy in ("tao", "tao-bfd", "tao-ta-pause", "sjf"):
        core = make(policy=policy)
        core.arrive(0.0, req("q1", "big", prompt=9_800, max_tokens=100))
        s = core.sessions["big"]
        assert s.footprint_tokens == 9_500
        plan = core.policy.plan(build_snapshot(core, 0.0, {}))  # type: ignore[union-attr]
        assert [a.session for a in plan.assignments] == ["big"], (policy, plan)
        check_invariants(core)


def test_tenant_caps_hold_and_release_in_fifo_order() -> None:
    core = make()
    core.set_caps({"A": 1})
    for i in range(3):
        core.arrive(0.0, req(f"q{i}", f"s{i}"))
        admit(core, f"s{i}", "r0", 0.0)
    grants = core.dispatch(0.0)
    assert [g.request_id for g in grants] == ["q0"]
    assert "tenant A at cap 1" in core.explain("s1")
    core.finish(1.0, "q0", Usage(100, 10))
    assert [g.request_id for g in core.dispatch(1.0)] == ["q1"]
    # other tenants are not blocked by A's cap; tenants absent from the caps are unlimited
    g = core.arrive(1.0, req("b0", "t0", tenant="B"))
    assert g is None
    admit(core, "t0", "r1", 1.0)
    assert [g.request_id for g in core.dispatch(1.0)] == ["b0"]
    core.set_caps(None)
    assert [g.request_id for g in core.dispatch(1.0)] == ["q2"]
    check_invariants(core)


def test_plan_revalidation_rejects_stale_and_infeasible_parts() -> None:
    core = make()
    core.upsert_replica(rep("small", kv=100), 0.0)
    core.upsert_replica(rep("sick", healthy=False), 0.0)
    core.upsert_replica(rep("drain", draining=True), 0.0)
    core.arrive(5.0, req("q1", "s1", prompt=500))
    plan = PlanDecision(
        (("ghost", "r0"), ("s1", "small"), ("s1", "sick"), ("s1", "drain"), ("s1", "nope")), (), 6.0, "t"
    )
    report = core.apply_plan(6.0, plan)
    reasons = dict((s, r) for s, r in report.rejected if s == "ghost")
    assert "unknown" in reasons["ghost"]
    texts = [r for s, r in report.rejected if s == "s1"]
    assert any("no room" in t for t in texts) and any("unhealthy" in t for t in texts)
    assert any("draining" in t for t in texts) and any("unknown replica" in t for t in texts)
    assert not core.sessions["s1"].admitted
    # a plan from a snapshot taken before the session's placement changed is stale
    old = core.apply_plan(7.0, PlanDecision((("s1", "r0"),), (), 4.0, "t"))
    assert old.admitted == () and "after the snapshot" in old.rejected[0][1]
    admit(core, "s1", "r0", 7.0)
    twice = core.apply_plan(8.0, PlanDecision((("s1", "r1"),), (), 8.0, "t"))
    assert "already admitted" in twice.rejected[0][1]
    check_invariants(core)


def test_pauses_apply_before_assignments_and_never_cut_running_requests() -> None:
    core = make(replicas=0)
    core.upsert_replica(rep("r0", kv=2000), 0.0)  # capacity 1900
    core.upsert_replica(rep("r1", kv=10_000), 0.0)
    for sid in ("a", "b"):
        core.arrive(0.0, req(f"q{sid}", sid, prompt=800, max_tokens=100))
    core.apply_plan(0.0, PlanDecision((("a", "r0"), ("b", "r0")), (), 0.0, "t"))
    core.dispatch(0.0)
    assert core.used["r0"] == 2 * 900  # a request in flight counts its prompt
    core.finish(1.0, "qa", Usage(800, 100))  # a: ACTING admitted (1000); b: RUNNING (900)
    assert core.used["r0"] == 1000 + 900
    core.upsert_replica(rep("r0", kv=1700), 1.5)  # capacity 1615: over by 285
    core.arrive(2.0, req("qc", "c", prompt=300, max_tokens=100))
    # pausing a covers the excess and frees the room c takes in the same plan; b stays
    report = core.apply_plan(2.0, PlanDecision((("c", "r0"),), ("a", "b"), 2.0, "t"))
    assert report.paused == ("a",) and report.pause_deferred == ()
    assert report.rejected == (("b", "pause: replica no longer over capacity"),)
    assert report.admitted == (("c", "r0"),)
    assert core.phase(core.sessions["a"]) == "PAUSED" and not core.sessions["a"].admitted
    # over again (capacity 950 < 900 + 400): the RUNNING b is marked, never cut
    core.upsert_replica(rep("r0", kv=1000), 2.5)
    report = core.apply_plan(3.0, PlanDecision((), ("b",), 3.0, "t"))
    assert report.pause_deferred == ("b",)
    b = core.sessions["b"]
    assert b.admitted and b.pause_pending and core.phase(b) == "RUNNING"
    core.finish(4.0, "qb", Usage(800, 100))
    assert core.phase(core.sessions["b"]) == "PAUSED"
    check_invariants(core)


def test_pause_revalidation_does_not_pause_twice_for_one_excess() -> None:
    core = make(replicas=0)
    core.upsert_replica(rep("r0", kv=3000), 0.0)  # capacity 2850
    for sid in ("a", "b", "c"):
        core.arrive(0.0, req(f"q{sid}", sid, prompt=800, max_tokens=100))
    core.apply_plan(0.0, PlanDecision(tuple((x, "r0") for x in "abc"), (), 0.0, "t"))
    core.dispatch(0.0)  # all three RUNNING, 2700 used
    core.upsert_replica(rep("r0", kv=2500), 0.5)  # capacity 2375: over by 325 < one footprint
    report = core.apply_plan(1.0, PlanDecision((), ("a", "b", "c"), 1.0, "t"))
    assert report.pause_deferred == ("a",)
    assert [why for _, why in report.rejected] == ["pause: replica no longer over capacity"] * 2
    # a later plan (its snapshot cannot show a's mark) asks again for the same excess
    report = core.apply_plan(2.0, PlanDecision((), ("b",), 2.0, "t"))
    assert report.pause_deferred == () and report.rejected == (("b", "pause: replica no longer over capacity"),)
    report = core.apply_plan(2.0, PlanDecision((), ("a",), 2.0, "t"))
    assert report.rejected == (("a", "pause: already marked"),)
    # without revalidation every requested pause is applied
    raw = make(replicas=0, pause_revalidation=False)
    raw.upsert_replica(rep("r0", kv=3000), 0.0)
    for sid in ("a", "b"):
        raw.arrive(0.0, req(f"q{sid}", sid, prompt=800, max_tokens=100))
    raw.apply_plan(0.0, PlanDecision((("a", "r0"), ("b", "r0")), (), 0.0, "t"))
    raw.dispatch(0.0)
    assert raw.apply_plan(1.0, PlanDecision((), ("a", "b"), 1.0, "t")).pause_deferred == ("a", "b")
    check_invariants(core)
    check_invariants(raw)


def test_pause_revalidation_keeps_a_pause_that_makes_room_for_the_plans_own_admission() -> None:
    """A reclaim (``tao-ttl``, ``tao-reclaim``): the replica is within capacity, and the plan pauses
    an ACTING session to admit a ready one into its room. Counting only the excess (as before)
    dropped the pause and then the admission for want of room, every plan, so a reclaim
    happened only while its replica was over capacity anyway."""
    core = make(replicas=0)
    core.upsert_replica(rep("r0", kv=2000), 0.0)  # capacity 1900
    core.arrive(0.0, req("qa", "a", prompt=800, max_tokens=100))
    admit(core, "a", "r0", 0.0)
    core.dispatch(0.0)
    core.finish(1.0, "qa", Usage(800, 100))  # a: ACTING, admitted with 1000 of 1900
    core.arrive(2.0, req("qc", "c", prompt=1200, max_tokens=100))  # c needs 1300 > 900 free
    report = core.apply_plan(2.0, PlanDecision((("c", "r0"),), ("a",), 2.0, "t"))
    assert report.paused == ("a",) and report.admitted == (("c", "r0"),), report
    assert core.phase(core.sessions["a"]) == "PAUSED"
    # a pause for an admission that no longer holds (c is admitted already) is not needed
    stale = core.apply_plan(3.0, PlanDecision((("c", "r0"),), ("c",), 3.0, "t"))
    assert stale.paused == () and ("c", "pause: replica no longer over capacity") in stale.rejected
    assert core.sessions["c"].admitted
    check_invariants(core)


def test_a_reclaim_pause_of_a_session_that_resumed_since_the_snapshot_is_dropped() -> None:
    """The plan read ``a`` between requests (its tool running) and reclaims its reservation for
    ``c``; by the time the plan arrives ``a`` has sent its next request. Marking ``a`` would pause
    a session that decodes again, at its request's end, for an admission that finds no room
    before then: the pause is dropped, and so is the admission. A pause that ends a real excess
    is still kept for a session holding a request (it is marked). Only for policies whose pauses
    are reclaims of that kind (``drop_resumed_reclaims``, the ``tao`` family): Continuum's TTL
    expiry unpins the session whatever it does next."""

    def resumed(**cfg: object) -> RouterCore:
        core = make(replicas=0, **cfg)
        core.upsert_replica(rep("r0", kv=2000), 0.0)  # capacity 1900
        core.arrive(0.0, req("qa", "a", prompt=800, max_tokens=100))
        admit(core, "a", "r0", 0.0)
        core.dispatch(0.0)
        core.finish(1.0, "qa", Usage(800, 100))  # a: ACTING with 1000 of 1900 (the plan's snapshot)
        core.arrive(2.0, req("qc", "c", prompt=1200, max_tokens=100))  # c needs 1300 > 900 free
        assert core.arrive(2.1, req("qa2", "a", prompt=1000, max_tokens=100)) is not None  # a resumes
        return core

    unpins = resumed()  # without the flag the pause holds: a is marked, c waits for its room
    report = unpins.apply_plan(2.2, PlanDecision((("c", "r0"),), ("a",), 2.0, "t"))
    assert report.pause_deferred == ("a",) and report.admitted == ()
    check_invariants(unpins)
    core = resumed(drop_resumed_reclaims=True)
    report = core.apply_plan(2.2, PlanDecision((("c", "r0"),), ("a",), 2.0, "t"))
    assert report.paused == () and report.pause_deferred == () and report.admitted == ()
    assert ("a", "pause: session resumed, its reservation is no longer free to reclaim") in report.rejected
    assert "no room on r0" in dict(report.rejected)["c"]
    assert outcome_counts(report) == {"pause_dropped_resumed": 1, "rejected": 1}  # tao_router_plan_parts
    a = core.sessions["a"]
    assert a.admitted and not a.pause_pending and core.phase(a) == "RUNNING"
    core.finish(3.0, "qa2", Usage(1000, 100))
    assert core.sessions["a"].admitted  # it stays admitted at its request's end
    # the same session holding a request on a replica over capacity by itself is marked
    core.arrive(4.0, req("qa3", "a", prompt=1200, max_tokens=100))
    core.dispatch(4.0)
    core.upsert_replica(rep("r0", kv=1000), 4.5)  # capacity 950 < a's 1300
    report = core.apply_plan(5.0, PlanDecision((("c", "r0"),), ("a",), 3.5, "t"))
    assert report.pause_deferred == ("a",) and core.sessions["a"].pause_pending
    check_invariants(core)


def test_replica_failure_before_first_byte_retries_elsewhere_with_zero_credit() -> None:
    core = make(replicas=3, max_attempts=2)
    core.arrive(0.0, req("q1", "s1"))
    admit(core, "s1", "r0", 0.0)
    core.dispatch(0.0)
    core.finish(1.0, "q1", Usage(100, 50, 0))
    g = core.arrive(2.0, req("q2", "s1"))
    assert g is not None and g.replica == "r0"
    assert core.fail_before_first_byte(2.1, "q2", replica_down=True) is True
    s = core.sessions["s1"]
    assert not s.admitted and s.cache == () and core.phase(s) == "WAITING"
    assert not core.replicas["r0"].healthy
    assert "unhealthy" in core.apply_plan(2.2, PlanDecision((("s1", "r0"),), (), 2.2, "t")).rejected[0][1]
    admit(core, "s1", "r1", 2.2)
    g2 = core.dispatch(2.2)
    assert g2[0].replica == "r1" and g2[0].attempt == 2
    # second failure: attempts used up -> dropped, session back in the pool
    assert core.fail_before_first_byte(2.3, "q2", replica_down=False) is False
    assert "q2" not in core.held and core.phase(core.sessions["s1"]) == "PAUSED"
    check_invariants(core)


def test_drain_and_mid_stream_failure_return_sessions_to_the_pool() -> None:
    core = make()
    for sid in ("a", "b"):
        core.arrive(0.0, req(f"q{sid}", sid))
        admit(core, sid, "r0", 0.0)
    core.dispatch(0.0)
    core.finish(1.0, "qa", Usage(100, 5))
    core.upsert_replica(rep("r0", draining=True), 1.5)
    assert not core.sessions["a"].admitted  # ACTING: leaves at once
    assert core.sessions["b"].admitted and core.sessions["b"].pause_pending  # RUNNING: at request end
    core.finish(2.0, "qb", None)  # failed after first byte
    assert not core.sessions["b"].admitted and core.sessions["b"].tokens.requests == 0
    assert core.used["r0"] == 0
    check_invariants(core)


def test_single_turn_sessions_end_with_their_request() -> None:
    core = make()
    core.arrive(0.0, req("q", "one", single=True))
    admit(core, "one", "r0", 0.0)
    core.dispatch(0.0)
    core.finish(1.0, "q", Usage(10, 1))
    assert "one" not in core.sessions
    assert "one" in core.take_dirty().ended
    core.arrive(2.0, req("q2", "two", single=True))
    core.abandon(3.0, "q2")  # hold timeout
    assert "two" not in core.sessions and core.tenant_held["A"] == 0


def test_release_expire_conflict() -> None:
    core = make(session_ttl_s=10.0)
    core.arrive(0.0, req("q1", "s1"))
    with pytest.raises(SessionConflict):
        core.arrive(0.0, req("x", "s1", tenant="B"))
    assert "x" not in core.held
    admit(core, "s1", "r0", 0.0)
    core.dispatch(0.0)
    with pytest.raises(SessionBusy):
        core.release(0.5, "s1")
    with pytest.raises(UnknownSession):
        core.release(0.5, "nope")
    core.finish(1.0, "q1", Usage(10, 1))
    core.arrive(1.0, req("q2", "s2"))
    assert core.release(1.0, "s2") == ["q2"]
    assert core.expire(5.0) == []
    assert core.expire(11.5) == ["s1"]
    assert core.sessions == {} and core.used["r0"] == 0
    check_invariants(core)


def test_per_request_policy_routes_at_once_and_is_not_sticky() -> None:
    core = make(gating=False, policy="round_robin", replicas=2)
    seen = []
    for i in range(4):
        g = core.arrive(float(i), req(f"q{i}", "s"))
        assert g is not None
        seen.append(g.replica)
        core.finish(float(i) + 0.5, f"q{i}", Usage(10, 1))
        assert not core.sessions["s"].admitted and core.phase(core.sessions["s"]) == "ACTING"
    assert seen == ["r0", "r1", "r0", "r1"]
    report = core.apply_plan(9.0, PlanDecision((("s", "r0"),), (), 9.0, "planner"))
    assert report.admitted == ()
    core.upsert_replica(rep("r0", healthy=False), 10.0)
    core.upsert_replica(rep("r1", healthy=False), 10.0)
    assert core.arrive(10.0, req("q9", "s")) is None  # no healthy replica: held
    core.upsert_replica(rep("r1"), 11.0)
    assert [g.replica for g in core.dispatch(11.0)] == ["r1"]
    check_invariants(core)


def test_snapshot_matches_contract_a_and_validates() -> None:
    core = make()
    core.set_caps({"A": 3})
    core.arrive(0.0, req("q1", "s1", prompt=300))
    admit(core, "s1", "r0", 0.0)
    core.dispatch(0.0)
    core.finish(1.0, "q1", Usage(300, 30, 0))
    core.arrive(2.0, req("q2", "s2", prompt=50))
    snap = build_snapshot(core, 3.0, {"s1": True})
    snap.validate()
    by_id = {s.id: s for s in snap.sessions}
    assert by_id["s1"].admitted and by_id["s1"].phase == "ACTING" and by_id["s1"].ready
    assert by_id["s1"].credits[0].credit_tokens == 330 and by_id["s1"].credits[0].kind == "cached_tokens"
    assert by_id["s2"].phase == "WAITING" and by_id["s2"].ready and not by_id["s2"].admitted
    r0 = next(r for r in snap.replicas if r.id == "r0")
    assert r0.capacity_tokens == 9500 and r0.used_tokens == by_id["s1"].footprint_tokens
    assert snap.tenant_headroom == {"A": 3}
    # the local fallback (TAO) admits the waiting session
    plan = make_policy("tao").plan(snap)
    report = core.apply_plan(3.1, PlanDecision(tuple((a.session, a.replica) for a in plan.assignments),
                                               plan.pauses, 3.0, "fallback"))
    assert ("s2", report.admitted[0][1]) in report.admitted
    assert core.dispatch(3.1)[0].request_id == "q2"


OPS = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "plan", "pause", "finish", "fail", "failmid", "abandon", "down", "up",
                         "drain", "caps", "nocaps", "release", "expire"]),
        st.integers(0, 5),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS, st.booleans())
def test_random_events_keep_invariants(ops: list[tuple[str, int, int]], share: bool) -> None:
    """``share``: the core reserves shared prefixes once per replica, and the requests name one
    of two prefixes (``used`` then holds one copy per replica and prefix its admitted sessions hold)."""
    core = RouterCore(CoreConfig(session_ttl_s=5.0, max_attempts=2,
                                share_prefixes_below_tokens=4000 if share else 0))
    for i in range(3):
        core.upsert_replica(Replica(f"r{i}", f"http://r{i}", kv_capacity_tokens=3000, healthy=True), 0.0)
    now = 0.0
    counter = 0
    for op, a, b in ops:
        now += 0.5
        before_in_flight = set(core.in_flight)
        before_counts = dict(core.tenant_in_flight)
        tenant = "AB"[a % 2]
        sid = f"s{a}"
        if op == "arrive":
            counter += 1
            s = core.sessions.get(sid)
            if s is None or s.tenant == tenant:
                core.arrive(now, NewRequest(f"q{counter}", sid, tenant, a == 5, 200 + 100 * b, 100,
                                            prefix_key=f"p{a % 2}" if b else "", prefix_tokens=150 + 50 * (a % 2)))
        elif op == "plan":
            core.apply_plan(now, PlanDecision(((sid, f"r{b}"),), (), now, "t"))
        elif op == "pause":
            core.apply_plan(now, PlanDecision((), (sid,), now, "t"))
            assert set(core.in_flight) == before_in_flight  # a pause never cuts a request
        elif op in ("finish", "failmid", "fail") and core.in_flight:
            rid = sorted(core.in_flight)[a % len(core.in_flight)]
            if op == "finish":
                finished_tenant = core.in_flight[rid].tenant
                core.finish(now, rid, Usage(300 + b, 20, 100 * b if b else None))
                core.dispatch(now, tenant=finished_tenant)
                assert core.dispatch(now) == []  # the tenant-only dispatch missed nothing
            elif op == "failmid":
                core.finish(now, rid, None)
            else:
                core.fail_before_first_byte(now, rid, replica_down=b == 0)
        elif op == "abandon" and core.held:
            core.abandon(now, sorted(core.held)[a % len(core.held)])
        elif op in ("down", "up", "drain"):
            core.upsert_replica(Replica(f"r{b}", f"http://r{b}", kv_capacity_tokens=3000, healthy=op != "down",
                                        draining=op == "drain"), now)
            assert set(core.in_flight) == before_in_flight
        elif op == "caps":
            core.set_caps({"A": b, "B": a})
        elif op == "nocaps":
            core.set_caps(None)
        elif op == "release":
            try:
                core.release(now, sid, force=b == 1)
            except (SessionBusy, LookupError):
                pass
        elif op == "expire":
            core.expire(now)
        before_dispatch = dict(core.tenant_in_flight)
        grants = core.dispatch(now)
        for g in grants:
            s = core.sessions[g.session_id]
            assert s.admitted and s.replica == g.replica and core.replicas[g.replica].healthy
        if core.caps is not None:
            for t, cap in core.caps.items():
                assert core.tenant_in_flight.get(t, 0) <= max(cap, before_dispatch.get(t, 0))
        for t, n in core.tenant_in_flight.items():
            assert n <= before_counts.get(t, 0) + len(core.in_flight)
        for rid, used in core.used.items():
            assert used >= 0, rid
        check_invariants(core)


def test_restored_sessions_leave_a_replica_that_turns_out_dead() -> None:
    from services.router.core.model import Session

    core = RouterCore(CoreConfig())
    core.upsert_replica(rep("r0", healthy=False), 0.0)  # registered, not probed yet
    core.restore([Session(id="s", tenant="A", created_s=0.0, updated_s=0.0, placed_s=0.0, replica="r0",
                          admitted=True)])
    assert core.sessions["s"].admitted and core.used["r0"] > 0
    core.upsert_replica(rep("r0", healthy=False, draining=False), 1.0)  # first probe: still down
    assert not core.sessions["s"].admitted and core.used["r0"] == 0
    check_invariants(core)


def test_policy_flags_are_what_the_runtime_and_the_simulator_configure_the_core_with() -> None:
    tao, continuum, lend = (policy_flags(make_policy(n)) for n in ("tao", "continuum", "tao-lend"))
    assert tao["gating"] and tao["sticky"] and tao["drop_resumed_reclaims"] and not tao["lend"]
    assert continuum["gating"] and not continuum["drop_resumed_reclaims"]
    assert lend["lend"] and not policy_flags(make_policy("round_robin"))["gating"]
    # CoreConfig.fast_admit: each gating policy's own arrival rule; the paper's TAO and SJF wait for a plan
    rules = {n: policy_flags(make_policy(n))["fast_admit"] for n in
             ("tao", "tao-fast", "tao-hold", "tao-paper", "thunderagent", "continuum", "continuum-affine", "sjf")}
    assert rules == {"tao": "cache", "tao-fast": "cache", "tao-hold": "", "tao-paper": "",
                     "thunderagent": "new-program", "continuum": "home", "continuum-affine": "home-only", "sjf": ""}
    # CoreConfig.accounting: ThunderAgent counts what a program holds; every other policy a reservation
    counts = {n: policy_flags(make_policy(n))["accounting"] for n in
              ("tao", "thunderagent", "thunderagent-reserved", "continuum", "sjf", "round_robin")}
    assert counts == {"tao": "reservation", "thunderagent": "program", "thunderagent-reserved": "reservation",
                      "continuum": "reservation", "sjf": "reservation", "round_robin": "reservation"}
