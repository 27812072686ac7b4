"""``RouterCore(force_admit_after_s=…)``: ThunderAgent's force-resume. A pool session whose held
request has waited the bound is admitted whatever the capacity, on the replica holding its
cache, else the one with the fewest admitted sessions; the ``thunderagent`` policy carries the
bound (30 min), so its starvation guard takes effect instead of being refused for want of room."""

from __future__ import annotations

from services.planner.core.registry import make_policy
from services.router.core.model import CoreConfig, NewRequest, Replica, Usage
from services.router.core.state import RouterCore


def core(force_after_s: float | None) -> RouterCore:
    c = RouterCore(CoreConfig(gating=True, fast_admit="cache", target_utilisation=1.0),
                   force_admit_after_s=force_after_s)
    for rid in ("r0", "r1"):
        c.upsert_replica(Replica(id=rid, url=f"http://{rid}", kv_capacity_tokens=1500, healthy=True, models=("m",)), 0.0)
    return c


def ask(rid: str, sid: str, prompt: int = 1000) -> NewRequest:
    return NewRequest(rid, sid, "A", False, prompt, 100, "m")


def fill(c: RouterCore) -> None:
    """a on one replica, c on the other (fast admission), then b held: no room anywhere."""
    assert c.arrive(0.0, ask("q0", "a")) is not None
    assert c.arrive(0.0, ask("q1", "c")) is not None
    assert {c.sessions["a"].replica, c.sessions["c"].replica} == {"r0", "r1"}
    assert c.arrive(1.0, ask("q2", "b")) is None


def test_without_the_bound_a_held_request_waits_for_room_however_long() -> None:
    c = core(None)
    fill(c)
    assert c.dispatch(10_000.0) == [] and not c.sessions["b"].admitted and c.force_admits == 0


def test_a_request_held_past_the_bound_is_admitted_whatever_the_capacity() -> None:
    c = core(1800.0)
    fill(c)
    assert c.dispatch(1800.9) == []  # held 1799.9 s
    grants = c.dispatch(1801.0)
    assert [g.request_id for g in grants] == ["q2"]
    rid = c.sessions["b"].replica
    assert c.sessions["b"].admitted and c.force_admits == 1
    assert c.used[rid] > c.capacity(rid), "admitted over capacity"


def test_a_forced_session_without_a_cache_goes_to_the_replica_with_the_fewest_sessions() -> None:
    c = core(1800.0)
    fill(c)
    c.finish(5.0, "q0", Usage(1000, 100, cached_tokens=None))
    emptied = c.sessions["a"].replica
    assert emptied is not None
    c.release(6.0, "a")  # a ends: its replica has no admitted session left, the other has c
    grants = c.dispatch(1801.0)  # b was never placed: no cache anywhere
    assert [(g.request_id, g.replica) for g in grants] == [("q2", emptied)]


def test_thunderagent_carries_its_30_minute_bound_and_tao_none() -> None:
    assert getattr(make_policy("thunderagent"), "force_admit_after_s", None) == 1800.0
    for name in ("tao", "tao-paper", "sjf", "continuum"):
        assert getattr(make_policy(name), "force_admit_after_s", None) is None
