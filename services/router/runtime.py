"""The router process: the core plus everything around it (replica registry, write-behind
store, plan and allocation feeds, local fallback, waiters of held requests).

All core calls happen on the event loop thread; only the fallback policy's ``plan`` runs
in a worker thread, on an immutable snapshot, and its plan is revalidated on return.

How other services' outputs are consumed:
- plans (planner): ``FencedFeed`` on ``keys.PLAN`` / ``keys.PLAN_CHANNEL``; fenced by the
  planner's live epoch and revision, then revalidated by the core (``core/plans.py``). The
  planner counts as alive while the newest plan of its live epoch was created within
  ``plan_stale_s``; otherwise ``fallback_policy`` plans locally every
  ``fallback_interval_s`` (and right after a request is held).
- caps (budget): ``FencedFeed`` on ``keys.ALLOCATION``; the last caps hold while the budget
  service is silent; before any allocation is seen every tenant is unlimited.
- predictions (predictor): read from ``keys.PREDICTIONS`` only to build the local fallback
  snapshot (readiness of pool sessions without a held request).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

import structlog
from redis.exceptions import RedisError

from services.common import keys
from services.common.aio import reraise_if_cancelling, stop_tasks, wait_event, within
from services.common.bootstrap import ServiceContext
from services.common.core.ratelimit import RateLimit
from services.common.epoch import RevisionCounter
from services.common.errors import DomainError
from services.common.records import (
    AllocationRecord,
    PlanRecord,
    PredictionRecord,
    RecordError,
    SessionRecord,
    load,
)
from services.planner.core.policy import Policy
from services.planner.core.registry import make_policy
from services.router.core.breaker import Breaker
from services.router.core.hold import PLAN, hold_kind
from services.router.core.model import Grant, NewRequest, PlanDecision, Usage
from services.router.core.plans import outcome_counts
from services.router.core.readiness import PredictionView, is_ready
from services.router.core.snapshot import build_snapshot
from services.router.core.state import (
    RouterCore,
    SessionBusy,
    UnknownSession,
    admission_hooks,
    core_config,
)
from services.router.core.tools import ToolCall
from services.router.feeds import FencedFeed
from services.router.fleet import RouterFleet
from services.router.kv_events import KvCredit, KvEventsCollector
from services.router.metrics import RouterMetrics
from services.router.replicas import ReplicaEntry, ReplicaRegistry, parse_replica_spec
from services.router.settings import Settings
from services.router.store import StateStore
from services.router.tool_events import ToolEvents
from services.router.upstream_pool import UpstreamPool

UPSTREAM_KEEPALIVE_S = 60.0  # idle keep-alive connections to replicas are closed after this (wall s)


class HoldTimeout(Exception):
    """A held request was not admitted within the hold timeout (``reason``: why, at that time)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class SessionReleased(Exception):
    """The session of a held request was released."""


@dataclass
class Waiter:
    future: asyncio.Future[Grant]
    tenant: str


