"""Background tasks and deadlines that never lose a cancellation.

Two ways a cancellation gets lost, and the helpers that prevent them:

- redis-py (and aiohttp) can turn a cancellation in the middle of an I/O call into their own
  connection errors; a loop that catches those and goes on would ignore ``Task.cancel()`` and
  hang shutdown. ``reraise_if_cancelling`` restores the cancellation; ``stop_tasks`` cancels,
  waits a bounded time, and never blocks shutdown for good.
- On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in the same loop
  iteration as the awaited result (the inner task finished, so it returns the result instead
  of raising; fixed in 3.12, where ``wait_for`` is built on ``asyncio.timeout``). A loop that
  waits on an event with ``wait_for`` then survives ``task.cancel()`` and runs on after its
  service stopped: a stopped planner kept publishing plans. ``asyncio.timeout`` counts
  cancellations per task and never mistakes an outside cancel for its own, so every deadline
  in the services goes through ``within`` and ``wait_event``.
- redis-py 8.1 writes a command through ``asyncio.wait_for`` when the client has a socket
  timeout, so on 3.11 a cancellation that lands in the iteration of the write is lost and the
  call *returns* (measured: 116 of 300 cancels timed onto a ``PING``); no ``except`` sees it.
  ``within`` raises a cancellation that arrived while it waited and the awaitable swallowed:
  the services' health loop pings through it, and a lost cancel there left ``stop()`` waiting
  on the health task for good (a fleet test's teardown hung after an event-loop stall). Every
  background loop also calls ``reraise_if_cancelling`` at the top of each round, so a cancel
  that any call of the previous round swallowed ends the loop. (Not inside ``wait_event`` or
  ``within``: cleanup that runs while its task is cancelled, such as a flush on close, must
  still be able to wait.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ["reraise_if_cancelling", "stop_tasks", "wait_event", "within"]

T = TypeVar("T")


def reraise_if_cancelling() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


async def stop_tasks(tasks: Iterable[asyncio.Task[None]], timeout_s: float = 2.0) -> None:
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)
    for t in pending:
        if t.done() and not t.cancelled():
            with contextlib.suppress(BaseException):
                t.result()


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``await awaitable``, raising ``TimeoutError`` after ``timeout_s`` (it is cancelled then).
    A cancellation of the caller that the awaitable swallowed (it returned instead) is raised."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    async with asyncio.timeout(timeout_s):
        result = await awaitable
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError()
    return result


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passes; True when it was set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
