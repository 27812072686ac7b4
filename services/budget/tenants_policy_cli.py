"""`tao tenants policy`: switch the budget's policy (``services/budget/tenants_cli.py``)."""

from __future__ import annotations

from services.budget.tenants_cli import add_policy_arguments as add_arguments
from services.budget.tenants_cli import run_policy as run

__all__ = ["add_arguments", "run"]
