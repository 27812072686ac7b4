"""``RouterCore(hold_limit=…, over_capacity=…)`` (the ``tao-overcommit`` lever): a pool session's
held request that has waited its hold limit is admitted over capacity, within a bound and only
into the reservations of sessions between requests for at least their own hold limit, instead of
waiting for a plan that has no room for it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.planner.core.continuum import ContinuumConfig, prefill_reload_s
from services.planner.core.registry import make_policy
from services.router.core.model import CoreConfig, NewRequest, Replica, Usage
from services.router.core.state import RouterCore


def core(hold_limit: Callable[[int], float] | None, over_capacity: float = 1.0) -> RouterCore:
    c = RouterCore(CoreConfig(gating=True, fast_admit="cache", target_utilisation=1.0),
                   hold_limit=hold_limit, over_capacity=over_capacity)
    c.upsert_replica(Replica(id="r0", url="http://r0", kv_capacity_tokens=1500, healthy=True, models=("m",)), 0.0)
    return c


def ask(rid: str, sid: str, prompt: int = 1000) -> NewRequest:
    return NewRequest(rid, sid, "A", False, prompt, 100, "m")


def fill(c: RouterCore) -> None:
    assert c.arrive(0.0, ask("q0", "a")) is not None  # fast admit: the replica's room is a's
    assert c.arrive(0.0, ask("q1", "b")) is None  # no room: held


def test_without_a_hold_limit_a_request_waits_for_a_plan_however_long() -> None:
    c = core(None)
    fill(c)
    assert c.dispatch(1000.0) == [] and not c.sessions["b"].admitted


def test_a_request_held_past_its_limit_goes_over_capacity_into_idle_kv() -> None:
    running = core(lambda prompt: 10.0, over_capacity=2.0)
    fill(running)
    assert running.dispatch(20.0) == []  # a's request still runs: its KV is not idle
    c = core(lambda prompt: 10.0, over_capacity=2.0)
    fill(c)
    c.finish(5.0, "q0", Usage(1000, 100, cached_tokens=None))  # a between requests, still admitted
    assert c.sessions["a"].admitted
    assert c.dispatch(9.9) == []  # b held 9.9 s of its 10
    assert c.dispatch(14.9) == []  # b held long enough, but a idle only 9.9 s of its own 10
    grants = c.dispatch(15.0)
    assert [(g.request_id, g.replica) for g in grants] == [("q1", "r0")]
    assert c.sessions["b"].admitted and c.over_capacity_admits == 1
    assert c.used["r0"] > c.capacity("r0")


def test_the_bound_keeps_it_held() -> None:
    c = core(lambda prompt: 10.0, over_capacity=1.01)  # a's and b's footprints exceed 1.01 x capacity
    fill(c)
    c.finish(5.0, "q0", Usage(1000, 100, cached_tokens=None))
    assert c.dispatch(100.0) == [] and c.over_capacity_admits == 0


def test_over_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="over_capacity"):
        core(lambda prompt: 1.0, over_capacity=0.9)


def test_only_tao_overcommit_carries_the_limit() -> None:
    oc = make_policy("tao-overcommit")
    limit = getattr(oc, "hold_limit", None)
    assert limit is not None
    assert limit(90_000) == pytest.approx(prefill_reload_s(90_000, ContinuumConfig()))  # ~14 s
    assert 10.0 < limit(90_000) < 20.0
    assert getattr(oc, "over_capacity", 1.0) == 1.4
    for name in ("tao", "tao-paper", "tao-fast"):
        p = make_policy(name)
        assert getattr(p, "hold_limit", None) is None and getattr(p, "over_capacity", 1.0) == 1.0
