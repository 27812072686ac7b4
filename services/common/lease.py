"""Leader lease in Redis: the I/O side of ``services.common.core.lease``
(docs/architecture.md#high-availability).

``RedisLease`` owns ``keys.lease_key(role)`` while it is the leader. All four operations are
Lua scripts, atomic in Redis and within one Cluster slot (every key has the ``{tao}`` tag):

- acquire: ``SET key token NX PX ttl`` (or the key already holds our own token) and, in the same
  script, ``INCR`` of ``keys.term_key(role)``: every takeover is a new, higher term. A process
  that lost its lease (a pause past the TTL, a Redis restart) and wins it back while the term
  key still holds *its* term keeps that term: no one else wrote in between, so its epoch and
  revisions simply continue;
- renew: compare-and-``PEXPIRE``; release (shutdown): compare-and-``DEL``;
- fenced write: compare the token, then ``SET`` the given keys and ``PUBLISH`` the given
  messages; nothing is written when another process holds the lease. The planner and the
  budget service publish only through it, so a deposed leader that is still running (paused,
  partitioned, slow) can never overwrite its successor's epoch, plan or allocation.

With ``enabled=False`` (a single instance, no election) the process is always the leader of
term 0 with its start-up epoch, and fenced writes write unconditionally, as before.

The lease runs on the wall monotonic clock (I/O pacing, not model time).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import reraise_if_cancelling, wait_event, within
from services.common.core.lease import Action, LeaseConfig, LeaseCore, Role, term_epoch

# KEYS = [lease, term]; ARGV = [token, ttl_ms, the term this process held last (0: none)]
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local term = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[3] ~= '0' and term == tonumber(ARGV[3]) then return term end
return redis.call('INCR', KEYS[2])
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS = [lease, k1..kn]; ARGV = [token ('' = unconditional), n, v1..vn, channel1, msg1, ...]
_WRITE = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local n = tonumber(ARGV[2])
for i = 1, n do redis.call('SET', KEYS[i + 1], ARGV[i + 2]) end
for j = n + 3, #ARGV, 2 do redis.call('PUBLISH', ARGV[j], ARGV[j + 1]) end
return 1
"""

#: called with True when this process becomes the leader (after its epoch changed), False when it stops
RoleHook = Callable[[bool], Awaitable[None]]


class RedisLease:
    def __init__(
        self,
        redis: aioredis.Redis,
        role: str,
        *,
        ttl_s: float,
        process_epoch: str,
        log: structlog.stdlib.BoundLogger,
        enabled: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
        key: str | None = None,
        term_key: str | None = None,
    ) -> None:
        """``role`` names the lease (``planner``, ``budget``); ``key`` / ``term_key`` override
        ``keys.lease_key(role)`` / ``keys.term_key(role)`` for leases that are not a service's
        (e.g. one per session; keep the ``{tao}`` hash tag and the owner's prefix)."""
        self.redis = redis
        self.role = role
        self.enabled = enabled
        self.core = LeaseCore(LeaseConfig(ttl_s))
        self.process_epoch = process_epoch
        self.token = secrets.token_hex(16)
        self.key = key or keys.lease_key(role)
        self.term_key = term_key or keys.term_key(role)
        self.log = log
        self._now = monotonic
        self._hooks: list[RoleHook] = []
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._was_leader = False

    # ------------------------------------------------------------ state

    @property
    def epoch(self) -> str:
        """The writer epoch to stamp records with: the term's epoch while leading."""
        if not self.enabled or self.core.term == 0:
            return self.process_epoch
        return term_epoch(self.core.term, self.process_epoch)

    def is_leader(self) -> bool:
        return not self.enabled or self.core.is_leader(self._now())

    def on_change(self, hook: RoleHook) -> None:
        self._hooks.append(hook)

    # ------------------------------------------------------------ one step

    async def step(self) -> None:
        """Send whatever is due (acquire or renew) and apply the outcome; never raises RedisError."""
        if not self.enabled:
            return
        now = self._now()
        action = self.core.due(now)
        if action is None:
            await self._notify()
            return
        try:
            if action is Action.ACQUIRE:
                term = int(await self.redis.eval(_ACQUIRE, 2, self.key, self.term_key,
                                                 self.token, self.core.config.ttl_ms, self.core.term))
                if term > 0:
                    self.core.acquired(term, now)
                    self.log.info("lease acquired", role=self.role, term=term, epoch=self.epoch)
                else:
                    self.core.not_acquired(now)
            else:
                ok = int(await self.redis.eval(_RENEW, 1, self.key, self.token,
                                               self.core.config.ttl_ms))
                if ok:
                    self.core.renewed(now)
                else:
                    self.log.warning("lease lost", role=self.role, term=self.core.term)
                    self.core.lost(self._now())
        except (RedisError, OSError) as exc:
            self.core.failed(self._now())
            self.log.warning("lease unconfirmed", role=self.role, error=str(exc).splitlines()[0],
                             leader=self.core.is_leader(self._now()))
        await self._notify()

    async def _notify(self) -> None:
        leading = self.is_leader()
        if leading != self._was_leader:
            self._was_leader = leading
            for hook in self._hooks:
                await hook(leading)

    # ------------------------------------------------------------ loop

    async def start(self) -> None:
        """Try once now (a lone instance leads from its first second), then keep the lease."""
        await self.step()
        if self.enabled:
            self._task = asyncio.create_task(self._run(), name=f"lease-{self.role}")
        else:
            await self._notify()

    async def _run(self) -> None:
        while True:
            reraise_if_cancelling()
            await wait_event(self._wake, max(0.01, self.core.wait_s(self._now())))
            self._wake.clear()
            try:
                await self.step()
            except Exception as exc:  # a failing hook must not stop the lease
                self.log.error("lease step failed", role=self.role, error=repr(exc))

    async def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release`` hand the lease over at once (compare-and-delete)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.enabled and release and self.core.role is Role.LEADER:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await within(self.redis.eval(_RELEASE, 1, self.key, self.token), 2.0)
        if self.enabled:
            self.core.released()
            await self._notify()

    # ------------------------------------------------------------ fenced writes

    async def write(self, sets: Sequence[tuple[str, str]], publishes: Sequence[tuple[str, str]] = ()) -> bool:
        """SET ``sets`` and PUBLISH ``publishes`` atomically iff this process holds the lease.

        Returns False (and steps down) when another process holds it; raises RedisError/OSError
        when Redis cannot be reached. Every key must carry the ``{tao}`` hash tag (Cluster).
        """
        if self.enabled and not self.is_leader():
            return False
        args: list[str | int] = [self.token if self.enabled else "", len(sets)]
        args += [value for _, value in sets]
        for channel, message in publishes:
            args += [channel, message]
        ok = int(await self.redis.eval(_WRITE, 1 + len(sets), self.key,
                                       *[key for key, _ in sets], *args))
        if not ok:
            self.log.warning("fenced write refused: lease held by another process", role=self.role,
                             term=self.core.term)
            self.core.lost(self._now())
            self._wake.set()
            await self._notify()
        return bool(ok)
