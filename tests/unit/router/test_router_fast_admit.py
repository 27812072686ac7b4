"""``CoreConfig.fast_admit``: a request of a pool session that nothing contends with is admitted by
the router itself at its arrival, by the rule of the scheduler it comes from (``cache``: ``tao``;
``new-program``: ThunderAgent; ``home`` / ``home-only``: Continuum); otherwise it waits for the
planner as before."""

from __future__ import annotations

from services.router.core.model import CoreConfig, NewRequest, Replica, Usage
from services.router.core.state import RouterCore


def rep(rid: str, kv: int = 10_000, *models: str) -> Replica:
    return Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=kv, healthy=True, models=models or ("m",))


def core(rule: str = "cache", kv: int = 10_000) -> RouterCore:
    c = RouterCore(CoreConfig(gating=True, fast_admit=rule, target_utilisation=1.0))
    c.upsert_replica(rep("r0", kv), 0.0)
    c.upsert_replica(rep("r1", kv), 0.0)
    return c


def ask(rid: str, sid: str, prompt: int = 1000, tenant: str = "A") -> NewRequest:
    return NewRequest(rid, sid, tenant, False, prompt, 100, "m")


def served_then_paused(c: RouterCore, sid: str, rid: str, t: float) -> str:
    """``sid`` runs one request (admitted at once), then is paused between requests; its replica."""
    g = c.arrive(t, ask(rid, sid))
    assert g is not None
    c.finish(t + 0.5, rid, Usage(1000, 100, cached_tokens=0))
    c._put(c._unadmit(c.sessions[sid], t + 0.5))
    return g.replica


def test_off_every_pool_request_waits_for_a_plan() -> None:
    assert core(rule="").arrive(0.0, ask("q0", "s0")) is None


def test_a_rule_that_is_not_known_is_refused() -> None:
    try:
        CoreConfig(fast_admit="fifo")
    except ValueError as exc:
        assert "fast_admit" in str(exc)
    else:
        raise AssertionError("an unknown fast_admit rule was accepted")


def test_uncontended_request_goes_at_once_and_spreads() -> None:
    c = core()
    g0 = c.arrive(0.0, ask("q0", "s0"))
    g1 = c.arrive(0.0, ask("q1", "s1"))
    assert g0 is not None and g1 is not None
    assert {g0.replica, g1.replica} == {"r0", "r1"}  # the second goes where fewer requests run
    assert c.fast_admits == 2


def test_cache_credit_picks_the_replica_when_the_session_is_alone_in_the_pool() -> None:
    c = core()
    home = served_then_paused(c, "s0", "q0", 0.0)
    c.arrive(1.0, ask("q9", "busy"))  # s0 is paused: "busy" is not alone in the pool
    assert not c.sessions["busy"].admitted and c.fast_admits == 1
    c.release(1.1, "busy", force=True)
    g = c.arrive(2.0, ask("q1", "s0", prompt=1200))  # alone now: back where its cache is
    assert g is not None and g.replica == home and c.fast_admits == 2


def test_cache_contention_no_room_or_no_headroom_leave_it_to_the_planner() -> None:
    c = core(kv=1500)
    assert c.arrive(0.0, ask("q0", "a")) is not None and c.arrive(0.0, ask("q1", "b")) is not None
    assert c.arrive(0.0, ask("q2", "c")) is None  # no room left anywhere: held for the planner
    assert c.arrive(0.0, ask("q3", "small", prompt=10)) is None  # another pool session holds a request
    assert not c.sessions["small"].admitted and c.fast_admits == 2
    c2 = core()
    c2.set_caps({"A": 0})
    assert c2.arrive(0.0, ask("q0", "s0")) is None and not c2.sessions["s0"].admitted


def test_new_program_places_only_new_sessions_on_the_replica_with_the_fewest_tokens() -> None:
    c = core(rule="new-program")
    c.upsert_replica(rep("r2", 20_000), 0.0)  # the roomiest, but not the emptiest once used
    c.arrive(0.0, ask("q0", "big", prompt=3000))  # every replica empty: the lowest id, r0
    assert c.sessions["big"].replica == "r0"
    g = c.arrive(0.0, ask("q1", "new"))
    assert g is not None and g.replica == "r1"  # r1 and r2 hold 0 tokens: the lowest id, not the most room
    home = served_then_paused(c, "old", "q2", 1.0)  # "old" was new then: admitted at once
    assert home == "r2"
    c.release(2.0, "new", force=True)
    assert c.arrive(2.0, ask("q3", "old")) is None  # a paused program waits for ThunderAgent's tick
    c.release(2.1, "old", force=True)
    c.arrive(3.0, ask("q4", "late"))
    assert c.sessions["late"].admitted and c.fast_admits == 4


def test_new_program_keeps_a_buffer_per_admitted_program_and_waits_behind_the_queue() -> None:
    c = core(rule="new-program", kv=1500)
    # footprint 1000 + 100 output + a 100-token buffer for it: fits an empty 1500-token replica
    assert c.arrive(0.0, ask("q0", "a", prompt=1000)) is not None
    # r0 holds a (1,100 tokens) and its buffer: 300 left would hold b (150 + its buffer), but
    # ThunderAgent picks the replica with the fewest tokens, the empty r1
    g = c.arrive(0.0, ask("q1", "b", prompt=50))
    assert g is not None and g.replica == "r1"
    # c (1,300 + a buffer) fits neither r0 (300 left) nor r1 (1,500 - 150 - one buffer = 1,250):
    # it queues, and the next program queues behind it
    assert c.arrive(0.0, ask("q2", "c", prompt=1200)) is None
    assert c.arrive(0.0, ask("q3", "d", prompt=10)) is None and c.fast_admits == 2


def test_home_ignores_paused_sessions_but_not_a_waiting_queue() -> None:
    c = core(rule="home")
    home = served_then_paused(c, "s0", "q0", 0.0)
    g = c.arrive(1.0, ask("q1", "other"))  # s0 is paused, not waiting: the queue is empty
    assert g is not None
    g0 = c.arrive(2.0, ask("q2", "s0"))  # alone in the queue: home, where it fits
    assert g0 is not None and g0.replica == home
    c2 = core(rule="home", kv=1500)
    assert c2.arrive(0.0, ask("q0", "a")) is not None and c2.arrive(0.0, ask("q1", "b")) is not None
    assert c2.arrive(0.0, ask("q2", "c")) is None  # no room: it heads the queue
    assert c2.arrive(0.0, ask("q3", "d", prompt=10)) is None  # FCFS: behind c


def test_home_goes_elsewhere_when_home_is_full_and_home_only_waits() -> None:
    for rule, moves in (("home", True), ("home-only", False)):
        c = core(rule=rule, kv=2500)
        assert c.arrive(0.0, ask("q0", "x")).replica == "r0"  # type: ignore[union-attr]  # equal room: lowest id
        assert served_then_paused(c, "s0", "q1", 0.0) == "r1"  # new: the most room (x runs on r0)
        assert c.arrive(1.0, ask("q2", "filler", prompt=1200)).replica == "r1"  # type: ignore[union-attr]
        room = {r: c.capacity(r) - c.used[r] for r in ("r0", "r1")}
        g0 = c.arrive(2.0, ask("q3", "s0", prompt=1200))
        need = c.sessions["s0"].footprint_tokens
        assert room["r1"] < need <= room["r0"]  # no room at home, room on r0
        if moves:
            assert g0 is not None and g0.replica == "r0"
        else:
            assert g0 is None and not c.sessions["s0"].admitted
