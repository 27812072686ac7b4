"""Cache evidence is one type (services.common.core.evidence) in every layer; its wire forms are
the ones the records and snapshots have always had (docs/architecture.md#one-contract)."""

from __future__ import annotations

import json

import pytest

from services.common.core.evidence import CacheEvidence
from services.common.records import RecordError, SessionRecord, dump, load
from services.planner.core.model import ReplicaState, SessionState, Snapshot
from services.planner.core.values import credit_matrix

# a session record as the router wrote it before the evidence types were merged (CacheObservation)
OLD_RECORD = {
    "epoch": "e1", "rev": 3, "session_id": "s", "tenant": "t", "phase": "ACTING", "replica": "r0",
    "admitted": True, "created_at_unix_s": 1_700_000_000.0, "updated_at_unix_s": 1_700_000_010.0,
    "cache": [
        {"replica": "r0", "resident_tokens": 900, "prompt_tokens": 800, "cached_tokens": 600,
         "processed_tokens": 1_100, "observed_at_unix_s": 1_700_000_009.5, "kind": "cached_tokens"},
        {"replica": "r1", "resident_tokens": 500, "prompt_tokens": 450, "cached_tokens": 0,
         "processed_tokens": 900, "observed_at_unix_s": 1_700_000_001.0, "kind": "volume",
         "added_by_a_newer_writer": 1},
    ],
}


def test_an_old_session_record_reads_as_cache_evidence_and_writes_back_the_same_json() -> None:
    rec = load(SessionRecord, json.dumps(OLD_RECORD))
    assert rec.cache == (
        CacheEvidence("r0", "cached_tokens", 900, 800, 600, 1_100, 1_700_000_009.5),
        CacheEvidence("r1", "volume", 500, 450, 0, 900, 1_700_000_001.0),
    )
    written = json.loads(dump(rec))["cache"]
    expected = [{k: v for k, v in c.items() if k != "added_by_a_newer_writer"} for c in OLD_RECORD["cache"]]
    assert written == expected
    assert [list(c) for c in written] == [list(c) for c in expected]  # same keys, same order
    assert load(SessionRecord, dump(rec)) == rec


@pytest.mark.parametrize("bad", [{"resident_tokens": -1}, {"kind": "guess"}, {"observed_at_unix_s": None}])
def test_a_stored_evidence_that_breaks_the_contract_is_a_record_error(bad: dict[str, object]) -> None:
    raw = {**OLD_RECORD, "cache": [{**OLD_RECORD["cache"][0], **bad}]}  # type: ignore[dict-item]
    with pytest.raises(RecordError):
        load(SessionRecord, json.dumps(raw))


@pytest.mark.parametrize("kind", ["kv_events", "cached_tokens", "volume"])
def test_a_snapshot_credit_reads_back_with_the_same_credit(kind: str) -> None:
    e = CacheEvidence.of_credit("r0", 700, 5.0, kind)
    assert (e.replica, e.credit_tokens, e.observed_at_s, e.kind) == ("r0", 700, 5.0, kind)


def test_the_planner_values_router_evidence_and_its_snapshot_json_alike() -> None:
    """Full evidence (the router's) and the credit its snapshot JSON carries value the same."""
    full = (CacheEvidence("r0", "volume", 500, 450, 0, 900, 9.0),
            CacheEvidence("r1", "cached_tokens", 800, 700, 300, 800, 8.0))
    snap = Snapshot(now_s=10.0, replicas=(ReplicaState("r0", 1000, 0, prefix_hit_rate=0.5), ReplicaState("r1", 1000, 0)),
                    sessions=(SessionState("s", "t", 100, True, credits=full),))
    again = Snapshot.from_json(json.loads(json.dumps(snap.to_json())))
    assert [c["tokens"] for c in snap.to_json()["sessions"][0]["credits"]] == [500, 800]  # min(900, 500) for volume
    values = credit_matrix(10.0, snap.sessions, snap.replicas)
    assert (credit_matrix(10.0, again.sessions, again.replicas) == values).all()
    assert values[0, 0] > 0 and values[0, 1] > 0
