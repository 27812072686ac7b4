"""Pure tenant-budget controller (docs/algorithms.md#budget-loop): no I/O, no wall clock; time comes in as
``BudgetState.now_s``. ``make_policy(name).reallocate(state) -> Allocation``."""

from services.budget.core.model import (
    MAX_TOTAL_BUDGET,
    MEMORY_FIELDS,
    Allocation,
    BudgetConfig,
    BudgetConfigError,
    BudgetState,
    ClusterObservation,
    Decision,
    TenantConfig,
    TenantObservation,
    may_admit,
)
from services.budget.core.policies import DynamicParams, DynamicPolicy, StaticPolicy, static_targets
from services.budget.core.registry import POLICIES, BudgetPolicy, UnknownPolicyError, make_policy

__all__ = [
    "MAX_TOTAL_BUDGET",
    "MEMORY_FIELDS",
    "POLICIES",
    "Allocation",
    "BudgetConfig",
    "BudgetConfigError",
    "BudgetPolicy",
    "BudgetState",
    "ClusterObservation",
    "Decision",
    "DynamicParams",
    "DynamicPolicy",
    "StaticPolicy",
    "TenantConfig",
    "TenantObservation",
    "UnknownPolicyError",
    "make_policy",
    "may_admit",
    "static_targets",
]
