"""Shared by the fault suites: a stack of real processes started once per module, healed
before each test."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar


class _Env(Protocol):
    def start(self, *args: Any, **kwargs: Any) -> None: ...
    def stop(self) -> None: ...
    def heal(self) -> None: ...
    async def wait_serving(self, timeout_s: float = ...) -> dict[str, str]: ...


E = TypeVar("E", bound=_Env)


def started(env: E, **start: Any) -> Iterator[E]:
    """Body of a module fixture: start ``env``, yield it, always stop it."""
    try:
        env.start(**start)
        yield env
    finally:
        env.stop()


def healed(env: E, timeout_s: float, serving: tuple[str, ...] = ("SERVING",)) -> E:
    """Restart whatever a previous test left down and wait until every service answers ``serving``."""
    env.heal()
    status = asyncio.run(env.wait_serving(timeout_s=timeout_s))
    assert all(s in serving for s in status.values()), f"stack not healthy before the test: {status}"
    return env
