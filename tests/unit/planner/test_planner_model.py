"""Snapshot/plan JSON (docs/architecture.md#snapshot-and-plan-json) and the value triple: credit decay, evidence hierarchy."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from services.common.core.evidence import CacheEvidence
from services.planner.core.model import (
    Assignment,
    Plan,
    ReplicaState,
    SessionState,
    Snapshot,
    SnapshotError,
)
from services.planner.core.values import ValueConfig, credit_matrix, fold_values

BASE: dict[str, Any] = {
    "now_s": 100.0,
    "replicas": [
        {"id": "r0", "capacity_tokens": 1000, "used_tokens": 200, "healthy": True},
        {"id": "r1", "capacity_tokens": 800, "used_tokens": 900, "healthy": False},
    ],
    "sessions": [
        {"id": "s0", "tenant": "a", "footprint_tokens": 300, "ready": True,
         "credits": [{"replica": "r0", "tokens": 250, "observed_at_s": 90.0}]},
        {"id": "s1", "tenant": "b", "footprint_tokens": 100, "ready": False, "credits": [],
         "phase": "ACTING", "replica": "r0", "admitted": True},
    ],
}


def test_design_json_round_trips() -> None:
    snap = Snapshot.from_json(BASE)
    assert snap.replicas[0].free_tokens == 800
    assert snap.sessions[0].credits[0] == CacheEvidence.of_credit("r0", 250, 90.0, "cached_tokens")
    again = Snapshot.from_json(json.loads(json.dumps(snap.to_json())))
    assert again == snap


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("now_s",), "soon", "now_s: expected a finite number"),
        (("replicas", 0, "capacity_tokens"), -1, "replicas[0].capacity_tokens: expected a non-negative integer"),
        (("replicas", 0, "capacity_tokens"), 10.5, "replicas[0].capacity_tokens: expected an integer"),
        (("replicas", 1, "id"), "r0", "replicas[1].id: duplicate replica id 'r0'"),
        (("replicas", 0, "healthy"), "yes", "replicas[0].healthy: expected true or false"),
        (("sessions", 0, "footprint_tokens"), True, "sessions[0].footprint_tokens: expected an integer"),
        (("sessions", 0, "credits", 0, "replica"), "r9", "sessions[0].credits[0].replica: unknown replica 'r9'"),
        (("sessions", 0, "credits", 0, "kind"), "gossip", "sessions[0].credits[0].kind: expected one of"),
        (("sessions", 0, "credits", 0, "observed_at_s"), float("nan"), "observed_at_s: expected a finite number"),
        (("sessions", 1, "phase"), "SLEEPING", "sessions[1].phase: expected one of"),
        (("sessions", 1, "replica"), None, "sessions[1].replica: an admitted session must name its replica"),
        (("sessions", 1, "id"), "s0", "sessions[1].id: duplicate session id 's0'"),
    ],
)
def test_bad_snapshots_are_rejected_precisely(path: tuple[Any, ...], value: object, message: str) -> None:
    data = copy.deepcopy(BASE)
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SnapshotError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        Snapshot.from_json(data)


@pytest.mark.parametrize("missing", ["now_s", "replicas", "sessions"])
def test_missing_top_level_field(missing: str) -> None:
    data = copy.deepcopy(BASE)
    del data[missing]
    with pytest.raises(SnapshotError, match=f"missing required field '{missing}'"):
        Snapshot.from_json(data)


def test_not_an_object() -> None:
    with pytest.raises(SnapshotError, match="snapshot: expected an object"):
        Snapshot.from_json([1, 2])


def test_plan_json_round_trips() -> None:
    plan = Plan(revision=3, assignments=(Assignment("s0", "r0"),), pauses=("s1",), objective=(5, 1, 300),
                solver="exact-dp", solve_ms=1.25, excluded_by_rounding=2, upper_bound=(6, 1, 400), policy="tao")
    data = plan.to_json()
    assert data["objective"] == [5, 1, 300] and data["assignments"] == [{"session": "s0", "replica": "r0"}]
    assert Plan.from_json(json.loads(json.dumps(data))) == plan


def _replicas(*ids: str, hit: float = 0.5) -> tuple[ReplicaState, ...]:
    return tuple(ReplicaState(i, 10_000, 0, prefix_hit_rate=hit) for i in ids)


def test_credit_decays_with_a_ten_second_half_life() -> None:
    reps = _replicas("r0")
    ses = [SessionState("s", "t", 100, False, credits=(CacheEvidence.of_credit("r0", 8000, 70.0, "cached_tokens"),))]
    assert credit_matrix(100.0, ses, reps).tolist() == [[1000]]  # 8000 · 2^(−30/10)
    assert credit_matrix(75.0, ses, reps).tolist() == [[int(np.floor(8000 * 2 ** -0.5))]]  # floor
    assert credit_matrix(60.0, ses, reps).tolist() == [[8000]]  # observation "in the future": no decay
    assert credit_matrix(100.0, ses, reps, half_life_s=None).tolist() == [[8000]]


def test_kv_events_credit_is_live_residency_and_does_not_decay() -> None:
    reps = _replicas("r0", "r1")
    ses = [SessionState("s", "t", 100, False, credits=(
        CacheEvidence.of_credit("r0", 8000, 70.0, "kv_events"),  # the replica's event stream says: held now
        CacheEvidence.of_credit("r1", 8000, 70.0, "cached_tokens"),
    ))]
    assert credit_matrix(100.0, ses, reps).tolist() == [[8000, 1000]]


def test_evidence_hierarchy() -> None:
    reps = _replicas("r0", "r1", "r2", hit=0.25)
    ses = [SessionState("s", "t", 100, False, credits=(
        CacheEvidence.of_credit("r0", 500, 100.0, "cached_tokens"),
        CacheEvidence.of_credit("r0", 900, 90.0, "kv_events"),  # strongest kind wins even when older
        CacheEvidence.of_credit("r1", 400, 95.0, "cached_tokens"),
        CacheEvidence.of_credit("r1", 700, 99.0, "cached_tokens"),  # same kind: the newest wins
        CacheEvidence.of_credit("r2", 4000, 100.0, "volume"),  # volume × observed hit rate
    ))]
    k = credit_matrix(100.0, ses, reps, half_life_s=None)
    assert k.tolist() == [[900, 700, 1000]]


def test_value_config_switches_readiness_off() -> None:
    reps = _replicas("r0")
    ses = [SessionState("s", "t", 100, True)]
    assert fold_values(0.0, ses, reps).ready.tolist() == [1]
    assert fold_values(0.0, ses, reps, ValueConfig(use_readiness=False)).ready.tolist() == [0]
    assert fold_values(0.0, ses, reps).credit.tolist() == [[0]]  # no evidence -> no credit
