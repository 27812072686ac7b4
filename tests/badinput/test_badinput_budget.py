"""A hostile total budget must be rejected at once, not computed.

Found by the gRPC fuzz suite: ``ConfigureTenants(total_budget=10**12)`` was accepted and the
next reallocation (``water_fill`` hands out slots one at a time, O(B log n), on the event
loop) never finished, so the budget service stopped answering every RPC, health included.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from services.budget.core import MAX_TOTAL_BUDGET, BudgetConfig, BudgetConfigError, TenantConfig
from services.budget.server import BudgetApp, Settings
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from tao.budget.v1 import budget_pb2, budget_pb2_grpc


@pytest.mark.parametrize("total", [MAX_TOTAL_BUDGET + 1, 10**12, 2**63 - 1])
async def test_huge_total_budget_is_invalid_argument_and_service_keeps_answering(redis_url: str, total: int) -> None:
    settings = load_settings(Settings, redis_url=redis_url, port=0, tick_s=0.5)
    async with serve_in_process("budget", BudgetApp(settings), settings) as running, \
            grpc.aio.insecure_channel(running.address) as ch:
        stub = budget_pb2_grpc.BudgetServiceStub(ch)
        await stub.ConfigureTenants(budget_pb2.ConfigureTenantsRequest(
            total_budget=8, tenants=[budget_pb2.TenantConfig(name="a", floor=1)]), timeout=5)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ConfigureTenants(budget_pb2.ConfigureTenantsRequest(
                total_budget=total, tenants=[budget_pb2.TenantConfig(name="a", floor=1)]), timeout=3)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert time.monotonic() - started < 1.0
        await asyncio.sleep(0.6)  # a tick ran: the stored configuration is still the valid one
        reply = await stub.GetAllocation(budget_pb2.GetAllocationRequest(), timeout=2)
        assert reply.allocation.total == 8


def test_core_rejects_a_total_above_the_bound() -> None:
    BudgetConfig(MAX_TOTAL_BUDGET, (TenantConfig("a"),))
    with pytest.raises(BudgetConfigError, match="total budget"):
        BudgetConfig(MAX_TOTAL_BUDGET + 1, (TenantConfig("a"),))


@pytest.mark.parametrize("name", ["x" * 300_000, "\u202e", "a\x00b", " "])
def test_core_rejects_hostile_tenant_names(name: str) -> None:
    """Names end up in Redis records, Prometheus labels and logs: bounded and printable
    (found by the gRPC fuzz suite: a 300 kB name and control characters were accepted)."""
    with pytest.raises(BudgetConfigError, match="tenant name"):
        BudgetConfig(8, (TenantConfig(name),))
