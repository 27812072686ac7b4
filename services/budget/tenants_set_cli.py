"""`tao tenants set`: replace the budget's tenant set (``services/budget/tenants_cli.py``)."""

from __future__ import annotations

from services.budget.tenants_cli import add_set_arguments as add_arguments
from services.budget.tenants_cli import run_set as run

__all__ = ["add_arguments", "run"]
