"""Router integration fixtures (helpers live in ``router_harness``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from router_harness import TIME_SCALE

from services.sim.vllm_sim.server import RunningSim, start_vllm_sim


@pytest.fixture
async def sims() -> AsyncIterator[list[RunningSim]]:
    async with start_vllm_sim(time_scale=TIME_SCALE) as a, start_vllm_sim(time_scale=TIME_SCALE) as b:
        yield [a, b]

