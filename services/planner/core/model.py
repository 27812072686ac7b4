"""Planner inputs and outputs: frozen dataclasses with exact integer tokens
(docs/architecture.md#planner-core-api).

A ``Snapshot`` is everything one planning round sees, frozen at ``now_s``; a ``Plan`` is what
a policy decides for it. ``Snapshot.from_json`` / ``to_json`` read and write the snapshot
JSON (docs/architecture.md#snapshot-and-plan-json); ``from_json`` validates everything and
raises ``SnapshotError`` with the path of the first offending field, so a bad snapshot
changes nothing downstream.

Invariants checked by ``Snapshot.validate`` (and therefore by ``from_json``):
- replica and session ids are non-empty and unique;
- every token count is an ``int`` >= 0 (``bool`` is not an int here); times are finite;
- ``phase`` is one of ``PHASES``; an admitted session names a known replica;
- every credit names a known replica, ``kind`` is one of ``EVIDENCE_KINDS``;
- ``tenant_headroom`` values are integers >= 0;
- a replica's ``models`` are non-empty strings and its ``block_size`` an integer >= 1; a
  session's ``model`` is a string (``""``: any replica serves it, ``serves_model``).
``used_tokens`` may exceed ``capacity_tokens``: that is the over-capacity state the pause
policy resolves.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from services.common.core.evidence import CacheEvidence
from services.common.vocabulary import DEFAULT_BLOCK_SIZE, EVIDENCE_KINDS, PHASES, Phase, serves_model


class SnapshotError(ValueError):
    """A snapshot that cannot be planned; the message names the offending field."""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica; ``capacity_tokens`` already has the utilisation target applied. ``models``
    are the names its ``/v1/models`` lists; ``block_size`` its KV block size in tokens
    (``vllm:cache_config_info``; ``DEFAULT_BLOCK_SIZE`` when it has not said)."""

    id: str
    capacity_tokens: int
    used_tokens: int
    healthy: bool = True
    running: int = 0
    waiting: int = 0
    prefix_hit_rate: float = 0.0
    models: tuple[str, ...] = ()
    block_size: int = DEFAULT_BLOCK_SIZE

    def serves(self, session: SessionState) -> bool:
        """``session`` may be placed here as far as its model goes (``serves_model``)."""
        return serves_model(self.models, session.model)

    @property
    def free_tokens(self) -> int:
        """Capacity left for admissions; negative when the replica is over capacity."""
        return self.capacity_tokens - self.used_tokens


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session; it is in the *pool* when ``admitted`` is False."""

    id: str
    tenant: str
    footprint_tokens: int
    ready: bool
    credits: tuple[CacheEvidence, ...] = ()
    phase: Phase = "WAITING"
    replica: str | None = None
    admitted: bool = False
    context_tokens: int = 0
    acting_since_s: float | None = None
    waiting_since_s: float | None = None
    tool_return_s: float | None = None
    """Predicted time (snapshot clock) the running tool returns; None = no fresh prediction
    (or no tool running). Readiness is this within the horizon; policies that order by
    return time (Belady pauses, Continuum's TTL) read it directly."""
    model: str = ""
    """The model its requests name; only replicas serving it are eligible (``""``: any)."""


def replica_view(
    id: str,
    capacity_tokens: int,
    used_tokens: int,
    *,
    eligible: bool,
    running: int,
    waiting: int,
    prefix_hit_rate: float,
    models: Iterable[str],
    block_size: int,
) -> ReplicaState:
    """A replica's planning view: the one builder behind the router core's snapshot
    (``services.router.core.snapshot``, live state) and the planner's snapshot from Redis
    records (``services.planner.convert``). ``eligible``: the replica may take new sessions
    (``healthy`` here); ``used_tokens`` floored at 0; the hit rate clamped to [0, 1]; unnamed
    models dropped. ``capacity_tokens`` has the utilisation target applied already."""
    return ReplicaState(
        id=id, capacity_tokens=capacity_tokens, used_tokens=max(0, used_tokens), healthy=eligible,
        running=running, waiting=waiting, prefix_hit_rate=min(1.0, max(0.0, prefix_hit_rate)),
        models=tuple(m for m in models if m), block_size=block_size,
    )


def session_view(
    id: str,
    tenant: str,
    *,
    known_replicas: Container[str],
    footprint_tokens: int,
    ready: bool,
    evidence: Iterable[CacheEvidence],
    phase: Phase,
    replica: str | None,
    admitted: bool,
    context_tokens: int,
    acting_since_s: float | None,
    waiting_since_s: float | None,
    tool_return_s: float | None,
    model: str,
) -> SessionState:
    """A session's planning view, the one builder behind both snapshots (see ``replica_view``):
    a session admitted on a replica that is not in ``known_replicas`` is back in the pool (no
    replica), and evidence about such replicas is left out."""
    placed = admitted and replica in known_replicas
    return SessionState(
        id=id, tenant=tenant, footprint_tokens=footprint_tokens, ready=ready,
        credits=tuple(e for e in evidence if e.replica in known_replicas), phase=phase,
        replica=replica if placed else None, admitted=placed, context_tokens=context_tokens,
        acting_since_s=acting_since_s, waiting_since_s=waiting_since_s, tool_return_s=tool_return_s, model=model,
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One planning round's input; ``tenant_headroom`` maps tenant -> sessions it may still admit."""

    now_s: float
    replicas: tuple[ReplicaState, ...]
    sessions: tuple[SessionState, ...]
    tenant_headroom: Mapping[str, int] | None = None

    def validate(self) -> None:
        """Raise ``SnapshotError`` on the first violated invariant (see module docstring)."""
        _check_time("now_s", self.now_s)
        replica_ids: set[str] = set()
        for i, rep in enumerate(self.replicas):
            where = f"replicas[{i}]"
            _check_id(f"{where}.id", rep.id)
            if rep.id in replica_ids:
                raise SnapshotError(f"{where}.id: duplicate replica id {rep.id!r}")
            replica_ids.add(rep.id)
            _check_tokens(f"{where}.capacity_tokens", rep.capacity_tokens)
            _check_tokens(f"{where}.used_tokens", rep.used_tokens)
            _check_bool(f"{where}.healthy", rep.healthy)
            _check_tokens(f"{where}.running", rep.running)
            _check_tokens(f"{where}.waiting", rep.waiting)
            rate = rep.prefix_hit_rate
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
                raise SnapshotError(f"{where}.prefix_hit_rate: expected a number in [0, 1], got {rate!r}")
            if not isinstance(rep.models, tuple) or not all(isinstance(m, str) and m for m in rep.models):
                raise SnapshotError(f"{where}.models: expected a list of non-empty strings, got {rep.models!r}")
            if isinstance(rep.block_size, bool) or not isinstance(rep.block_size, int) or rep.block_size < 1:
                raise SnapshotError(f"{where}.block_size: expected an integer >= 1, got {rep.block_size!r}")
        session_ids: set[str] = set()
        for i, ses in enumerate(self.sessions):
            where = f"sessions[{i}]"
            _check_id(f"{where}.id", ses.id)
            if ses.id in session_ids:
                raise SnapshotError(f"{where}.id: duplicate session id {ses.id!r}")
            session_ids.add(ses.id)
            if not isinstance(ses.tenant, str):
                raise SnapshotError(f"{where}.tenant: expected a string, got {ses.tenant!r}")
            if not isinstance(ses.model, str):
                raise SnapshotError(f"{where}.model: expected a string, got {ses.model!r}")
            _check_tokens(f"{where}.footprint_tokens", ses.footprint_tokens)
            _check_tokens(f"{where}.context_tokens", ses.context_tokens)
            _check_bool(f"{where}.ready", ses.ready)
            _check_bool(f"{where}.admitted", ses.admitted)
            if ses.phase not in PHASES:
                raise SnapshotError(f"{where}.phase: expected one of {', '.join(PHASES)}, got {ses.phase!r}")
            if ses.replica is not None and ses.replica not in replica_ids:
                raise SnapshotError(f"{where}.replica: unknown replica {ses.replica!r}")
            if ses.admitted and ses.replica is None:
                raise SnapshotError(f"{where}.replica: an admitted session must name its replica")
            for name in ("acting_since_s", "waiting_since_s", "tool_return_s"):
                value = getattr(ses, name)
                if value is not None:
                    _check_time(f"{where}.{name}", value)
            for j, cred in enumerate(ses.credits):
                cw = f"{where}.credits[{j}]"
                if cred.replica not in replica_ids:
                    raise SnapshotError(f"{cw}.replica: unknown replica {cred.replica!r}")
                _check_tokens(f"{cw}.tokens", cred.credit_tokens)
                _check_time(f"{cw}.observed_at_s", cred.observed_at_s)
                if cred.kind not in EVIDENCE_KINDS:
                    raise SnapshotError(
                        f"{cw}.kind: expected one of {', '.join(EVIDENCE_KINDS)}, got {cred.kind!r}"
                    )
        if self.tenant_headroom is not None:
            for tenant, slots in self.tenant_headroom.items():
                _check_tokens(f"tenant_headroom[{tenant!r}]", slots)

    @classmethod
    def from_json(cls, data: Any) -> Snapshot:
        """Parse and validate snapshot JSON (a decoded ``dict``); extra fields are ignored."""
        obj = _mapping("snapshot", data)
        now_s = _number("now_s", _req(obj, "now_s", "snapshot"))
        replicas = tuple(
            _replica_from_json(f"replicas[{i}]", r)
            for i, r in enumerate(_list("replicas", _req(obj, "replicas", "snapshot")))
        )
        sessions = tuple(
            _session_from_json(f"sessions[{i}]", s)
            for i, s in enumerate(_list("sessions", _req(obj, "sessions", "snapshot")))
        )
        headroom_raw = obj.get("tenant_headroom")
        headroom: dict[str, int] | None = None
        if headroom_raw is not None:
            headroom = {str(k): v for k, v in _mapping("tenant_headroom", headroom_raw).items()}
        snap = cls(now_s=now_s, replicas=replicas, sessions=sessions, tenant_headroom=headroom)
        snap.validate()
        return snap

    def to_json(self) -> dict[str, Any]:
        """Snapshot JSON, with every optional field written out (round-trips through ``from_json``)."""
        out: dict[str, Any] = {
            "now_s": self.now_s,
            "replicas": [
                {
                    "id": r.id,
                    "capacity_tokens": r.capacity_tokens,
                    "used_tokens": r.used_tokens,
                    "healthy": r.healthy,
                    "running": r.running,
                    "waiting": r.waiting,
                    "prefix_hit_rate": r.prefix_hit_rate,
                    "models": list(r.models),
                    "block_size": r.block_size,
                }
                for r in self.replicas
            ],
            "sessions": [
                {
                    "id": s.id,
                    "tenant": s.tenant,
                    "footprint_tokens": s.footprint_tokens,
                    "ready": s.ready,
                    "credits": [
                        {"replica": c.replica, "tokens": c.credit_tokens, "observed_at_s": c.observed_at_s, "kind": c.kind}
                        for c in s.credits
                    ],
                    "phase": s.phase,
                    "replica": s.replica,
                    "admitted": s.admitted,
                    "context_tokens": s.context_tokens,
                    "acting_since_s": s.acting_since_s,
                    "waiting_since_s": s.waiting_since_s,
                    "tool_return_s": s.tool_return_s,
                    "model": s.model,
                }
                for s in self.sessions
            ],
        }
        if self.tenant_headroom is not None:
            out["tenant_headroom"] = dict(self.tenant_headroom)
        return out


@dataclass(frozen=True, slots=True)
class Assignment:
    """Admit pool session ``session`` on ``replica``."""

    session: str
    replica: str


Objective = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's decision for one snapshot.

    ``objective`` is (Σk, Σr, Σf) of ``assignments`` measured with the full TAO value triple
    (decayed credit, readiness, footprint) whatever the policy optimised, so plans of
    different policies compare directly. ``upper_bound`` is set when an approximate solver
    ran: no feasible plan has an objective lexicographically above it. ``pauses`` lists
    admitted sessions to pause; RUNNING ones pause when their request ends (the router defers).
    ``excluded_by_rounding`` counts placements that fit in tokens but that the DP's
    quantisation excluded (found and made by the rounding top-up, see tao.py).
    ``solve_ms`` is diagnostics only (never an input to a decision).
    """

    revision: int
    assignments: tuple[Assignment, ...]
    pauses: tuple[str, ...]
    objective: Objective
    solver: str
    solve_ms: float
    excluded_by_rounding: int = 0
    upper_bound: Objective | None = None
    policy: str = ""
    dp_states: int = 0
    pruned_pairs: int = 0
    unit_tokens: int = 0  # the DP's quantisation unit u (0 when no DP ran)

    def to_json(self) -> dict[str, Any]:
        """Plan JSON (docs/architecture.md#snapshot-and-plan-json) plus the optional diagnostics."""
        return {
            "revision": self.revision,
            "policy": self.policy,
            "assignments": [{"session": a.session, "replica": a.replica} for a in self.assignments],
            "pauses": list(self.pauses),
            "objective": list(self.objective),
            "solver": self.solver,
            "solve_ms": round(self.solve_ms, 3),
            "excluded_by_rounding": self.excluded_by_rounding,
            "upper_bound": None if self.upper_bound is None else list(self.upper_bound),
            "dp_states": self.dp_states,
            "pruned_pairs": self.pruned_pairs,
            "unit_tokens": self.unit_tokens,
        }

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        """Inverse of ``to_json``; raises ``ValueError`` on a malformed plan."""
        obj = _mapping("plan", data)
        assignments = tuple(
            Assignment(
                session=str(_req(_mapping(f"assignments[{i}]", a), "session", f"assignments[{i}]")),
                replica=str(_req(_mapping(f"assignments[{i}]", a), "replica", f"assignments[{i}]")),
            )
            for i, a in enumerate(_list("assignments", _req(obj, "assignments", "plan")))
        )
        ub_raw = obj.get("upper_bound")
        return cls(
            revision=_int("revision", _req(obj, "revision", "plan")),
            assignments=assignments,
            pauses=tuple(str(p) for p in _list("pauses", obj.get("pauses", []))),
            objective=_triple("objective", _req(obj, "objective", "plan")),
            solver=str(obj.get("solver", "")),
            solve_ms=_number("solve_ms", obj.get("solve_ms", 0.0)),
            excluded_by_rounding=_int("excluded_by_rounding", obj.get("excluded_by_rounding", 0)),
            upper_bound=None if ub_raw is None else _triple("upper_bound", ub_raw),
            policy=str(obj.get("policy", "")),
            dp_states=_int("dp_states", obj.get("dp_states", 0)),
            pruned_pairs=_int("pruned_pairs", obj.get("pruned_pairs", 0)),
            unit_tokens=_int("unit_tokens", obj.get("unit_tokens", 0)),
        )


# ----------------------------------------------------------------------------- JSON helpers


def _replica_from_json(where: str, data: Any) -> ReplicaState:
    obj = _mapping(where, data)
    return ReplicaState(
        id=_str(f"{where}.id", _req(obj, "id", where)),
        capacity_tokens=_int(f"{where}.capacity_tokens", _req(obj, "capacity_tokens", where)),
        used_tokens=_int(f"{where}.used_tokens", _req(obj, "used_tokens", where)),
        healthy=_bool(f"{where}.healthy", obj.get("healthy", True)),
        running=_int(f"{where}.running", obj.get("running", 0)),
        waiting=_int(f"{where}.waiting", obj.get("waiting", 0)),
        prefix_hit_rate=_number(f"{where}.prefix_hit_rate", obj.get("prefix_hit_rate", 0.0)),
        models=tuple(_str(f"{where}.models[{k}]", m)
                     for k, m in enumerate(_list(f"{where}.models", obj.get("models", [])))),
        block_size=_int(f"{where}.block_size", obj.get("block_size", DEFAULT_BLOCK_SIZE)),
    )


def _session_from_json(where: str, data: Any) -> SessionState:
    obj = _mapping(where, data)
    credits = tuple(
        _credit_from_json(f"{where}.credits[{j}]", c)
        for j, c in enumerate(_list(f"{where}.credits", obj.get("credits", [])))
    )
    replica = obj.get("replica")
    acting = obj.get("acting_since_s")
    waiting = obj.get("waiting_since_s")
    returns = obj.get("tool_return_s")
    return SessionState(
        id=_str(f"{where}.id", _req(obj, "id", where)),
        tenant=_str(f"{where}.tenant", _req(obj, "tenant", where)),
        footprint_tokens=_int(f"{where}.footprint_tokens", _req(obj, "footprint_tokens", where)),
        ready=_bool(f"{where}.ready", _req(obj, "ready", where)),
        credits=credits,
        phase=_phase(f"{where}.phase", obj.get("phase", "WAITING")),
        replica=None if replica is None or replica == "" else _str(f"{where}.replica", replica),
        admitted=_bool(f"{where}.admitted", obj.get("admitted", False)),
        context_tokens=_int(f"{where}.context_tokens", obj.get("context_tokens", 0)),
        acting_since_s=None if acting is None else _number(f"{where}.acting_since_s", acting),
        waiting_since_s=None if waiting is None else _number(f"{where}.waiting_since_s", waiting),
        tool_return_s=None if returns is None else _number(f"{where}.tool_return_s", returns),
        model=_str(f"{where}.model", obj.get("model", "")),
    )


def _credit_from_json(where: str, data: Any) -> CacheEvidence:
    obj = _mapping(where, data)
    return CacheEvidence.of_credit(
        replica=_str(f"{where}.replica", _req(obj, "replica", where)),
        tokens=_int(f"{where}.tokens", _req(obj, "tokens", where)),
        observed_at_s=_number(f"{where}.observed_at_s", _req(obj, "observed_at_s", where)),
        kind=_str(f"{where}.kind", obj.get("kind", "cached_tokens")),
    )


def _req(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise SnapshotError(f"{where}: missing required field {key!r}")
    return obj[key]


def _mapping(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SnapshotError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise SnapshotError(f"{where}: expected a list, got {type(value).__name__}")
    return list(value)


def _str(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SnapshotError(f"{where}: expected a string, got {value!r}")
    return value


def _phase(path: str, value: Any) -> Phase:
    for phase in PHASES:
        if value == phase:
            return phase
    raise SnapshotError(f"{path}: expected one of {', '.join(PHASES)}, got {value!r}")


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SnapshotError(f"{where}: expected true or false, got {value!r}")
    return value


def _int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotError(f"{where}: expected an integer, got {value!r}")
    return value


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SnapshotError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _triple(where: str, value: Any) -> Objective:
    items = _list(where, value)
    if len(items) != 3:
        raise SnapshotError(f"{where}: expected [credit, ready, footprint], got {value!r}")
    return (_int(f"{where}[0]", items[0]), _int(f"{where}[1]", items[1]), _int(f"{where}[2]", items[2]))


def _check_id(where: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise SnapshotError(f"{where}: expected a non-empty string, got {value!r}")


def _check_tokens(where: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SnapshotError(f"{where}: expected a non-negative integer, got {value!r}")


def _check_bool(where: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SnapshotError(f"{where}: expected true or false, got {value!r}")


def _check_time(where: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SnapshotError(f"{where}: expected a finite number of seconds, got {value!r}")


__all__ = [
    "EVIDENCE_KINDS",
    "PHASES",
    "Assignment",
    "Objective",
    "Plan",
    "ReplicaState",
    "SessionState",
    "Snapshot",
    "SnapshotError",
    "replica_view",
    "session_view",
]
