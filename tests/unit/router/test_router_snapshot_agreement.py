"""The planning view is one contract (docs/architecture.md#one-contract): the planner's snapshot
built from the router's Redis records equals the router core's own snapshot of the same state,
up to the clock (router clock vs Unix seconds)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import structlog

from services.planner.convert import snapshot_from_records
from services.planner.core.model import Snapshot
from services.router.core.model import CoreConfig, NewRequest, PlanDecision, Replica, Usage
from services.router.core.snapshot import build_snapshot
from services.router.core.state import RouterCore
from services.router.store import StateStore

OFFSET_S = 1_700_000_000.0  # router clock 0 = this Unix time


def _shifted(snap: Snapshot, by: float) -> Snapshot:
    def t(x: float | None) -> float | None:
        return None if x is None else x + by

    return replace(snap, now_s=snap.now_s + by, sessions=tuple(
        replace(s, acting_since_s=t(s.acting_since_s), waiting_since_s=t(s.waiting_since_s),
                credits=tuple(replace(c, observed_at_s=c.observed_at_s + by) for c in s.credits))
        for s in snap.sessions))


def test_the_snapshot_from_records_is_the_routers_own_snapshot() -> None:
    core = RouterCore(CoreConfig(gating=True, sticky=True))
    core.upsert_replica(Replica(id="r0", url="http://r0", kv_capacity_tokens=10_000, healthy=True,
                                reports_cached_tokens=True, prefix_hit_rate=0.4), 0.0)
    core.upsert_replica(Replica(id="r1", url="http://r1", kv_capacity_tokens=8_000, healthy=True,
                                prefix_hit_rate=0.7), 0.0)
    for n, (sid, rid, usage) in enumerate((("s1", "r0", Usage(300, 30, 120)), ("s3", "r1", Usage(200, 20, None)))):
        core.arrive(1.0 + n, NewRequest(f"q{sid}", sid, "A", False, usage.prompt_tokens, 50))
        report = core.apply_plan(1.0 + n, PlanDecision(((sid, rid),), (), 1.0 + n, "test"))
        assert report.admitted == ((sid, rid),)
        core.dispatch(1.0 + n)
        core.finish(3.0 + n, f"q{sid}", usage)
    core.arrive(6.0, NewRequest("q2", "s2", "B", False, 80, None))  # held: WAITING in the pool
    now = 7.0

    store = StateStore(None, core, None, "epoch-1", lambda t: t + OFFSET_S, lambda t: t - OFFSET_S,  # type: ignore[arg-type]
                       flush_interval_s=1.0, resync_interval_s=1.0, demand_interval_s=1.0,
                       log=structlog.get_logger())
    sessions = [store.session_record(s) for s in core.sessions.values()]
    replicas: list[Any] = [store.replica_record(rid, now) for rid in core.replicas]
    from_records = snapshot_from_records(now + OFFSET_S, sessions, replicas, {})
    own = build_snapshot(core, now, {})

    assert {c.kind for s in own.sessions for c in s.credits} == {"cached_tokens", "volume"}
    assert [s.phase for s in own.sessions] == ["ACTING", "WAITING", "ACTING"]
    assert from_records == _shifted(own, OFFSET_S)
