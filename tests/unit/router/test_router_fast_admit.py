"""``CoreConfig.fast_admit`` (the ``tao-fast`` lever): a pool session's request is admitted by
the router itself only when no other pool session contends, on a serving replica with room,
preferring its cache; otherwise it waits for the planner as before."""

from __future__ import annotations

from services.router.core.model import CoreConfig, NewRequest, Replica, Usage
from services.router.core.state import RouterCore


def rep(rid: str, kv: int = 10_000, *models: str) -> Replica:
    return Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=kv, healthy=True, models=models or ("m",))


def core(fast: bool = True, kv: int = 10_000) -> RouterCore:
    c = RouterCore(CoreConfig(gating=True, fast_admit=fast, target_utilisation=1.0))
    c.upsert_replica(rep("r0", kv), 0.0)
    c.upsert_replica(rep("r1", kv), 0.0)
    return c


def ask(rid: str, sid: str, prompt: int = 1000, tenant: str = "A") -> NewRequest:
    return NewRequest(rid, sid, tenant, False, prompt, 100, "m")


def test_off_every_pool_request_waits_for_a_plan() -> None:
    assert core(fast=False).arrive(0.0, ask("q0", "s0")) is None


def test_uncontended_request_goes_at_once_and_spreads() -> None:
    c = core()
    g0 = c.arrive(0.0, ask("q0", "s0"))
    g1 = c.arrive(0.0, ask("q1", "s1"))
    assert g0 is not None and g1 is not None
    assert {g0.replica, g1.replica} == {"r0", "r1"}  # the second goes where fewer requests run
    assert c.fast_admits == 2


def test_cache_credit_picks_the_replica() -> None:
    c = core()
    g = c.arrive(0.0, ask("q0", "s0"))
    assert g is not None
    c.finish(1.0, "q0", Usage(1000, 100, cached_tokens=0))
    # s0 goes back to the pool (as after a pause), its cache on g.replica
    c._unadmit_in_place(c.sessions["s0"], 1.0)
    c.arrive(1.5, ask("q9", "other"))  # admitted elsewhere or not: s0 still has credit only on g.replica
    c.finish(1.6, "q9", Usage(1000, 10))
    g2 = c.arrive(2.0, ask("q1", "s0", prompt=1200))
    assert g2 is not None and g2.replica == g.replica


def test_contention_no_room_or_no_headroom_leave_it_to_the_planner() -> None:
    c = core(kv=1500)
    assert c.arrive(0.0, ask("q0", "a")) is not None and c.arrive(0.0, ask("q1", "b")) is not None
    assert c.arrive(0.0, ask("q2", "c")) is None  # no room left anywhere: held for the planner
    assert c.arrive(0.0, ask("q3", "small", prompt=10)) is None  # another pool session holds a request
    assert not c.sessions["small"].admitted and c.fast_admits == 2
    c2 = core()
    c2.set_caps({"A": 0})
    assert c2.arrive(0.0, ask("q0", "s0")) is None and not c2.sessions["s0"].admitted
