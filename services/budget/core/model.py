"""Inputs and outputs of the tenant budget controller (docs/algorithms.md#budget-loop).

All values are frozen; counts are exact integers ("slots" = concurrent in-flight LLM
requests). Two numbers per tenant come out of every tick:

- ``caps[t]``: the slots tenant ``t`` *holds*. ``sum(caps) == total`` always, every cap is
  at least its floor, and a cap is lowered only by slots the tenant is not using, so
  ``in_flight[t] <= caps[t]`` keeps holding and the in-flight total never exceeds B.
- ``limits[t]``: the admission ceiling the router applies. ``sum(limits) == total`` and
  ``limits[t] >= floor[t]``. Below the cap the tenant is *draining*: it stops refilling and
  the ``caps - limits`` slots it still occupies are promised to receivers, whose limits are
  above their caps by what they were promised. The router admits a request of ``t`` when
  ``in_flight[t] < limits[t]`` and either ``in_flight[t] < caps[t]`` or the request takes a
  slot a draining donor has already vacated (exact rule: ``reconcile`` module docstring).
  Without draining, a saturating tenant refills every slot the moment it frees and a
  bursting neighbour could never win anything back; nothing is ever preempted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from services.common.core.ratelimit import NO_LIMIT, RateLimit

DecisionKind = Literal["move", "drain", "hold"]


class BudgetConfigError(ValueError):
    """A tenant configuration that cannot be applied; the message says exactly why."""


#: Largest total budget B accepted. B counts concurrent in-flight requests (a fleet of a
#: hundred replicas at vLLM's default max_num_seqs of 256 needs 25,600); reallocation is
#: O(B log n) (``split.water_fill`` hands out slots one at a time), so an unbounded B from a
#: client would stall the service (found by the gRPC fuzz suite: B = 10**12 never finished).
MAX_TOTAL_BUDGET = 100_000
#: Tenant names go into Redis records, Prometheus labels and logs (the router's session ids
#: have the same bound)
MAX_TENANT_NAME_CHARS = 256


def _frozen_map(values: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class TenantConfig:
    """One tenant. ``floor`` slots are never reallocated away; ``weight`` (> 0) scales its
    fair share; ``p99_slo_s`` is its latency objective (None: none); ``static_cap`` is its
    cap under the static policy (None: weighted split); ``rate_limit`` its requests and tokens
    per minute, which the controller only carries to the routers with each allocation."""

    name: str
    floor: int = 0
    weight: float = 1.0
    p99_slo_s: float | None = None
    static_cap: int | None = None
    rate_limit: RateLimit = NO_LIMIT

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise BudgetConfigError("tenant name must not be empty")
        if len(self.name) > MAX_TENANT_NAME_CHARS or not self.name.isprintable():
            raise BudgetConfigError(f"tenant name must be 1-{MAX_TENANT_NAME_CHARS} printable characters, "
                                    f"got {self.name[:40]!r}{'...' if len(self.name) > 40 else ''}")
        if self.floor < 0:
            raise BudgetConfigError(f"tenant {self.name!r}: floor must be >= 0, got {self.floor}")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise BudgetConfigError(f"tenant {self.name!r}: weight must be > 0, got {self.weight}")
        if self.p99_slo_s is not None and not (math.isfinite(self.p99_slo_s) and self.p99_slo_s > 0):
            raise BudgetConfigError(f"tenant {self.name!r}: p99 SLO must be > 0 s, got {self.p99_slo_s}")
        if self.static_cap is not None and self.static_cap < self.floor:
            raise BudgetConfigError(
                f"tenant {self.name!r}: static cap {self.static_cap} is below its floor {self.floor}"
            )


@dataclass(frozen=True)
class BudgetConfig:
    """The total budget B and the tenant set.

    Valid when B > 0, there is at least one tenant, names are unique, floors sum to at
    most B, and static caps are either all unset or all set and summing to exactly B.
    """

    total: int
    tenants: tuple[TenantConfig, ...]

    def __post_init__(self) -> None:
        if self.total <= 0:
            raise BudgetConfigError(f"total budget must be > 0, got {self.total}")
        if self.total > MAX_TOTAL_BUDGET:
            raise BudgetConfigError(f"total budget must be <= {MAX_TOTAL_BUDGET}, got {self.total}")
        if not self.tenants:
            raise BudgetConfigError("at least one tenant is required")
        names = [t.name for t in self.tenants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise BudgetConfigError(f"tenant names must be unique; repeated: {', '.join(dupes)}")
        floors = sum(t.floor for t in self.tenants)
        if floors > self.total:
            raise BudgetConfigError(f"floors sum to {floors}, above the total budget {self.total}")
        statics = [t.static_cap for t in self.tenants if t.static_cap is not None]
        if statics and len(statics) != len(self.tenants):
            raise BudgetConfigError("static caps must be set for every tenant or for none")
        if statics and sum(statics) != self.total:
            raise BudgetConfigError(f"static caps sum to {sum(statics)}, not the total budget {self.total}")

    @property
    def names(self) -> tuple[str, ...]:
        """Tenant names in a fixed (sorted) order; every loop in the core uses it."""
        return tuple(sorted(t.name for t in self.tenants))

    @property
    def rate_limits(self) -> dict[str, RateLimit]:
        """The tenants configured with a rate limit, and it (published with every allocation)."""
        return {t.name: t.rate_limit for t in self.tenants if t.rate_limit.active}

    def tenant(self, name: str) -> TenantConfig:
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class TenantObservation:
    """What the router reports for one tenant: requests held ``waiting`` for a slot,
    requests ``in_flight``, the recent p99 latency (from arrival at the router), the recent p99
    slot hold (from admission to the request's end: how long a slot lent to this tenant stays
    taken), None where unknown, and when it was seen."""

    tenant: str
    waiting: int
    in_flight: int
    observed_at_s: float
    p99_latency_s: float | None = None
    p99_hold_s: float | None = None

    def __post_init__(self) -> None:
        if self.waiting < 0 or self.in_flight < 0:
            raise ValueError(f"tenant {self.tenant!r}: waiting and in_flight must be >= 0")
        for what, v in (("p99 latency", self.p99_latency_s), ("p99 hold", self.p99_hold_s)):
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"tenant {self.tenant!r}: {what} must be a finite number >= 0")

    @property
    def demand(self) -> int:
        """Queue depth: requests waiting plus requests in flight."""
        return self.waiting + self.in_flight


@dataclass(frozen=True)
class ClusterObservation:
    """Engine-side load: mean KV-cache use of the replicas in [0, 1] (None: unknown)."""

    kv_usage_frac: float | None = None


@dataclass(frozen=True)
class Decision:
    """One step of a tick: ``move`` slots to a tenant from a donor, ``drain`` a donor (lower
    its admission limit so slots free up for ``to_tenant``), or ``hold``."""

    kind: DecisionKind
    reason: str
    to_tenant: str = ""
    from_tenant: str = ""
    slots: int = 0

    def describe(self) -> str:
        if self.kind == "hold":
            return f"hold: {self.reason}"
        verb = "move" if self.kind == "move" else "drain"
        return f"{verb} {self.slots} to {self.to_tenant} from {self.from_tenant}: {self.reason}"


#: the dynamic controller's memory fields of ``Allocation`` (every policy carries them on, the
#: allocation record stores them): one list, so a new field is carried everywhere
MEMORY_FIELDS = ("demand_envelope", "burst_peak", "idle_ms", "min_gap_ms", "recall_since_ms", "recall_ms")


@dataclass(frozen=True)
class Allocation:
    """The result of one tick. Invariants (checked here, so a bad allocation cannot exist):
    ``sum(caps) == sum(limits) == total``; caps and limits are >= 0 and name the same
    tenants. ``demand_envelope`` (fast-rise, slow-decay demand per tenant), ``burst_peak`` (the
    largest demand, up to its static share, seen in the tenant's recent active periods),
    ``idle_ms`` (how long the tenant has had no demand, in ms), ``min_gap_ms`` (the shortest
    idle gap it has completed, in ms; absent: none seen), ``recall_since_ms`` (when the call-back
    of a lender's reserve in progress began, model ms) and ``recall_ms`` (how long its call-backs
    take, learned from the ones it completed) are the dynamic controller's memory, carried so a
    restarted service resumes exactly."""

    revision: int
    total: int
    caps: Mapping[str, int]
    limits: Mapping[str, int]
    policy: str
    computed_at_s: float
    decisions: tuple[Decision, ...] = ()
    targets: Mapping[str, int] = field(default_factory=dict)
    demand_envelope: Mapping[str, int] = field(default_factory=dict)
    burst_peak: Mapping[str, int] = field(default_factory=dict)
    idle_ms: Mapping[str, int] = field(default_factory=dict)
    min_gap_ms: Mapping[str, int] = field(default_factory=dict)
    recall_since_ms: Mapping[str, int] = field(default_factory=dict)
    recall_ms: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("caps", "limits", "targets", *MEMORY_FIELDS):
            object.__setattr__(self, name, _frozen_map(getattr(self, name)))
        if sum(self.caps.values()) != self.total:
            raise ValueError(f"caps sum to {sum(self.caps.values())}, not the total {self.total}")
        if set(self.caps) != set(self.limits):
            raise ValueError("caps and limits must name the same tenants")
        if sum(self.limits.values()) != self.total:
            raise ValueError(f"limits sum to {sum(self.limits.values())}, not the total {self.total}")
        for name, cap in self.caps.items():
            if cap < 0 or self.limits[name] < 0:
                raise ValueError(f"tenant {name!r}: cap {cap} and limit {self.limits[name]} must be >= 0")

    def memory(self) -> dict[str, dict[str, int]]:
        """The memory fields as plain dicts (``MEMORY_FIELDS``), to carry into the next allocation."""
        return {name: dict(getattr(self, name)) for name in MEMORY_FIELDS}

    @property
    def moved_to(self) -> tuple[str, ...]:
        """Tenants that received slots this tick (empty: the tick was a hold)."""
        return tuple(sorted({d.to_tenant for d in self.decisions if d.kind == "move"}))

    def admits(self, tenant: str, in_flight: Mapping[str, int]) -> bool:
        """The router's admission rule for this allocation (``may_admit``)."""
        return may_admit(tenant, self.caps, self.limits, in_flight)

    @property
    def is_hold(self) -> bool:
        return not self.moved_to


def may_admit(tenant: str, caps: Mapping[str, int], limits: Mapping[str, int], in_flight: Mapping[str, int]) -> bool:
    """The router's admission rule: may ``tenant`` start one more request now, given every
    tenant's in-flight count? Yes when it is below its limit and either below its cap or the
    request takes a slot a draining donor has already vacated:
    ``sum_r max(0, in_flight[r] - caps[r]) < sum_d max(0, caps[d] - max(in_flight[d], limits[d]))``.
    Keeps ``sum(in_flight) <= sum(caps)`` and never lends a tenant's own slots. A tenant
    missing from ``caps`` is not limited (no allocation for it yet)."""
    if tenant not in caps:
        return True
    mine = in_flight.get(tenant, 0)
    if mine >= limits.get(tenant, caps[tenant]):
        return False
    if mine < caps[tenant]:
        return True
    overdraft = sum(max(0, in_flight.get(n, 0) - c) for n, c in caps.items())
    vacated = sum(max(0, c - max(in_flight.get(n, 0), limits.get(n, c))) for n, c in caps.items())
    return overdraft < vacated


@dataclass(frozen=True)
class BudgetState:
    """Everything a policy needs for one tick: the time, the configuration, the latest
    observation per tenant (missing or stale: the tenant is held as it is), the previous
    allocation (None at the very first tick) and engine load."""

    now_s: float
    config: BudgetConfig
    observations: Mapping[str, TenantObservation]
    previous: Allocation | None = None
    cluster: ClusterObservation = field(default_factory=ClusterObservation)

    def __post_init__(self) -> None:
        object.__setattr__(self, "observations", MappingProxyType(dict(self.observations)))