class RouterRuntime:
    def __init__(self, settings: Settings, ctx: ServiceContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self.log: structlog.stdlib.BoundLogger = ctx.log
        self.clock = ctx.clock
        # model time (docs/architecture.md#model-time): now() and unix() both run time_scale
        # times faster than the wall
        self.unix_offset = self.clock.unix() - self.clock.now()
        self.policy: Policy = make_policy(settings.policy)
        self.fallback: Policy = make_policy(settings.fallback_policy or settings.policy)
        self.core = RouterCore(
            core_config(
                self.policy, settings.target_utilisation, ewma_alpha=settings.ewma_alpha,
                default_output_tokens=settings.default_output_tokens, session_ttl_s=settings.session_ttl_s,
                max_attempts=settings.max_attempts,
                # a fleet router's core sees only its own sessions, so it cannot tell that
                # nothing contends: its pool sessions wait for the planner, which sees them all
                **({"fast_admit": ""} if settings.fleet else {}),
            ),
            policy=self.policy,
            **admission_hooks(self.policy),
        )
        self.registry = ReplicaRegistry(
            self._replica_changed, self.clock.now, interval_s=settings.health_interval_s,
            timeout_s=settings.probe_timeout_s, default_kv_tokens=settings.replica_kv_capacity_tokens,
            breaker=Breaker(settings.breaker_failures, settings.breaker_open_s),
        )
        self.store = StateStore(
            ctx.redis, self.core, self.registry, ctx.epoch, self.to_unix, self.from_unix,
            flush_interval_s=settings.flush_interval_s, resync_interval_s=settings.resync_interval_s,
            demand_interval_s=settings.demand_interval_s, log=self.log,
        )
        self.plans = FencedFeed(ctx.redis, writer="planner", key=keys.PLAN, channel=keys.PLAN_CHANNEL,
                                record=PlanRecord, apply=self._apply_planner_plan, seen=self._plan_seen,
                                poll_s=settings.plan_poll_s, log=self.log)
        self.allocation = FencedFeed(ctx.redis, writer="budget", key=keys.ALLOCATION,
                                     channel=keys.ALLOCATION_CHANNEL, record=AllocationRecord,
                                     apply=self._apply_allocation, poll_s=settings.plan_poll_s, log=self.log)
        self.metrics = RouterMetrics(ctx.metrics, self)
        self.tool_events = ToolEvents(settings, self.clock.unix, ctx.metrics, self.log)
        self.models: frozenset[str] = frozenset()
        #: per model, the largest ``max_model_len`` of the healthy replicas serving it (None
        #: when one of them does not say); derived with ``models`` on every replica change
        self._max_model_len: dict[str, int | None] = {}
        self.upstream = UpstreamPool(
            connect_timeout_s=settings.upstream_connect_timeout_s, read_timeout_s=settings.upstream_read_timeout_s,
            max_connections=settings.upstream_max_connections, keepalive_s=UPSTREAM_KEEPALIVE_S,
        )
        #: headers of every upstream request (plus its X-Request-Id); the client's key is never among them
        self.upstream_headers: dict[str, str] = {"Content-Type": "application/json"}
        if settings.upstream_api_key is not None:
            self.upstream_headers["Authorization"] = f"Bearer {settings.upstream_api_key.get_secret_value()}"
        self.planner_fresh_s = -math.inf
        #: when the local fallback last completed a round (it runs while the planner is silent)
        self.fallback_fresh_s = -math.inf
        #: longest tool call seen (model s): a session's next request after its previous one ended
        self.longest_tool_s = 0.0
        self.last_plan: PlanRecord | None = None
        #: the rate limits the budget service publishes with its allocation (ConfigureTenants):
        #: ahead of this router's own (keys file, settings) for the tenants they name
        self.budget_limits: dict[str, RateLimit] = {}
        self.fallback_runs = 0
        #: kv_events credit from the replicas' KV-event publishers (None: none configured)
        self.kv: KvCredit | None = None
        if settings.kv_events:
            self.kv = KvCredit(self.core, settings.kv_events, now=self.now, base_url=self._replica_url,
                               headers=self.upstream_headers, wake=self.store.wake, refresh_s=settings.kv_refresh_s,
                               replay_timeout_s=settings.kv_replay_timeout_s, log=self.log,
                               credit=settings.kv_events_credit)
            ctx.metrics.register(KvEventsCollector(self.kv))
        #: N routers on one Redis (fleet.py); None: the sole router, as without it
        self.fleet: RouterFleet | None = None
        if settings.fleet:
            self.fleet = RouterFleet(
                ctx.redis, self.core, router_id=settings.router_id, ttl_s=settings.member_ttl_s,
                process_epoch=ctx.epoch, log=self.log, tenant_header=settings.dev_tenant_header,
                read_timeout_s=settings.upstream_read_timeout_s, on_epoch=self._fleet_epoch,
                on_caps=self._fleet_caps, on_takeover=self._take_over, on_lost=self._lost_session,
                on_unused=self.store.forget)
            self.store.fleet = self.fleet
        self._waiters: dict[str, Waiter] = {}
        self._fallback_kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ clocks

    def now(self) -> float:
        return self.clock.now()

    def wall(self, model_s: float) -> float:
        """Wall seconds of a model-time duration (for sleeps and wall-time metrics)."""
        return self.clock.wall_seconds(model_s)

    def to_unix(self, now_s: float) -> float:
        return now_s + self.unix_offset

    def from_unix(self, unix_s: float) -> float:
        return unix_s - self.unix_offset

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        s = self.settings
        await self.upstream.start()
        await self.tool_events.start()
        sessions, replica_records = await self.store.restore(self.now())
        if self.fleet is not None:
            sessions = []  # each is restored by the router that takes it over (_take_over)
            await self.fleet.start()
        for spec in s.replicas:
            rid, url = parse_replica_spec(spec)
            self.registry.add(rid, url)
        for rec in replica_records:
            if rec.replica_id not in self.registry.entries:
                with contextlib.suppress(DomainError):  # a record that no longer makes sense
                    self.registry.add(rec.replica_id, rec.url)
            entry = self.registry.entries.get(rec.replica_id)
            if entry is not None and rec.draining and entry.url == rec.url:
                self.registry.drain(rec.replica_id)
        self.core.restore(sessions)
        if sessions:
            self.log.info("restored sessions", count=len(sessions))
        await self.registry.start()
        for rid, rep in list(self.core.replicas.items()):
            if not rep.healthy:  # restored sessions must not stay admitted on a replica that is down
                self.core.replica_down(rid, self.now())
        await self.allocation.start()
        await self.plans.start()
        self.store.start(self.now)
        self.store.mark_all()
        self._tasks = [asyncio.create_task(self._housekeeping(), name="router-housekeeping")]
        if self.kv is not None:
            await self.kv.start()
        if self.core.config.gating:
            self._tasks.append(asyncio.create_task(self._fallback_loop(), name="router-fallback"))

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        if self.kv is not None:
            await self.kv.stop()
        await self.plans.stop()
        await self.allocation.stop()
        await self.registry.stop()
        await self.store.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        for w in self._waiters.values():
            if not w.future.done():
                w.future.set_exception(HoldTimeout())
        await self.upstream.close()
        await self.tool_events.close()

    # ------------------------------------------------------------------ requests

    def submit(self, req: NewRequest) -> Grant | asyncio.Future[Grant]:
        """Admit a request: its grant now, or a future resolved when it may go."""
        self.tool_events.next_request(req.session_id)  # it carries the results of its last answer's tools
        s = self.core.sessions.get(req.session_id)
        if s is not None and s.in_flight == 0 and s.held == 0 and s.acting_since_s is not None:
            self.longest_tool_s = max(self.longest_tool_s, self.now() - s.acting_since_s)
        grant = self.core.arrive(self.now(), req)
        self.store.wake()
        if grant is not None:
            return grant
        return self._wait(req.request_id, req.tenant)

    def _wait(self, request_id: str, tenant: str) -> asyncio.Future[Grant]:
        fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = Waiter(fut, tenant)
        if self.core.config.gating:
            self._fallback_kick.set()
        if self.fleet is not None:
            self.fleet.kick()  # it may need more admission slots
        return fut

    def plans_live(self) -> bool:
        """A plan decides admission now: the planner's is fresh, or the local fallback ran."""
        return self.now() - max(self.planner_fresh_s, self.fallback_fresh_s) <= self.settings.plan_stale_s

    def plan_hold_bound_s(self) -> float:
        """How long the plan may keep a request waiting (model s): ``plan_hold_timeout_s``, or
        ``plan_hold_tool_factor`` x the longest tool call seen, or ``hold_timeout_s``: the longest."""
        s = self.settings
        return max(s.plan_hold_timeout_s, s.hold_timeout_s, s.plan_hold_tool_factor * self.longest_tool_s)

    async def wait_grant(self, request_id: str, fut: asyncio.Future[Grant], since_s: float) -> Grant:
        """Wait for a held request's grant (held since ``since_s``, router clock). A request the
        plan keeps waiting on purpose (``core.hold.PLAN``) waits up to ``plan_hold_bound_s``;
        one that nothing can serve (``STUCK``) gets ``HoldTimeout`` once it has been held
        ``hold_timeout_s`` without the plan holding it (checked at that deadline, then every
        quarter of it). On timeout or cancellation (client gone) the request is abandoned, or
        its grant handed back."""
        short = self.settings.hold_timeout_s
        last_plan = since_s  # last time the plan was seen holding it on purpose
        check_at = since_s + short
        while True:
            bound_at = since_s + self.plan_hold_bound_s()
            try:
                done, _ = await asyncio.wait({fut}, timeout=self.wall(max(0.0, min(check_at, bound_at) - self.now())))
            except BaseException:
                self._give_up(request_id, fut)
                raise
            if done:
                return fut.result()
            now = self.now()
            kind, why = hold_kind(self.core, request_id, self.plans_live())
            if kind == PLAN:
                last_plan = now
            if now >= since_s + self.plan_hold_bound_s() - 1e-9:
                reason = f"held by the plan past its bound ({why}): {self._explain(request_id)}"
            elif now - last_plan >= short - 1e-9:
                reason = f"{why}: {self._explain(request_id)}"
            else:
                check_at = now + short / 4 if kind == PLAN else last_plan + short
                continue
            self._give_up(request_id, fut)
            raise HoldTimeout(reason)

    def _explain(self, request_id: str) -> str:
        held = self.core.held.get(request_id)
        return self.core.explain(held.session_id) if held else ""

    def _give_up(self, request_id: str, fut: asyncio.Future[Grant]) -> None:
        self._waiters.pop(request_id, None)
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self.core.finish(self.now(), request_id, None)  # granted but never forwarded
        else:
            fut.cancel()
            self.core.abandon(self.now(), request_id)
        self.store.wake()
        self.pump()

    def pump(self, tenant: str | None = None) -> None:
        """Grant what may go now and wake the waiters (``tenant``: only its slot was freed)."""
        grants = self.core.dispatch(self.now(), tenant)
        for g in grants:
            w = self._waiters.pop(g.request_id, None)
            if w is not None and not w.future.done():
                w.future.set_result(g)
            else:  # nobody waits any more: the request ends unforwarded, its slot comes back
                self.core.finish(self.now(), g.request_id, None)
        if grants:
            self.store.wake()

    def first_token(self, request_id: str, ttft_s: float) -> None:
        self.core.first_token(request_id, ttft_s)

    def finish(self, request_id: str, tenant: str, usage: Usage | None, duration_s: float) -> None:
        now = self.now()
        flight = self.core.in_flight.get(request_id)
        self.core.finish(now, request_id, usage)
        # the slot hold, admission to end (the budget's lending horizon); the caller read its
        # clock for the latency a moment earlier, and a slot is never held longer than that
        hold = None if flight is None else min(duration_s, max(0.0, now - flight.started_s))
        self.store.record_latency(tenant, duration_s, hold)
        self.store.wake()
        self.pump(tenant)

    def _replica_url(self, replica_id: str) -> str | None:
        entry = self.registry.entries.get(replica_id)
        return None if entry is None else entry.url

    def learn_prompt(self, session_id: str, replica_id: str, path: str, body: bytes) -> None:
        """A request succeeded on ``replica_id``: with KV events there, learn its prompt's blocks."""
        if self.kv is not None and session_id in self.core.sessions:
            self.kv.learn(session_id, replica_id, path, body)

    def tool_calls(self, session_id: str, calls: tuple[ToolCall, ...]) -> None:
        """The answer that just finished called ``calls`` (``core/tools.py``): the session
        acts (``finish`` made it ACTING) and the predictor hears what it runs."""
        self.tool_events.started(session_id, calls, self.core.sessions.__contains__)

    def retry(self, request_id: str, tenant: str, replica_down: bool) -> asyncio.Future[Grant] | None:
        """After a failure before the first byte: a future for the next attempt, or None."""
        again = self.core.fail_before_first_byte(self.now(), request_id, replica_down)
        self.store.wake()
        if not again:
            self.pump()
            return None
        fut = self._wait(request_id, tenant)
        self.pump()
        return fut

    def release(self, session_id: str, force: bool) -> None:
        """End a session (raises the core's UnknownSession / SessionBusy)."""
        cancelled = self.core.release(self.now(), session_id, force)
        self.tool_events.ended(session_id)
        for rid in cancelled:
            w = self._waiters.pop(rid, None)
            if w is not None and not w.future.done():
                w.future.set_exception(SessionReleased())
        self.store.wake()
        self.pump()

    # ------------------------------------------------------------------ replicas

    def _replica_changed(self, entry: ReplicaEntry) -> None:
        self.core.upsert_replica(entry.view(), self.now())
        self.models = frozenset(m for e in self.registry.entries.values() for m in e.models)
        self._max_model_len = _context_limits(self.registry.entries.values())
        self.store.wake()
        self.pump()

    def replica_failed(self, replica_id: str, reason: str) -> bool:
        down = self.registry.report_failure(replica_id, reason)
        self.metrics.upstream_failures.labels(replica_id).inc()
        return down

    # ------------------------------------------------------------------ plans and caps

    def max_model_len(self, model: str) -> int | None:
        """The largest context any healthy replica serving ``model`` accepts (vLLM's model card
        ``max_model_len``); None when a serving replica does not say (then nothing is judged)."""
        return self._max_model_len.get(model)

    def drop_if_unused(self, session_id: str) -> None:
        """A replica refused (4xx) the request that created this session: the session never
        completed a request and has nothing held or in flight, so it ends now rather than
        lingering until its TTL (bad input changes no state)."""
        s = self.core.sessions.get(session_id)
        if s is None or s.single_turn or s.tokens.requests or s.in_flight or s.held:
            return
        with contextlib.suppress(UnknownSession, SessionBusy):
            self.release(session_id, force=False)

    def planner_silent(self) -> bool:
        return self.now() - self.planner_fresh_s > self.settings.plan_stale_s

    def _plan_seen(self, rec: PlanRecord) -> None:
        created_s = self.from_unix(rec.created_at_unix_s)
        self.planner_fresh_s = max(self.planner_fresh_s, min(created_s, self.now()))

    def _apply_planner_plan(self, rec: PlanRecord) -> None:
        self.last_plan = rec
        decision = PlanDecision(
            assignments=tuple((a.session, a.replica) for a in rec.assignments), pauses=tuple(rec.pauses),
            snapshot_at_s=self.from_unix(rec.snapshot_at_unix_s), source=f"planner rev {rec.rev}",
        )
        now = self.now()
        report = self.core.apply_plan(now, decision)
        self.metrics.plans.labels("planner").inc()
        self.metrics.plan_age.observe(max(0.0, now - decision.snapshot_at_s))
        for outcome, n in outcome_counts(report).items():
            self.metrics.plan_parts.labels(outcome).inc(n)
        if report.admitted or report.paused or report.pause_deferred:
            self.store.wake()
            self.pump()

    def _apply_allocation(self, rec: AllocationRecord) -> None:
        self.budget_limits = dict(rec.rate_limits)
        if self.fleet is not None:
            self.fleet.set_budget_caps(rec.caps)  # the core admits within its slots (_fleet_caps)
            return
        self.core.set_caps(rec.caps, rec.limits)
        self.store.wake()
        self.pump()

    # ------------------------------------------------------------------ fleet

    def _fleet_epoch(self, epoch: str) -> None:
        """A new member term: everything is written again under its writer epoch."""
        self.store.revisions = RevisionCounter(epoch)
        self.store.mark_all()

    def _fleet_caps(self) -> None:
        """The slots this router holds changed: they are its core's caps (limits = caps: no
        lending across tenants, whose vacated slots may be another router's)."""
        assert self.fleet is not None
        caps = self.fleet.core_caps()
        if caps != self.core.caps:
            self.core.set_caps(caps, caps)
            self.pump()

    def _take_over(self, session_id: str, raw: str) -> None:
        """This router now owns ``session_id``: adopt its last record (a dead owner's session; it
        replaces an idle stale copy this router kept from before it lost the session)."""
        mine = self.core.sessions.get(session_id)
        if not raw or (mine is not None and (mine.in_flight or mine.held)):
            return  # nothing recorded, or this router's own state is running (and newer)
        try:
            self.core.restore([self.store.session_from_record(load(SessionRecord, raw))])
        except RecordError as exc:
            self.log.warning("unreadable session record at takeover", session_id=session_id, error=str(exc))
            return
        rep = self.core.sessions[session_id].replica
        if rep is not None and not self.core.replicas[rep].healthy:
            self.core.replica_down(rep, self.now())
        self.store.wake()

    def _lost_session(self, session_id: str) -> None:
        """Another router owns ``session_id`` now: forget it here (unless a request still runs)."""
        s = self.core.sessions.get(session_id)
        if s is not None and s.in_flight == 0:
            with contextlib.suppress(UnknownSession, SessionBusy):
                self.release(session_id, force=False)

    async def _fallback_loop(self) -> None:
        while True:
            reraise_if_cancelling()
            await wait_event(self._fallback_kick, self.wall(self.settings.fallback_interval_s))
            self._fallback_kick.clear()
            await asyncio.sleep(0.002)  # gather a burst of arrivals into one plan
            if not self.planner_silent():
                continue
            try:
                await self.run_fallback()
            except Exception as exc:  # a policy bug must not stop admission for good
                reraise_if_cancelling()
                self.log.error("fallback policy failed", error=repr(exc))
                await asyncio.sleep(self.wall(self.settings.fallback_interval_s))

    async def run_fallback(self) -> None:
        core = self.core
        pool = [s for s in core.sessions.values() if not s.admitted and s.in_flight == 0]
        over = any(core.used.get(r, 0) > core.capacity(r) for r in core.replicas)
        if not pool and not over:
            self.fallback_fresh_s = self.now()
            return
        readiness = await self._readiness([s.id for s in pool if s.held == 0])
        now = self.now()
        snapshot = build_snapshot(core, now, readiness)
        plan = await asyncio.get_running_loop().run_in_executor(None, self.fallback.plan, snapshot)
        decision = PlanDecision(tuple((a.session, a.replica) for a in plan.assignments), plan.pauses, now,
                                f"fallback {self.fallback.name}")
        core.apply_plan(self.now(), decision)
        self.fallback_fresh_s = self.now()
        self.fallback_runs += 1
        self.metrics.plans.labels("fallback").inc()
        self.store.wake()
        self.pump()

    async def _readiness(self, session_ids: list[str]) -> dict[str, bool]:
        if not session_ids:
            return {}
        try:
            # bounded: a slow or absent Redis must not delay admission (readiness then
            # comes only from held requests, as when the predictor is down)
            raws = await within(self.ctx.redis.hmget(keys.PREDICTIONS, session_ids[:5000]), 0.1)
        except (TimeoutError, RedisError, OSError):
            reraise_if_cancelling()
            return {}
        now_unix = self.clock.unix()
        out = {}
        for sid, raw in zip(session_ids, raws, strict=False):
            if raw is None:
                continue
            try:
                p = load(PredictionRecord, raw)
            except RecordError:
                continue
            s = self.core.sessions.get(sid)
            acting = None if s is None or s.acting_since_s is None else self.to_unix(s.acting_since_s)
            view = PredictionView(p.ready, p.started_at_unix_s, p.refreshed_at_unix_s, p.predicted_return_unix_s,
                                  p.deadline_unix_s)
            out[sid] = is_ready(view, now_unix, acting)
        return out

    async def _housekeeping(self) -> None:
        while True:
            reraise_if_cancelling()
            await asyncio.sleep(1.0)
            if self.core.expire(self.now()):
                self.store.wake()
            if self.fleet is not None:
                self.fleet.sweep(self.core.sessions)


def _context_limits(entries: Iterable[ReplicaEntry]) -> dict[str, int | None]:
    """Per model: the largest ``max_model_len`` on the healthy replicas serving it, or None as
    soon as one of them has no valid value."""
    out: dict[str, int | None] = {}
    for entry in entries:
        if not entry.view().healthy:
            continue
        for card in entry.model_cards:
            model = str(card.get("id"))
            n = card.get("max_model_len")
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                out[model] = None
            elif model not in out or out[model] is not None:
                out[model] = max(n, out.get(model) or 0)
    return out
