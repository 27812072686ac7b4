"""N routers on one Redis (``fleet`` on; docs/architecture.md#router-fleet): membership,
session ownership with fencing, forwarding to the owner, and fleet-wide admission slots.

- **Membership**: the router holds a member lease in ``keys.ROUTER_ALIVE`` (renewed every
  ttl/3, decided by the pure ``LeaseCore``) and registers its advertise URL and writer epoch in
  ``keys.ROUTER_MEMBERS`` / ``keys.ROUTER_EPOCHS``. Every (re)join after a lapse is a new term,
  so a new writer epoch. While the lease is not confirmed valid the router serves no session.
- **Ownership**: the first router to claim a session (``fleet.CLAIM``) owns it; a session whose
  owner is dead is taken over with a new fencing revision and restored from its
  ``SessionRecord``, but only by a *settled* router (a member for ``SETTLE_LEASES`` leases since
  it last joined: after a Redis outage every lease has lapsed, and the first router back must
  not take the others' sessions). Ownership is cached: a router that owns a session and kept its lease
  serves the session's requests without a Redis round trip. Session records are written only
  through ``fleet.FENCED_SESSIONS``, which checks the owner token: a deposed owner's late
  writes are refused (and the session is dropped locally).
- **Forwarding**: a request for a session that another live router owns is sent to that
  router's advertise URL with ``x-tao-forwarded`` (the loop guard: the receiver serves it or
  answers 503 ``x-tao-not-owner``, never forwards again) and the answer is streamed back
  unchanged. An unreachable owner is retried until its lease expires and the session is taken
  over.
- **Slots**: per tenant with a budget cap, the router holds an allotment of the cap in Redis
  (``fleet.SLOTS``; decisions in ``core/fleet.py``) and its core admits within it.

The lease and the pacing run on the wall monotonic clock (I/O pacing, not model time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog
from aiohttp import web
from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import reraise_if_cancelling, stop_tasks, wait_event, within
from services.common.core.lease import Action, LeaseConfig, LeaseCore, term_epoch
from services.common.fleet import ADOPT, CLAIM, FENCED_SESSIONS, JOIN, LEAVE, RENEW, SLOTS, demand_field
from services.router.core.fleet import local_caps, owner_token, slot_request, waiting_for_slot
from services.router.validation import RequestError, stream_error

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from services.router.core.state import RouterCore

#: the loop guard of a forwarded request (its value: the forwarding router's id)
FORWARDED = "x-tao-forwarded"
#: answered (with 503) by a router asked to serve a forwarded request for a session it does not own
NOT_OWNER = "x-tao-not-owner"
_REQUEST_HEADERS = ("authorization", "api-key", "x-session-id", "content-type", "traceparent", "tracestate")
_RESPONSE_HEADERS = ("content-type", "retry-after", "cache-control")
#: slot syncs per second while requests are held or another router waits (else 4 per second)
SLOT_SYNC_BUSY_S = 0.02
SLOT_SYNC_IDLE_S = 0.25
#: sessions adopted from dead routers per call (every member_ttl_s)
ADOPT_BATCH = 200
#: a claimed session that never came into being (its request was refused) is let go after this (wall s)
UNUSED_CLAIM_S = 10.0
#: a router takes sessions over from dead owners only after it has been a member this many member
#: leases since it last joined. After a Redis outage longer than a lease (a Cluster failover)
#: every router's lease has lapsed at once and every router rejoins; without the wait, the first
#: one back would take over the sessions of all the others, which are alive and about to rejoin
#: (the fleet fault suite's Redis master kill saw sessions dropped that way). A router that really
#: died stays dead past the wait; the survivors, members all along, take over at once.
SETTLE_LEASES = 2.0


class OwnerUnreachable(Exception):
    pass


@dataclass(frozen=True)
class Claim:
    """``owner`` None: this router owns the session (serve it); else the owner's id and URL;
    ``member`` False: this router is not a live fleet member right now (serve nothing)."""

    owner: str | None
    url: str = ""
    member: bool = True


class RouterFleet:
    def __init__(self, redis: aioredis.Redis, core: RouterCore, *, router_id: str, ttl_s: float,
                 process_epoch: str, log: structlog.stdlib.BoundLogger, tenant_header: str,
                 read_timeout_s: float, on_epoch: Callable[[str], None], on_caps: Callable[[], None],
                 on_takeover: Callable[[str, str], None], on_lost: Callable[[str], None],
                 on_unused: Callable[[str], None] = lambda _sid: None, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self.core = core
        self.rid = router_id or secrets.token_hex(6)
        self.lease = LeaseCore(LeaseConfig(ttl_s))
        self.process_epoch = process_epoch
        self.url = ""
        self.log = log.bind(router_id=self.rid)
        self._tenant_header = tenant_header.lower()
        self._read_timeout_s = read_timeout_s
        self._on_epoch = on_epoch
        self._on_caps = on_caps
        self._on_takeover = on_takeover
        self._on_lost = on_lost
        self._on_unused = on_unused
        self._now = monotonic
        #: session -> owner token (``"<rev> <rid>"``; '' for a single-turn session)
        self.owned: dict[str, str] = {}
        #: owned sessions confirmed under the current, continuously held lease
        self.verified: set[str] = set()
        self._claimed_at: dict[str, float] = {}
        #: ended sessions (-> owner token) whose fenced deletion is in the flush under way
        self._deleting: dict[str, str] = {}
        self.budget_caps: dict[str, int] | None = None
        self.allot: dict[str, int] = {}
        #: tenants whose allotment a slot call confirmed in the current term (``slot_request``)
        self._confirmed: set[str] = set()
        self._seen: dict[str, tuple[int, int, float]] = {}  # tenant -> (others, waiters, when)
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None
        self.takeovers = 0
        self.forwarded = 0
        #: when the current term began (monotonic s): takeovers wait until ``settled``
        self._joined_at = self._now()
        #: owner entries naming this router for sessions it does not hold, seen at the last sweep
        self._stale: dict[str, str] = {}

    # ------------------------------------------------------------------ membership

    @property
    def epoch(self) -> str:
        return term_epoch(self.lease.term, self.process_epoch) if self.lease.term else self.process_epoch

    def member(self) -> bool:
        return self.lease.is_leader(self._now())

    def settled(self) -> bool:
        """A member for ``SETTLE_LEASES`` leases since it last joined: it may take sessions over."""
        return self.member() and self._now() - self._joined_at >= SETTLE_LEASES * self.lease.config.ttl_s

    async def start(self) -> None:
        """Join (raises RedisError when Redis does not answer: the router cannot start)."""
        await self._join()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=None, connect=2.0, sock_read=self._read_timeout_s))
        self._tasks = [asyncio.create_task(self._member_loop(), name="router-fleet-member"),
                       asyncio.create_task(self._slots_loop(), name="router-fleet-slots"),
                       asyncio.create_task(self._adopt_loop(), name="router-fleet-adopt")]

    async def advertise(self, url: str) -> None:
        """Publish the URL other routers forward to (after the gateway listens)."""
        self.url = url
        await self._join()

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            for tenant in list(self.allot):
                await within(self._slots_call(tenant, 0, 0), 1.0)
            await within(self.redis.eval(LEAVE, 3, keys.ROUTER_ALIVE, keys.ROUTER_MEMBERS,
                                                   keys.ROUTER_EPOCHS, self.rid), 1.0)
        self.lease.released()
        if self._http is not None:
            await self._http.close()

    async def _join(self) -> None:
        sent = self._now()
        before = self.lease.term
        term = int(await self.redis.eval(JOIN, 5, keys.ROUTER_ALIVE, keys.ROUTER_MEMBERS, keys.ROUTER_EPOCHS,
                                          keys.term_key("router"), keys.DEMAND, self.rid, self.lease.config.ttl_ms, self.url,
                                          self.process_epoch, self.lease.term))
        self.lease.acquired(term, sent)
        if term != before:
            self._joined_at = sent
            self.verified.clear()
            self.allot.clear()  # Redis may still hold some under this id: confirmed again (slot_request)
            self._confirmed.clear()
            self.log.info("fleet member", term=term, epoch=self.epoch)
            self._on_epoch(self.epoch)

    async def _member_loop(self) -> None:
        while True:
            reraise_if_cancelling()
            await asyncio.sleep(max(0.005, self.lease.wait_s(self._now())))
            now = self._now()
            action = self.lease.due(now)
            try:
                if action is Action.ACQUIRE:
                    await self._join()
                elif action is Action.RENEW:
                    if int(await self.redis.eval(RENEW, 1, keys.ROUTER_ALIVE, self.rid, self.lease.config.ttl_ms)):
                        self.lease.renewed(now)
                    else:
                        self.log.warning("fleet member lease lapsed")
                        self.lease.lost(self._now())
            except (RedisError, OSError) as exc:
                reraise_if_cancelling()
                self.lease.failed(self._now())
                self.log.warning("fleet lease unconfirmed", error=str(exc).splitlines()[0])
            if not self.member():
                self.verified.clear()
                self._on_caps()

    # ------------------------------------------------------------------ ownership

    def owns(self, session_id: str) -> bool:
        """The hot path: this router serves the session now, no Redis round trip."""
        return session_id in self.verified and self.member()

    def local(self, session_id: str) -> None:
        """A single-turn session: no other router can name it, so it is this router's."""
        self.owned[session_id] = ""

    async def claim(self, session_id: str) -> Claim:
        """Who serves ``session_id`` (raises RedisError/OSError when Redis does not answer)."""
        if not self.member():
            return Claim(None, member=False)
        out = await self.redis.eval(CLAIM, 4, keys.SESSION_OWNERS, keys.ROUTER_ALIVE, keys.ROUTER_MEMBERS,
                                    keys.SESSIONS, session_id, self.rid, "1" if self.settled() else "0")
        kind = int(out[0])
        if kind < 0:
            return Claim(None, member=False)
        rev = int(out[1])
        if kind == 3:  # a dead owner, not ours to take yet: like an owner that does not answer
            return Claim(str(out[2]))
        if kind == 0:
            if session_id in self.owned:
                self.owned.pop(session_id, None)
                self.verified.discard(session_id)
                self._on_lost(session_id)
            member = _json(out[3] if len(out) > 3 else "")
            return Claim(str(out[2]), str(member.get("url", "")))
        self.owned[session_id] = owner_token(rev, self.rid)
        self.verified.add(session_id)
        self._claimed_at[session_id] = self._now()
        if kind == 2:
            record = str(out[2]) if len(out) > 2 else ""
            if record:
                self.takeovers += 1
                self.log.info("session taken over", session_id=session_id, rev=rev)
            self._on_takeover(session_id, record)
        return Claim(None)

    def queue_sessions(self, pipe: Any, sessions: dict[str, str], ended: list[str]) -> bool:
        """Queue the fenced write of session records (and the deletion of ended ones) under their
        owner tokens in ``pipe``; False when there is nothing to write. Its result goes to
        ``refused``."""
        args = self._session_args(sessions, ended)
        if args is None:
            return False
        pipe.eval(FENCED_SESSIONS, 2, keys.SESSIONS, keys.SESSION_OWNERS, *args)
        return True

    def _session_args(self, sessions: dict[str, str], ended: list[str]) -> list[str | int] | None:
        args: list[str | int] = [0]
        n = 0
        for sid, raw in sessions.items():
            tok = self.owned.get(sid)
            if tok is not None:
                args += [sid, tok, raw]
                n += 1
        args[0] = n
        gone = []
        self._deleting = {}
        for sid in ended:
            # the token is let go only once the deletion reached Redis (``ended_written``): a
            # flush that fails (Redis down, a Cluster failover) is retried and needs it, or the
            # record and owner entry stay behind for good (the fleet fault suite saw it)
            tok = self.owned.get(sid)
            self.verified.discard(sid)
            self._claimed_at.pop(sid, None)
            if tok is not None:
                args += [sid, tok]
                gone.append(sid)
                self._deleting[sid] = tok
        return None if n == 0 and not gone else args

    def ended_written(self) -> None:
        """The flush that carried the last ``queue_sessions`` succeeded: drop the tokens of the
        ended sessions it deleted (unless the session was claimed again meanwhile)."""
        for sid, tok in self._deleting.items():
            if self.owned.get(sid) == tok:
                del self.owned[sid]
        self._deleting = {}

    def refused(self, sids: Any) -> None:
        """The sessions whose fenced write was refused: another router owns them now."""
        for sid in sids or ():
            sid = str(sid)
            if self.owned.pop(sid, None) is not None:
                self.verified.discard(sid)
                self.log.warning("session record refused: owned by another router", session_id=sid)
                self._on_lost(sid)

    async def adopt(self) -> int:
        """Take over sessions whose owner died (even if no request for them comes); how many."""
        if not self.settled():
            return 0
        out = await self.redis.eval(ADOPT, 3, keys.SESSION_OWNERS, keys.ROUTER_ALIVE, keys.SESSIONS, self.rid,
                                    ADOPT_BATCH)
        now = self._now()
        for i in range(0, len(out) - 2, 3):
            sid, rev, record = str(out[i]), int(out[i + 1]), str(out[i + 2])
            self.owned[sid] = owner_token(rev, self.rid)
            self.verified.add(sid)
            self._claimed_at[sid] = now
            self.takeovers += 1
            self._on_takeover(sid, record)
        if out:
            self.log.info("adopted sessions of dead routers", count=len(out) // 3)
        return len(out) // 3

    def sweep(self, sessions: Container[str]) -> None:
        """Let go of claims that never became a session (their request was refused)."""
        now = self._now()
        for sid, at in list(self._claimed_at.items()):
            if sid in sessions:
                del self._claimed_at[sid]
            elif now - at > UNUSED_CLAIM_S and sid in self.owned:
                del self._claimed_at[sid]
                self._on_unused(sid)

    async def forget_stale(self) -> int:
        """Delete owner entries (and records) that name this router for sessions it does not hold.

        Redis Cluster replicates asynchronously: a session ended (its record and owner entry
        deleted) just before its master died can come back when the replica is promoted, and
        nothing would ever end it again. An entry counts as stale only when two sweeps one
        lease apart saw it with the same token (a claim whose answer is still on its way is
        not), and the deletion is fenced by that token. How many were deleted."""
        if not self.settled():
            return 0
        suffix = " " + self.rid
        entries = {str(sid): str(tok) for sid, tok in (await self.redis.hgetall(keys.SESSION_OWNERS)).items()}
        seen = {sid: tok for sid, tok in entries.items()
                if tok.endswith(suffix) and sid not in self.owned and sid not in self._deleting}
        confirmed = [sid for sid, tok in seen.items() if self._stale.get(sid) == tok]
        self._stale = {sid: tok for sid, tok in seen.items() if sid not in confirmed}
        if not confirmed:
            return 0
        args: list[str | int] = [0]
        for sid in confirmed:
            args += [sid, seen[sid]]
        refused = await self.redis.eval(FENCED_SESSIONS, 2, keys.SESSIONS, keys.SESSION_OWNERS, *args)
        self.log.warning("deleted stale session entries of this router (resurrected by a failover?)",
                         count=len(confirmed) - len(refused or ()))
        return len(confirmed) - len(refused or ())

    async def _adopt_loop(self) -> None:
        while True:
            reraise_if_cancelling()
            await asyncio.sleep(self.lease.config.ttl_s)
            try:
                await self.adopt()
                await self.forget_stale()
            except (RedisError, OSError) as exc:
                reraise_if_cancelling()
                self.log.warning("adopting sessions failed", error=str(exc).splitlines()[0])

    def demand_field(self, tenant: str) -> str:
        return demand_field(tenant, self.rid)

    # ------------------------------------------------------------------ forwarding

    async def route_existing(self, request: web.Request, session_id: str, body: bytes) -> web.StreamResponse | None:
        """``route`` for a request about a session that must already exist (release, explain):
        a session nobody owns is answered here (unknown), without claiming it."""
        try:
            if await self.redis.hget(keys.SESSION_OWNERS, session_id) is None:
                return None
        except (RedisError, OSError) as exc:
            return _unavailable(f"session ownership unknown: Redis did not answer ({str(exc).splitlines()[0]})")
        return await self.route(request, session_id, body)

    async def route(self, request: web.Request, session_id: str, body: bytes) -> web.StreamResponse | None:
        """None: serve the request here. Else the answer: the owner's (forwarded), or a 503."""
        forwarded = FORWARDED in request.headers
        deadline = self._now() + 2 * self.lease.config.ttl_s + 2.0
        while True:
            try:
                claim = await self.claim(session_id)
            except (RedisError, OSError) as exc:
                return _unavailable(f"session ownership unknown: Redis did not answer ({str(exc).splitlines()[0]})")
            if not claim.member:
                return _unavailable("this router is not a live fleet member right now")
            if claim.owner is None:
                return None
            if forwarded:  # the loop guard: never forward twice
                return _unavailable(f"session {session_id!r} is owned by router {claim.owner}", {NOT_OWNER: "1"})
            try:
                return await self._forward(request, body, claim)
            except OwnerUnreachable as exc:
                if self._now() > deadline:
                    return _unavailable(f"the owner of session {session_id!r} did not answer: {exc}")
                await asyncio.sleep(self.lease.config.ttl_s / 6)

    async def _forward(self, request: web.Request, body: bytes, claim: Claim) -> web.StreamResponse:
        if not claim.url or self._http is None:
            raise OwnerUnreachable(f"router {claim.owner} has no advertised URL yet")
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in _REQUEST_HEADERS or k.lower() == self._tenant_header}
        headers[FORWARDED] = self.rid
        try:
            upstream = await self._http.request(request.method, claim.url + request.path_qs, data=body,
                                                headers=headers)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise OwnerUnreachable(f"{claim.owner}: {exc!r}") from exc
        try:
            if upstream.status == 503 and upstream.headers.get(NOT_OWNER):
                raise OwnerUnreachable(f"{claim.owner} no longer owns the session")
            out = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items()
                if k.lower() in _RESPONSE_HEADERS or k.lower().startswith(("x-tao-", "x-ratelimit-"))})
            out.headers["x-tao-router"] = str(claim.owner)
            await out.prepare(request)
            self.forwarded += 1
            try:
                async for chunk in upstream.content.iter_any():
                    try:
                        await out.write(chunk)
                    except (ConnectionError, RuntimeError):
                        return out  # the client went away: closing the upstream aborts it at the owner
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                # the owner died mid-answer: a stream ends as a replica failure does (proxy.py), an
                # OpenAI-style error event and [DONE]; any other body just ends early
                if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await out.write(stream_error(f"router {claim.owner} failed mid-stream: {exc!r}"))
            with contextlib.suppress(ConnectionError, RuntimeError):
                await out.write_eof()
            return out
        finally:
            upstream.release()

    # ------------------------------------------------------------------ slots

    def set_budget_caps(self, caps: dict[str, int] | None) -> None:
        self.budget_caps = None if caps is None else dict(caps)
        self._on_caps()
        self._kick.set()

    def core_caps(self) -> dict[str, int] | None:
        """What the core may admit: the allotments (nothing for capped tenants while not a member)."""
        if self.budget_caps is None:
            return None
        return local_caps(self.budget_caps, self.allot if self.member() else {})

    def kick(self) -> None:
        self._kick.set()

    async def _slots_call(self, tenant: str, want: int, cap: int) -> tuple[int, int, int]:
        out = await self.redis.eval(SLOTS, 2, keys.slots_key(tenant), keys.ROUTER_ALIVE, self.rid, want, cap)
        return int(out[0]), int(out[1]), int(out[2])

    async def sync_slots(self) -> bool:
        """One pass over the capped tenants; True while something is held or contended."""
        caps = self.budget_caps
        busy = False
        if caps is None:
            return busy
        now = self._now()
        for tenant in set(caps) | set(self.allot):
            cap = caps.get(tenant, 0)
            in_flight = max(0, self.core.tenant_in_flight.get(tenant, 0))
            held = waiting_for_slot(self.core, tenant)
            cur = self.allot.get(tenant, 0)
            others, waiters, when = self._seen.get(tenant, (0, 0, -1e9))
            target = slot_request(in_flight, held, cur, cap, others, waiters, confirmed=tenant in self._confirmed,
                                  fresh=now - when < SLOT_SYNC_IDLE_S)
            if target is None:
                continue
            if target < cur:  # lower the core's cap first, then give the slots back
                self.allot[tenant] = target
                self._on_caps()
            self._confirmed.discard(tenant)  # until Redis answers (a failed call may have been applied)
            term = self.lease.term
            n, others, waiters = await self._slots_call(tenant, target, cap)
            if self.lease.term != term:  # rejoined meanwhile: Redis may have dropped what it answered
                continue  # (a dead router's slots): the tenant stays unconfirmed and is asked again
            if n > 0:
                self.allot[tenant] = n
            else:
                self.allot.pop(tenant, None)
            if n >= target:
                self._confirmed.add(tenant)
            self._seen[tenant] = (others, waiters, self._now())
            self._on_caps()
            busy = busy or held > 0 or waiters > 0
        return busy

    async def _slots_loop(self) -> None:
        busy = False
        while True:
            reraise_if_cancelling()
            await wait_event(self._kick, SLOT_SYNC_BUSY_S if busy else SLOT_SYNC_IDLE_S)
            self._kick.clear()
            try:
                busy = await self.sync_slots()
            except (RedisError, OSError) as exc:
                reraise_if_cancelling()
                self.log.warning("slot sync failed", error=str(exc).splitlines()[0])
                await asyncio.sleep(SLOT_SYNC_IDLE_S)


def _json(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _unavailable(message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = RequestError(503, message, code="service_unavailable", type_="server_error").body()
    return web.json_response(body, status=503, headers={"Retry-After": "1", **(headers or {})})
