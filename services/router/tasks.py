"""Background-task helpers: loops that survive errors but never swallow a cancellation.

redis-py (and aiohttp) can turn a cancellation in the middle of an I/O call into their own
connection errors; a loop that catches those and goes on would ignore ``Task.cancel()`` and
hang shutdown. ``reraise_if_cancelling`` restores the cancellation; ``stop_tasks`` cancels,
waits a bounded time, and never blocks shutdown for good.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


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
