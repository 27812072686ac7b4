"""A tiny faithful router model shared by the budget unit tests.

Per tenant it keeps requests waiting and in flight, admits by ``Allocation.admits`` (the
router's rule: below its limit, and within its cap or into slots a draining donor has
vacated) and never preempts. The benchmark applies the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.budget.core import (
    Allocation,
    BudgetConfig,
    BudgetPolicy,
    BudgetState,
    ClusterObservation,
    TenantObservation,
)


@dataclass
class RouterModel:
    config: BudgetConfig
    policy: BudgetPolicy
    now_s: float = 0.0
    waiting: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    allocation: Allocation | None = None
    #: the p99 slot hold (admission to end) each tenant reports, seconds (absent: unknown)
    hold: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.config.names:
            self.waiting.setdefault(name, 0)
            self.in_flight.setdefault(name, 0)

    def admit(self) -> None:
        if self.allocation is None:
            return
        alloc = self.allocation
        for name in self.config.names:
            own = max(0, min(alloc.caps[name], alloc.limits[name]) - self.in_flight[name])
            take = min(own, self.waiting[name])  # within cap and limit: admits() is True for each
            self.in_flight[name] += take
            self.waiting[name] -= take
            while self.waiting[name] > 0 and alloc.admits(name, self.in_flight):
                self.in_flight[name] += 1
                self.waiting[name] -= 1

    def finish(self, name: str, count: int) -> None:
        self.in_flight[name] -= min(count, self.in_flight[name])

    def set_demand(self, name: str, demand: int) -> None:
        """Outstanding requests of ``name`` become ``demand`` (in flight ones count; when
        demand is below in flight, the extra in-flight ones are still running)."""
        self.waiting[name] = max(0, demand - self.in_flight[name])

    def observations(self, p99: dict[str, float] | None = None,
                     skip: frozenset[str] = frozenset()) -> dict[str, TenantObservation]:
        p99 = p99 or {}
        return {
            n: TenantObservation(n, self.waiting[n], self.in_flight[n], self.now_s, p99.get(n), self.hold.get(n))
            for n in self.config.names
            if n not in skip
        }

    def tick(self, p99: dict[str, float] | None = None, skip: frozenset[str] = frozenset(),
             kv_usage: float | None = None, dt_s: float = 2.0) -> Allocation:
        """Router admits, then the controller ticks on what it observes, then the router
        admits under the new limits. Returns the new allocation."""
        self.admit()
        state = BudgetState(self.now_s, self.config, self.observations(p99, skip), self.allocation,
                            ClusterObservation(kv_usage))
        self.allocation = self.policy.reallocate(state)
        self.admit()
        self.now_s += dt_s
        return self.allocation
