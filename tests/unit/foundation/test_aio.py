"""services.common.aio: deadlines that never swallow a cancellation.

The planner's round loop waited on its kick event with ``asyncio.wait_for``; on Python 3.11 a
``cancel()`` that landed in the same loop iteration as a kick was lost, so a stopped planner
went on publishing plans (a CI failure: "planner silent" timed out after the planner stop).
"""

from __future__ import annotations

import asyncio

import pytest

from services.common.aio import reraise_if_cancelling, stop_tasks, wait_event, within


async def _kick_and_cancel(wait: object) -> asyncio.Task[None]:
    """A loop that waits on an event like the services' background loops; the event is set
    and the task cancelled in the same iteration. Returns the task once it is done."""
    kick = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait(kick)  # type: ignore[operator]
            kick.clear()
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)  # the loop is now waiting on the event
    kick.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    if not task.done():
        task.cancel()  # the defect: the first cancel was lost; stop it now for the next test
        await asyncio.wait({task}, timeout=1.0)
        pytest.fail(f"the cancel that came with a kick was swallowed (rounds after it: {rounds})")
    return task


async def test_wait_event_delivers_a_cancel_that_coincides_with_the_event() -> None:
    task = await _kick_and_cancel(lambda ev: wait_event(ev, 10.0))
    assert task.cancelled()


async def test_within_delivers_a_cancel_that_coincides_with_the_result() -> None:
    task = await _kick_and_cancel(lambda ev: within(ev.wait(), 10.0))
    assert task.cancelled()


async def test_within_delivers_a_cancel_that_the_awaitable_swallowed() -> None:
    # as redis-py's command write does on 3.11 (asyncio.wait_for): the call returns, the cancel is gone
    async def swallows() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "returned"
        return "slept"

    task = asyncio.create_task(within(swallows(), 10.0))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    assert task.cancelled()


async def test_within_in_a_task_already_cancelling_still_runs_its_cleanup() -> None:
    # a cancellation that was caught before within (cleanup in an except/finally) is not raised again
    async def cleanup() -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return await within(asyncio.sleep(0, result=5), 1.0)
        return 0

    task = asyncio.create_task(cleanup())
    await asyncio.sleep(0)
    task.cancel()
    assert await task == 5


async def test_wait_event_reports_set_and_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True


async def test_within_returns_the_result_or_raises_timeout() -> None:
    assert await within(asyncio.sleep(0, result=7), 1.0) == 7
    with pytest.raises(TimeoutError):
        await within(asyncio.sleep(10), 0.01)


async def test_stop_tasks_is_bounded_for_a_task_that_ignores_cancel() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await stop_tasks([task], timeout_s=0.05)
    assert loop.time() - started < 1.0 and not task.done()
    release.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    assert task.done()


async def test_a_loop_on_wait_event_ends_when_its_round_swallowed_the_cancel() -> None:
    # a background loop whose round calls something that swallows the cancel (redis-py's write on
    # 3.11) must still end: reraise_if_cancelling, at the top of the next round, raises it
    rounds = 0
    swallowed = False

    async def swallows() -> None:
        nonlocal swallowed
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if swallowed:  # only the first one: a failing test still tears down
                raise
            swallowed = True

    async def loop() -> None:
        nonlocal rounds
        kick = asyncio.Event()
        while True:
            reraise_if_cancelling()
            await wait_event(kick, 0.01)
            rounds += 1
            await swallows()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)  # inside the first round's call
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    assert task.cancelled() and rounds == 1
