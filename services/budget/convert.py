"""The one place budget values change shape: proto <-> core <-> Redis record.

``BudgetAllocationRecord`` extends the shared ``AllocationRecord`` with the admission
``limits`` (see ``services.budget.core.model``), the targets and the demand envelope, so a
restarted service resumes exactly; readers that know only ``AllocationRecord`` ignore the
extra fields. Core decisions of kind ``drain`` have no proto/record kind yet: they are
published as ``hold`` with the donor, receiver, slots and a reason starting ``drain:``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from pydantic import Field

from services.budget.core import (
    MEMORY_FIELDS,
    Allocation,
    BudgetConfig,
    BudgetConfigError,
    Decision,
    TenantConfig,
    TenantObservation,
)
from services.common.core.ratelimit import RateLimit
from services.common.errors import InvalidArgument
from services.common.records import (
    AllocationRecord,
    BudgetConfigRecord,
    DecisionRecord,
    TenantConfigRecord,
    TenantDemandRecord,
)
from tao.budget.v1 import budget_pb2
from tao.common.v1 import common_pb2


class BudgetAllocationRecord(AllocationRecord):
    """What the budget service stores under ``keys.ALLOCATION`` (an ``AllocationRecord``)."""

    targets: dict[str, int] = Field(default_factory=dict)
    demand_envelope: dict[str, int] = Field(default_factory=dict)
    burst_peak: dict[str, int] = Field(default_factory=dict)
    idle_ms: dict[str, int] = Field(default_factory=dict)
    min_gap_ms: dict[str, int] = Field(default_factory=dict)
    recall_since_ms: dict[str, int] = Field(default_factory=dict)
    recall_ms: dict[str, int] = Field(default_factory=dict)
    computed_at_s: float = 0.0


# ---------------------------------------------------------------- configuration

def config_from_proto(req: budget_pb2.ConfigureTenantsRequest) -> BudgetConfig:
    """Validated core config; ``InvalidArgument`` with the exact reason otherwise."""
    tenants = []
    for t in req.tenants:
        if t.floor < 0 or t.static_cap < 0:
            raise InvalidArgument(f"tenant {t.name!r}: floor and static_cap must be >= 0")
        if t.weight < 0 or not math.isfinite(t.weight) or not math.isfinite(t.p99_slo_s) or t.p99_slo_s < 0:
            raise InvalidArgument(f"tenant {t.name!r}: weight must be > 0 and p99_slo_s >= 0")
        if t.rate_limit.rpm < 0 or t.rate_limit.tpm < 0:
            raise InvalidArgument(f"tenant {t.name!r}: rate_limit.rpm and rate_limit.tpm must be >= 0")
        try:
            tenants.append(TenantConfig(t.name, int(t.floor), t.weight or 1.0, t.p99_slo_s or None,
                                        int(t.static_cap) or None,
                                        RateLimit(int(t.rate_limit.rpm), int(t.rate_limit.tpm))))
        except BudgetConfigError as exc:
            raise InvalidArgument(str(exc)) from exc
    try:
        return BudgetConfig(int(req.total_budget), tuple(tenants))
    except BudgetConfigError as exc:
        raise InvalidArgument(str(exc)) from exc


def config_to_record(config: BudgetConfig, policy: str, epoch: str, rev: int) -> BudgetConfigRecord:
    return BudgetConfigRecord(
        epoch=epoch, rev=rev, total_budget=config.total, policy=policy,
        tenants=tuple(TenantConfigRecord(name=t.name, floor=t.floor, weight=t.weight, p99_slo_s=t.p99_slo_s or 0.0,
                                         static_cap=t.static_cap or 0, rate_limit=t.rate_limit)
                      for t in config.tenants),
    )


def config_from_record(rec: BudgetConfigRecord) -> BudgetConfig:
    """Raises ``BudgetConfigError`` when the stored configuration is not valid any more."""
    return BudgetConfig(rec.total_budget, tuple(
        TenantConfig(t.name, t.floor, t.weight, t.p99_slo_s or None, t.static_cap or None, t.rate_limit)
        for t in rec.tenants
    ))


# ---------------------------------------------------------------- allocation

def _decision_record(d: Decision) -> DecisionRecord:
    if d.kind == "drain":
        return DecisionRecord(kind="hold", to_tenant=d.to_tenant, from_tenant=d.from_tenant, slots=d.slots,
                              reason=f"drain: {d.reason}")
    return DecisionRecord(kind=d.kind, to_tenant=d.to_tenant, from_tenant=d.from_tenant, slots=d.slots,
                          reason=d.reason)


def allocation_to_record(alloc: Allocation, epoch: str, decided_at_unix_s: float,
                         rate_limits: Mapping[str, RateLimit]) -> BudgetAllocationRecord:
    """``rate_limits``: the configuration's (``BudgetConfig.rate_limits``), published with every
    allocation so that the routers apply them."""
    return BudgetAllocationRecord(
        epoch=epoch, rev=alloc.revision, total=alloc.total, caps=dict(alloc.caps), policy=alloc.policy,
        decisions=tuple(_decision_record(d) for d in alloc.decisions), decided_at_unix_s=decided_at_unix_s,
        limits=dict(alloc.limits), rate_limits=dict(rate_limits), targets=dict(alloc.targets), computed_at_s=alloc.computed_at_s, **alloc.memory(),
    )


def allocation_from_record(rec: BudgetAllocationRecord) -> Allocation:
    """The core allocation a record holds; ``ValueError`` when it breaks an invariant."""
    decisions = tuple(
        Decision("drain" if d.reason.startswith("drain: ") else d.kind,
                 d.reason.removeprefix("drain: "), d.to_tenant, d.from_tenant, d.slots)
        for d in rec.decisions
    )
    return Allocation(rec.rev, rec.total, rec.caps, rec.limits or rec.caps, rec.policy, rec.computed_at_s,
                      decisions, rec.targets, **{name: getattr(rec, name) for name in MEMORY_FIELDS})


def allocation_to_proto(rec: AllocationRecord) -> budget_pb2.Allocation:
    return budget_pb2.Allocation(
        revision=common_pb2.Revision(epoch=rec.epoch, revision=rec.rev),
        total=rec.total, caps=rec.caps, limits=rec.limits or rec.caps, policy=rec.policy,
        decided_at_unix_s=rec.decided_at_unix_s,
        rate_limits={t: budget_pb2.RateLimit(rpm=r.rpm, tpm=r.tpm) for t, r in rec.rate_limits.items()},
        decisions=[budget_pb2.Decision(kind=d.kind, to_tenant=d.to_tenant, from_tenant=d.from_tenant,
                                       slots=d.slots, reason=d.reason) for d in rec.decisions],
    )


# ---------------------------------------------------------------- demand

def demand_from_record(rec: TenantDemandRecord, from_unix: Callable[[float], float]) -> TenantObservation:
    return TenantObservation(rec.tenant, rec.waiting, rec.in_flight, from_unix(rec.updated_at_unix_s),
                             rec.p99_latency_s or None, rec.p99_hold_s or None)


def demand_from_proto(entries: Iterable[budget_pb2.TenantDemand], known: Iterable[str],
                      now_s: float) -> dict[str, TenantObservation]:
    """All entries or none: ``InvalidArgument`` on an unknown tenant, a negative count or a
    repeated tenant."""
    names = set(known)
    out: dict[str, TenantObservation] = {}
    for e in entries:
        if e.tenant not in names:
            raise InvalidArgument(f"unknown tenant {e.tenant!r}; configured: {', '.join(sorted(names)) or 'none'}")
        if e.tenant in out:
            raise InvalidArgument(f"tenant {e.tenant!r} reported twice")
        if e.waiting < 0 or e.in_flight < 0 or not all(v >= 0 and math.isfinite(v) for v in (e.p99_latency_s, e.p99_hold_s)):
            raise InvalidArgument(f"tenant {e.tenant!r}: waiting, in_flight, p99_latency_s and p99_hold_s must be >= 0 "
                                  "(and finite)")
        out[e.tenant] = TenantObservation(e.tenant, int(e.waiting), int(e.in_flight), now_s,
                                          e.p99_latency_s or None, e.p99_hold_s or None)
    return out
