"""Policy registry: config string -> policy. Every policy turns a ``BudgetState`` into an
``Allocation`` obeying the invariants documented in ``reconcile``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from services.budget.core.model import Allocation, BudgetState
from services.budget.core.policies import DynamicParams, DynamicPolicy, StaticPolicy


class BudgetPolicy(Protocol):
    """``reallocate`` is pure and deterministic: the same state gives the same allocation."""

    name: str

    def reallocate(self, state: BudgetState) -> Allocation: ...


class UnknownPolicyError(ValueError):
    """The policy name is not registered; the message lists the valid names."""


def _static(params: DynamicParams) -> BudgetPolicy:
    return StaticPolicy(stale_after_s=params.stale_after_s)


def _dynamic(params: DynamicParams) -> BudgetPolicy:
    return DynamicPolicy(params)


POLICIES: dict[str, Callable[[DynamicParams], BudgetPolicy]] = {
    "static": _static,
    "dynamic": _dynamic,
}


def make_policy(name: str, params: DynamicParams | None = None) -> BudgetPolicy:
    """The policy registered as ``name`` (``params`` tune the dynamic controller and give the
    staleness bound of both); ``UnknownPolicyError`` lists the names when it is unknown."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown budget policy {name!r}; choose one of: {', '.join(sorted(POLICIES))}"
        ) from None
    return factory(params or DynamicParams())
