"""Control loops keep their model-time period when the stack runs faster than wall time
(docs/architecture.md#model-time): the budget service ticks every ``tick_s`` model seconds, evenly, not in bursts.

Found by the fault suite: ``BudgetService.run`` slept the model-time delay as wall seconds, so
at time scale 20 it ticked once, slept 2 wall seconds, then fired 19 ticks back to back.
"""

from __future__ import annotations

import asyncio

from services.budget.server import BudgetApp, Settings
from services.common.settings import load_settings
from services.common.testing import serve_in_process
from tao.budget.v1 import budget_pb2, budget_pb2_grpc

SCALE = 20.0
TICK_S = 2.0  # model seconds: one tick every 0.1 wall seconds at scale 20


async def test_budget_ticks_evenly_in_model_time(redis_url: str) -> None:
    settings = load_settings(Settings, redis_url=redis_url, port=0, time_scale=SCALE, tick_s=TICK_S,
                             total_budget=8, tenants=[{"name": "default", "floor": 1}])
    async with serve_in_process("budget", BudgetApp(settings), settings) as running:
        import grpc

        async with grpc.aio.insecure_channel(running.address) as ch:
            stub = budget_pb2_grpc.BudgetServiceStub(ch)
            revisions = []
            for _ in range(13):  # 1.2 wall seconds = 24 model seconds = 12 ticks
                reply = await stub.GetAllocation(budget_pb2.GetAllocationRequest(), timeout=2)
                revisions.append(reply.allocation.revision.revision)
                await asyncio.sleep(0.1)
    steps = [b - a for a, b in zip(revisions, revisions[1:], strict=False)]
    gained = revisions[-1] - revisions[0]
    assert 6 <= gained <= 20, f"expected about 12 ticks in 1.2 wall s, got {gained}: {revisions}"
    assert max(steps) <= 4, f"ticks came in a burst: {revisions}"
