"""Records -> snapshot (what the planner service plans on) and proto <-> core."""

from __future__ import annotations

import pytest

from services.common.core.evidence import CacheEvidence
from services.common.errors import InvalidArgument
from services.common.records import (
    AllocationRecord,
    PredictionRecord,
    ReplicaRecord,
    SessionRecord,
    TenantDemandRecord,
)
from services.planner.convert import snapshot_from_proto, snapshot_from_records, snapshot_to_proto
from tao.planner.v1 import planner_pb2

NOW = 1_000.0


def _replica(rid: str, **kw: object) -> ReplicaRecord:
    base: dict[str, object] = {"epoch": "e", "rev": 1, "replica_id": rid, "url": "http://x", "healthy": True,
                               "kv_capacity_tokens": 1000, "capacity_tokens": 950, "updated_at_unix_s": NOW}
    return ReplicaRecord(**(base | kw))  # type: ignore[arg-type]


def _session(sid: str, **kw: object) -> SessionRecord:
    base: dict[str, object] = {"epoch": "e", "rev": 1, "session_id": sid, "tenant": "t", "phase": "ACTING",
                               "footprint_tokens": 100, "created_at_unix_s": NOW, "updated_at_unix_s": NOW}
    return SessionRecord(**(base | kw))  # type: ignore[arg-type]


def _prediction(sid: str, **kw: object) -> PredictionRecord:
    base: dict[str, object] = {"epoch": "p", "rev": 1, "session_id": sid, "call_id": "c", "tool": "x", "ready": False,
                               "ready_reason": "", "expected_duration_s": 10.0, "remaining_s": 5.0, "elapsed_s": 5.0,
                               "evidence": "default", "started_at_unix_s": NOW - 5, "refreshed_at_unix_s": NOW - 1,
                               "predicted_return_unix_s": NOW + 5}
    return PredictionRecord(**(base | kw))  # type: ignore[arg-type]


def test_records_become_the_snapshot_the_router_would_build() -> None:
    vol = CacheEvidence(replica="r0", resident_tokens=500, prompt_tokens=450, cached_tokens=0,
                           processed_tokens=900, observed_at_s=NOW - 3, kind="volume")
    gone = CacheEvidence(replica="r9", resident_tokens=80, prompt_tokens=80, cached_tokens=0,
                            processed_tokens=80, observed_at_s=NOW - 3, kind="cached_tokens")
    sessions = [
        _session("held", phase="WAITING", cache=(vol, gone)),
        _session("soon", acting_since_unix_s=NOW - 6),
        _session("late", acting_since_unix_s=NOW - 6),
        _session("old-call", acting_since_unix_s=NOW - 2),  # its prediction is for an earlier tool call
        _session("stale", acting_since_unix_s=NOW - 60),
        _session("orphan", phase="ACTING", admitted=True, replica="r9"),
        _session("done", phase="ENDED"),
        _session("no-footprint", footprint_tokens=0, context_tokens=300, expected_append_tokens=20,
                 ewma_output_tokens=40.6),
    ]
    preds = {
        "soon": _prediction("soon", predicted_return_unix_s=NOW + 0.5),
        "late": _prediction("late"),
        "old-call": _prediction("old-call", ready=True),
        "stale": _prediction("stale", ready=True, refreshed_at_unix_s=NOW - 31),
    }
    snap = snapshot_from_records(
        NOW, sessions, [_replica("r1", used_tokens=100), _replica("r0", draining=True)], preds,
        AllocationRecord(epoch="b", rev=1, total=10, caps={"t": 4, "u": 6}, policy="dynamic", decided_at_unix_s=NOW),
        [TenantDemandRecord(epoch="e", rev=1, tenant="t", waiting=0, in_flight=3, updated_at_unix_s=NOW)],
    )
    snap.validate()
    assert [r.id for r in snap.replicas] == ["r0", "r1"]
    assert [r.healthy for r in snap.replicas] == [False, True]  # draining takes no new sessions
    by_id = {s.id: s for s in snap.sessions}
    assert "done" not in by_id
    assert {sid: s.ready for sid, s in by_id.items()} == {
        "held": True, "soon": True, "late": False, "old-call": False, "stale": False, "orphan": False,
        "no-footprint": False}
    held = by_id["held"]
    assert [(c.replica, c.credit_tokens, c.kind) for c in held.credits] == [("r0", 500, "volume")]  # min(900, 500)
    assert not by_id["orphan"].admitted and by_id["orphan"].replica is None
    assert by_id["no-footprint"].footprint_tokens == 360
    assert snap.tenant_headroom == {"t": 1, "u": 6}


def test_proto_round_trip_and_defaults() -> None:
    msg = planner_pb2.Snapshot(
        now_s=5.0,
        replicas=[planner_pb2.Replica(id="r", capacity_tokens=10, used_tokens=2, healthy=True)],
        sessions=[planner_pb2.Session(id="s", tenant="t", footprint_tokens=3, ready=True,
                                      credits=[planner_pb2.Credit(replica="r", tokens=2, observed_at_s=4.0)])],
        tenant_headroom={"t": 1},
    )
    snap = snapshot_from_proto(msg)
    assert snap.sessions[0].phase == "WAITING" and snap.sessions[0].credits[0].kind == "cached_tokens"
    assert snapshot_from_proto(snapshot_to_proto(snap)) == snap
    msg.sessions[0].credits[0].replica = "nowhere"
    with pytest.raises(InvalidArgument, match=r"sessions\[0\].credits\[0\].replica: unknown replica 'nowhere'"):
        snapshot_from_proto(msg)
