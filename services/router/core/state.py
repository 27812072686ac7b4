"""The router's live state and its transitions (pure: no I/O, time passed in).

``RouterCore`` owns sessions, replicas, held and in-flight requests and tenant slots. Every
event method updates the state and returns what the adapter must do (grants, cancelled
requests); ``take_dirty`` hands the write-behind store what changed.

Invariants (checked by the unit tests after every event):
- ``used[n]`` = Σ footprint of sessions admitted on n;
- a request is either held or in flight, never both; tenant and session counters match;
- a request is granted only when its session is admitted on a healthy replica that serves
  the request's model (gating
  policies: by a plan; per-request policies: routed at once) and its tenant has a free slot
  (budget `may_admit`: below its limit and within its cap or a vacated donor slot; no caps
  known -> unlimited; a tenant absent from the caps -> unlimited);
- nothing in flight is ever preempted: pauses of RUNNING sessions wait for request end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypedDict

from services.budget.core.model import may_admit
from services.common.core.evidence import last_used_replica
from services.common.vocabulary import Phase
from services.planner.core.model import Snapshot
from services.planner.core.policy import Policy
from services.planner.core.thunderagent import select_backend_for_new_program
from services.router.core import plans
from services.router.core.cache import decayed_credit, drop_replica, observe_kv, observe_usage
from services.router.core.footprint import footprint_tokens, observe_request
from services.router.core.model import (
    ApplyReport,
    CoreConfig,
    Dirty,
    Grant,
    HeldRequest,
    InFlight,
    NewRequest,
    PlanDecision,
    Replica,
    Session,
    Usage,
    phase_of,
)
from services.router.core.snapshot import build_snapshot


class AdmissionHooks(TypedDict):
    """``RouterCore``'s gating-only arguments as a policy carries them (``admission_hooks``)."""

    hold_limit: Callable[[int], float] | None
    over_capacity: float
    force_admit_after_s: float | None


def admission_hooks(policy: Policy) -> AdmissionHooks:
    """The admission rules a gating policy hands to the router core, for ``RouterCore(...,
    **admission_hooks(policy))``: ``hold_limit`` and ``over_capacity`` (``tao-overcommit``),
    ``force_admit_after_s`` (ThunderAgent's force-resume); none for a per-request policy or a
    policy without them."""
    gates = policy.gates_admission
    return AdmissionHooks(
        hold_limit=getattr(policy, "hold_limit", None) if gates else None,
        over_capacity=float(getattr(policy, "over_capacity", 1.0)) if gates else 1.0,
        force_admit_after_s=getattr(policy, "force_admit_after_s", None) if gates else None,
    )


class PolicyFlags(TypedDict):
    gating: bool
    sticky: bool
    fast_admit: str
    lend: bool
    drop_resumed_reclaims: bool
    share_prefixes_below_tokens: int
    accounting: str


def policy_flags(policy: Policy) -> PolicyFlags:
    """The ``CoreConfig`` fields a policy decides (``core_config`` puts them in): gating and stickiness, and
    the optional attributes ``fast_admit``, ``lend``, ``reclaims_between_requests`` (default
    False; it sets ``drop_resumed_reclaims``), ``shares_prefixes_below_tokens`` (0 when absent)
    and ``accounting`` ("reservation" when absent)."""
    return PolicyFlags(
        gating=bool(policy.gates_admission), sticky=bool(policy.sticky),
        fast_admit=str(getattr(policy, "fast_admit", "") or ""), lend=bool(getattr(policy, "lend", False)),
        drop_resumed_reclaims=bool(getattr(policy, "reclaims_between_requests", False)),
        share_prefixes_below_tokens=int(getattr(policy, "shares_prefixes_below_tokens", 0) or 0)
        if policy.gates_admission else 0,
        accounting=str(getattr(policy, "accounting", "") or "reservation"),
    )


def admissible_fraction(policy: Policy, configured: float) -> float:
    """``CoreConfig.target_utilisation`` for ``policy``: the deployment's ``configured`` fraction
    of each replica's KV tokens, unless the policy names its own (``kv_utilisation``: ThunderAgent
    counts the whole of vLLM's ``num_gpu_blocks × block_size``)."""
    own = getattr(policy, "kv_utilisation", None)
    return configured if own is None else float(own)


def core_config(policy: Policy, target_utilisation: float, **deployment: Any) -> CoreConfig:
    """The router core's config for ``policy`` (the router's runtime and the simulator build it
    alike): the policy's flags (``policy_flags``), the admissible fraction it counts against
    (``admissible_fraction`` of the deployment's ``target_utilisation``), and the deployment's
    other ``CoreConfig`` fields, which may override a flag (a router fleet turns ``fast_admit``
    off)."""
    return replace(CoreConfig(**policy_flags(policy)),
                   target_utilisation=admissible_fraction(policy, target_utilisation), **deployment)


class SessionConflict(ValueError):
    """The session id belongs to another tenant."""


class UnknownSession(LookupError):
    pass


class SessionBusy(RuntimeError):
    """A request of the session is in flight and the release was not forced."""


class RouterCore:
    def __init__(self, config: CoreConfig, policy: Policy | None = None,
                 hold_limit: Callable[[int], float] | None = None, over_capacity: float = 1.0,
                 force_admit_after_s: float | None = None) -> None:
        """``policy`` routes requests when ``config.gating`` is False (a per-request policy).
        ``hold_limit`` (gating only; a policy's ``hold_limit``, e.g. ``tao-overcommit``): seconds a
        held request of a pool session with a prompt of that many tokens may wait before
        ``dispatch`` admits its session over capacity (``_admit_over_capacity``), on a replica
        whose admitted footprints stay within ``over_capacity`` × its capacity.
        ``force_admit_after_s`` (gating only; a policy's ``force_admit_after_s``, ThunderAgent's
        force-resume): a held request of a pool session that has waited this long is admitted
        whatever the capacity (``_force_admit``)."""
        if over_capacity < 1.0:
            raise ValueError(f"over_capacity must be >= 1, got {over_capacity}")
        if not config.gating and policy is None:
            raise ValueError("a per-request (non-gating) router needs its policy")
        self.config = config
        self.policy = policy
        self.sessions: dict[str, Session] = {}
        self.replicas: dict[str, Replica] = {}
        self.used: dict[str, int] = {}
        #: session -> (replica, tokens it adds to ``used`` there, prefix key, shared tokens)
        self._contrib: dict[str, tuple[str, int, str, int] | None] = {}
        #: ``CoreConfig.share_prefixes_below_tokens``: per (replica, prefix key) held there, its
        #: admitted sessions, and the tokens of the one copy the replica's ``used`` counts
        self._prefix_refs: dict[tuple[str, str], int] = {}
        self._prefix_held: dict[tuple[str, str], int] = {}
        self._usable_ids: frozenset[str] = frozenset()
        self._pool: set[str] = set()  # sessions not admitted (gating: waiting for a plan, or paused)
        self.held: dict[str, HeldRequest] = {}  # insertion order is arrival order (FIFO)
        self._held_by_tenant: dict[str, dict[str, HeldRequest]] = {}  # the same, per tenant
        self.in_flight: dict[str, InFlight] = {}
        self.tenant_in_flight: dict[str, int] = {}
        self.replica_in_flight: dict[str, int] = {}
        self.tenant_held: dict[str, int] = {}
        self.caps: dict[str, int] | None = None
        self.limits: dict[str, int] | None = None
        self.last_reject: dict[str, str] = {}
        #: pool sessions admitted by ``CoreConfig.fast_admit`` (not by a plan)
        self.fast_admits = 0
        self.hold_limit = hold_limit
        self.over_capacity = over_capacity
        #: pool sessions admitted over capacity because their hold outlasted ``hold_limit``
        self.over_capacity_admits = 0
        self.force_admit_after_s = force_admit_after_s
        #: pool sessions admitted whatever the capacity after ``force_admit_after_s``
        self.force_admits = 0
        self._d_sessions: set[str] = set()
        self._d_ended: set[str] = set()
        self._d_tenants: set[str] = set()
        self._d_replicas: set[str] = set()
        self._d_pool: set[str] = set()
        #: admissible tokens of the roomiest usable replica (kept by ``_replicas_changed``)
        self._largest_capacity = 0
        #: the same per served model name (a session is clamped to what its model's replicas hold)
        self._largest_by_model: dict[str, int] = {}

    # ------------------------------------------------------------------ bookkeeping helpers

    def _put(self, s: Session, pool_changed: bool = False) -> None:
        """Store ``s`` (new or changed in place) and keep ``used`` and the dirty sets right."""
        s.footprint_tokens = footprint_tokens(s, self.config)
        # A session bigger than every replica's admissible capacity (a context near
        # max_model_len on a replica whose KV barely holds it) would never be admitted: it
        # counts as one whole replica, the most it can occupy (the engine preempts or
        # queues the rest, as vLLM does for any request that fits its max_model_len).
        largest = self._largest_by_model.get(s.model, self._largest_capacity) if s.model else self._largest_capacity
        if 0 < largest < s.footprint_tokens:
            s.footprint_tokens = largest
        shared = 0
        if self.config.share_prefixes_below_tokens and s.prefix_key and (
                not s.admitted or s.replica is None or self._shares(s.replica)):
            shared = min(s.prefix_tokens, s.footprint_tokens, s.tokens.last_prompt_tokens or s.footprint_tokens)
        s.shared_tokens = shared
        known = s.id in self._contrib
        old = self._contrib.get(s.id)
        new = ((s.replica, s.footprint_tokens - shared, s.prefix_key, shared)
               if s.admitted and s.replica is not None else None)
        moved: list[str] = []  # prefix keys whose copies changed replicas
        if old != new:
            if new is not None:  # the new share first: a session that stays keeps the copy
                self.used[new[0]] = self.used.get(new[0], 0) + new[1]
                self._d_replicas.add(new[0])
                if new[3] and self._hold_prefix(new[0], new[2], new[3]):
                    moved.append(new[2])
            if old is not None and self._uncount(old):
                moved.append(old[2])
        self._contrib[s.id] = new
        if shared and (s.admitted or self._prefix_everywhere(s)):
            s.footprint_tokens -= shared  # its copy is held where it is, or would be
        if s.admitted:
            self._pool.discard(s.id)
        else:
            self._pool.add(s.id)
        self.sessions[s.id] = s
        self._d_sessions.add(s.id)
        self._d_ended.discard(s.id)
        if pool_changed or not known or (old is None) != (new is None):
            self._d_pool.add(s.id)
        for key in moved:
            self._prefix_moved(key)

    def _end(self, session_id: str) -> Session | None:
        old = self.sessions.pop(session_id, None)
        if old is None:
            return None
        contrib = self._contrib.pop(session_id, None)
        self._pool.discard(session_id)
        if contrib is not None and self._uncount(contrib):
            self._prefix_moved(contrib[2])
        self._d_sessions.discard(session_id)
        self._d_ended.add(session_id)
        self._d_pool.add(session_id)
        self.last_reject.pop(session_id, None)
        return old

    def _uncount(self, contrib: tuple[str, int, str, int]) -> bool:
        """Take a session's contribution (``_contrib``) out of its replica's ``used``. True when
        its shared prefix's copy left the replica with it (the last session there holding it)."""
        rid, tokens, key, shared = contrib
        self.used[rid] = self.used.get(rid, 0) - tokens
        self._d_replicas.add(rid)
        return bool(shared) and self._release_prefix(rid, key)

    def _hold_prefix(self, rid: str, key: str, tokens: int) -> bool:
        """An admitted session of prefix ``key`` joins replica ``rid``: the first one there adds
        the shared copy (``tokens``) to its ``used``. True when the copy is new there."""
        n = self._prefix_refs.get((rid, key), 0)
        self._prefix_refs[(rid, key)] = n + 1
        if n == 0:
            self._prefix_held[(rid, key)] = tokens
            self.used[rid] = self.used.get(rid, 0) + tokens
        return n == 0

    def _release_prefix(self, rid: str, key: str) -> bool:
        """An admitted session of prefix ``key`` leaves ``rid``: the last one there takes the copy
        along. True when it did."""
        n = self._prefix_refs.pop((rid, key), 0) - 1
        if n > 0:
            self._prefix_refs[(rid, key)] = n
            return False
        self.used[rid] = self.used.get(rid, 0) - self._prefix_held.pop((rid, key), 0)
        return True

    def _shares(self, rid: str) -> bool:
        """Replica ``rid`` reserves a shared prefix once (``CoreConfig.share_prefixes_below_tokens``)."""
        rep = self.replicas.get(rid)
        return rep is not None and 0 < rep.kv_capacity_tokens <= self.config.share_prefixes_below_tokens

    def _prefix_everywhere(self, s: Session) -> bool:
        """Every replica pool session ``s`` may go to shares prefixes and holds its prefix's copy
        already, so admitting it adds only its footprint less the shared part."""
        takes = [rid for rid, rep in self.replicas.items() if self._can_take(rep, s)]
        return bool(takes) and all((rid, s.prefix_key) in self._prefix_held and self._shares(rid) for rid in takes)

    def _prefix_moved(self, key: str) -> None:
        """Which replicas hold ``key``'s copy changed: re-price the pool sessions sharing it."""
        for sid in [sid for sid in self._pool if self.sessions[sid].prefix_key == key]:
            self._put(self.sessions[sid])

    def _reprice_prefix_pool(self) -> None:
        """Which replicas share, or which a pool session may go to, changed: re-price the pool
        sessions whose prefix has a copy held anywhere (one pass over the pool)."""
        held = {key for _, key in self._prefix_held}
        for sid in [sid for sid in self._pool if self.sessions[sid].prefix_key in held]:
            self._put(self.sessions[sid])

    def _bump(self, counter: dict[str, int], tenant: str, delta: int) -> None:
        counter[tenant] = counter.get(tenant, 0) + delta
        self._d_tenants.add(tenant)

    def _unadmit(self, s: Session, now_s: float, avoid: str | None = None) -> Session:
        self._unadmit_in_place(s, now_s, avoid)
        return s

    @staticmethod
    def _unadmit_in_place(s: Session, now_s: float, avoid: str | None = None) -> None:
        s.admitted = False
        s.replica = None
        s.pause_pending = False
        s.placed_s = now_s
        if avoid:
            s.avoid = s.avoid | {avoid}

    def capacity(self, replica_id: str) -> int:
        rep = self.replicas.get(replica_id)
        return 0 if rep is None else rep.capacity_tokens(self.config.target_utilisation)

    def eligible(self, rep: Replica) -> bool:
        """May receive new sessions: gating needs a known capacity, per-request routing does not."""
        return rep.usable if self.config.gating else rep.healthy and not rep.draining

    def phase(self, s: Session) -> Phase:
        return phase_of(s, self.config.gating)

    @property
    def pool_dirty(self) -> bool:
        """The pool changed since the last ``take_dirty`` (the planner should hear soon)."""
        return bool(self._d_pool)

    def take_dirty(self) -> Dirty:
        d = Dirty(frozenset(self._d_sessions), frozenset(self._d_ended), frozenset(self._d_tenants),
                  frozenset(self._d_replicas), frozenset(self._d_pool))
        self._d_sessions, self._d_ended, self._d_tenants = set(), set(), set()
        self._d_replicas, self._d_pool = set(), set()
        return d

    # ------------------------------------------------------------------------- requests

    def arrive(self, now_s: float, req: NewRequest) -> Grant | None:
        """A validated request arrives; returns its grant when it may go now, else it is held."""
        s = self.sessions.get(req.session_id)
        if s is None:
            s = Session(id=req.session_id, tenant=req.tenant, created_s=now_s, updated_s=now_s, placed_s=now_s,
                        single_turn=req.single_turn)
        elif s.tenant != req.tenant:
            raise SessionConflict(f"session {req.session_id!r} belongs to another tenant")
        held = HeldRequest(req.request_id, req.session_id, req.tenant, now_s, req.prompt_tokens_estimate,
                           req.max_tokens, model=req.model)
        self._hold(held)
        if req.prefix_key:
            s.prefix_key, s.prefix_tokens = req.prefix_key, max(0, req.prefix_tokens)
        moved = False
        if req.model and req.model != s.model:
            s.model = req.model
            rep = self.replicas.get(s.replica) if s.admitted and s.replica is not None else None
            if rep is not None and not rep.serves(req.model):  # a new model its replica does not serve
                if s.in_flight == 0:
                    self._unadmit_in_place(s, now_s)
                    moved = True
                else:
                    s.pause_pending = True
        if s.held == 0:
            s.pending_prompt_tokens = req.prompt_tokens_estimate
            s.pending_max_tokens = req.max_tokens
            s.waiting_since_s = now_s
        else:
            s.pending_prompt_tokens = max(s.pending_prompt_tokens, req.prompt_tokens_estimate)
            if req.max_tokens is not None:
                s.pending_max_tokens = req.max_tokens if s.pending_max_tokens is None else min(
                    s.pending_max_tokens, req.max_tokens)
        s.held += 1
        s.updated_s = now_s
        self._put(s, pool_changed=moved or not s.admitted)
        if not self.config.gating:
            self._route([s.id], now_s)
        elif self.config.fast_admit and not s.admitted:
            self._fast_admit(s, now_s)
        return self._try_grant(held, now_s)

    def _can_take(self, rep: Replica, s: Session) -> bool:
        """``rep`` may receive ``s``: eligible, not a replica ``s`` failed under, serving its model."""
        return self.eligible(rep) and rep.id not in s.avoid and rep.serves(s.model)

    @staticmethod
    def _credit_on(s: Session, rid: str, now_s: float) -> float:
        """``s``'s decayed cache credit on replica ``rid`` now (0 without evidence there)."""
        return max((decayed_credit(e, now_s) for e in s.cache if e.replica == rid), default=0)

    def _admit(self, s: Session, rid: str, now_s: float) -> None:
        """Admit pool session ``s`` on ``rid`` (placement time now, no pause pending)."""
        self._put(replace(s, admitted=True, replica=rid, placed_s=now_s, pause_pending=False))

    def _fast_admit(self, s: Session, now_s: float) -> None:
        """``CoreConfig.fast_admit``: admit pool session ``s`` now when nothing contends with it."""
        rule = self.config.fast_admit
        if rule in ("cache", "new-program"):
            if len(self._pool) > 1:
                return  # another session waits or is paused: an ordering decision, the planner's
            if rule == "new-program" and s.cache:
                return  # ThunderAgent places only new programs on arrival; the rest wait for its tick
        else:
            for req in self.held.values():
                other = self.sessions.get(req.session_id)
                if req.session_id != s.id and other is not None and not other.admitted:
                    return  # the FCFS queue is not empty
        cap = None if self.caps is None else self.caps.get(s.tenant)
        if cap is not None and cap - self.tenant_in_flight.get(s.tenant, 0) <= 0:
            return
        usable = [rep for rep in self.replicas.values() if self._can_take(rep, s)]
        room = {rep.id: self.capacity(rep.id) - self.used.get(rep.id, 0) for rep in usable}
        target: str | None = None
        if rule == "cache":
            keys = [(-self._credit_on(s, rid, now_s), self.replica_in_flight.get(rid, 0), -free, rid)
                    for rid, free in room.items() if s.footprint_tokens <= free]
            target = min(keys)[3] if keys else None
        elif rule == "new-program":
            programs = self._admitted_per_replica(room)
            target = select_backend_for_new_program(
                s.footprint_tokens, ((rid, self.capacity(rid), self.used.get(rid, 0), programs[rid]) for rid in room))
        else:
            home = s.replica if s.replica is not None else last_used_replica(s.cache)
            if home in room and s.footprint_tokens <= room[home]:
                target = home
            elif rule == "home" or home not in room:  # home-only: a new program, or its replica gone
                roomiest = min(room, key=lambda rid: (-room[rid], rid), default=None)
                if roomiest is not None and s.footprint_tokens <= room[roomiest]:
                    target = roomiest
        if target is not None:
            self._admit(s, target, now_s)
            self.last_reject.pop(s.id, None)
            self.fast_admits += 1

    def _admitted_per_replica(self, replicas: Iterable[str]) -> dict[str, int]:
        """How many sessions are admitted on each of ``replicas``."""
        admitted = dict.fromkeys(replicas, 0)
        for o in self.sessions.values():
            if o.admitted and o.replica in admitted:
                admitted[o.replica] += 1
        return admitted

    def _admit_over_capacity(self, now_s: float) -> None:
        """``hold_limit``: a pool session whose held request has waited its limit is admitted on
        the replica with the most cache credit for it (then the fewest requests in flight) among
        those where it fits within ``over_capacity`` × capacity. Its KV then competes in vLLM's own scheduler, which preempts by recompute; the
        planner sees the excess and pauses by value (the late one ranks lowest), so the session
        goes back to the pool when this request ends. Oldest held request first."""
        assert self.hold_limit is not None
        idle: dict[str, int] | None = None  # per replica: footprints of admitted sessions between requests
        for req in list(self.held.values()):
            s = self.sessions.get(req.session_id)
            if s is None or s.admitted or now_s - req.arrived_s < self.hold_limit(req.prompt_tokens_estimate):
                continue
            if idle is None:
                idle = {}
                for o in self.sessions.values():
                    # between requests for at least its own hold limit (the time to recompute
                    # its context): a tool that long is likely to run on (ski rental again)
                    if (o.admitted and o.replica is not None and o.in_flight == 0 and o.held == 0
                            and o.acting_since_s is not None
                            and now_s - o.acting_since_s >= self.hold_limit(o.footprint_tokens)):
                        idle[o.replica] = idle.get(o.replica, 0) + o.footprint_tokens
            best: tuple[float, int, str] | None = None
            for rep in self.replicas.values():
                if not self._can_take(rep, s):
                    continue
                used, cap = self.used.get(rep.id, 0), self.capacity(rep.id)
                # only into KV whose sessions are between requests (their blocks sit idle in
                # vLLM's cache), and within the bound
                if used - idle.get(rep.id, 0) + s.footprint_tokens > cap or used + s.footprint_tokens > self.over_capacity * cap:
                    continue
                key = (-self._credit_on(s, rep.id, now_s), self.replica_in_flight.get(rep.id, 0), rep.id)
                if best is None or key < best:
                    best = key
            if best is None:
                continue
            self._admit(s, best[2], now_s)
            self.last_reject[s.id] = "admitted over capacity: held past its hold limit"
            self.over_capacity_admits += 1
            idle = None  # recount with this session admitted

    def _force_admit(self, now_s: float) -> None:
        """``force_admit_after_s``: ThunderAgent's starvation bound (``_wait_for_resume``, 30 min
        in ThunderAgent's ``scheduler/router.py``): a pool session whose held request has waited
        that long is resumed "regardless of capacity", on the replica holding most of its cache
        (ThunderAgent: the backend it was paused from) or, without any, on the usable replica
        serving its model with the fewest admitted sessions (ThunderAgent's least-loaded
        backend by program count). Oldest held request first; its KV then competes in vLLM's
        own scheduler, and the policy's next pauses see the excess."""
        assert self.force_admit_after_s is not None
        for req in list(self.held.values()):
            s = self.sessions.get(req.session_id)
            if s is None or s.admitted or now_s - req.arrived_s < self.force_admit_after_s:
                continue
            usable = [rep.id for rep in self.replicas.values() if self._can_take(rep, s)]
            if not usable:
                continue
            admitted = self._admitted_per_replica(usable)
            target = min(usable, key=lambda rid: (-self._credit_on(s, rid, now_s), admitted[rid], rid))
            self._admit(s, target, now_s)
            self.last_reject[s.id] = "admitted whatever the capacity: held past the force-admit bound"
            self.force_admits += 1

    def _hold(self, req: HeldRequest, front: bool = False) -> None:
        mine = self._held_by_tenant.setdefault(req.tenant, {})
        if front:  # a retried request keeps its place at the front
            self.held = {req.request_id: req, **self.held}
            self._held_by_tenant[req.tenant] = {req.request_id: req, **mine}
        else:
            self.held[req.request_id] = req
            mine[req.request_id] = req
        self._bump(self.tenant_held, req.tenant, 1)

    def _unhold(self, request_id: str) -> HeldRequest | None:
        req = self.held.pop(request_id, None)
        if req is not None:
            self._held_by_tenant[req.tenant].pop(request_id, None)
            self._bump(self.tenant_held, req.tenant, -1)
        return req

    def _slot_free(self, tenant: str) -> bool:
        if self.caps is None or tenant not in self.caps:
            return True
        return may_admit(tenant, self.caps, self.limits or self.caps, self.tenant_in_flight)

    def _try_grant(self, req: HeldRequest, now_s: float) -> Grant | None:
        s = self.sessions.get(req.session_id)
        if s is None or not s.admitted or s.replica is None or s.pause_pending:
            return None
        rep = self.replicas.get(s.replica)
        if rep is None or not rep.healthy or s.replica in req.exclude or not rep.serves(req.model):
            return None
        if not self._slot_free(req.tenant):
            return None
        self._unhold(req.request_id)
        self._bump(self.tenant_in_flight, req.tenant, 1)
        replica = s.replica
        self.replica_in_flight[replica] = self.replica_in_flight.get(replica, 0) + 1
        self.in_flight[req.request_id] = InFlight(req.request_id, s.id, req.tenant, replica, now_s, req)
        s.held -= 1
        s.in_flight += 1
        s.inflight_prompt_tokens = max(s.inflight_prompt_tokens, req.prompt_tokens_estimate)
        if req.max_tokens is not None:
            s.inflight_max_tokens = min(s.inflight_max_tokens or req.max_tokens, req.max_tokens)
        s.updated_s = now_s
        if s.held == 0:
            s.waiting_since_s = None
            s.pending_prompt_tokens = 0
            s.pending_max_tokens = None
        self._put(s)
        self.last_reject.pop(s.id, None)
        return Grant(req.request_id, s.id, replica, req.attempts + 1)

    def dispatch(self, now_s: float, tenant: str | None = None) -> list[Grant]:
        """Grant every held request that may go now (call after anything that can unblock).
        ``tenant``: only a slot of this tenant was freed, so only its requests can newly go."""
        if not self.held:
            return []
        if not self.config.gating:
            self._route(sorted({h.session_id for h in self.held.values()}), now_s)
        else:
            if self.force_admit_after_s is not None:
                self._force_admit(now_s)
            if self.hold_limit is not None:
                self._admit_over_capacity(now_s)
        queue = self.held if tenant is None or not self.config.gating else self._held_by_tenant.get(tenant, {})
        grants = []
        for req in list(queue.values()):
            g = self._try_grant(req, now_s)
            if g is not None:
                grants.append(g)
        return grants

    def first_token(self, request_id: str, ttft_s: float) -> None:
        f = self.in_flight.get(request_id)
        s = self.sessions.get(f.session_id) if f else None
        if s is not None:
            s.last_ttft_s = ttft_s  # written with the request's end; not worth a write of its own

    def finish(self, now_s: float, request_id: str, usage: Usage | None) -> None:
        """A forwarded request ended (``usage`` None when it failed after its first byte)."""
        f = self.in_flight.pop(request_id, None)
        if f is None:
            return
        self._bump(self.tenant_in_flight, f.tenant, -1)
        self.replica_in_flight[f.replica] -= 1
        s = self.sessions.get(f.session_id)
        if s is None:
            return
        rep = self.replicas.get(f.replica)
        if usage is not None:
            reports = usage.cached_tokens is not None or (rep is not None and rep.reports_cached_tokens)
            s.tokens = observe_request(s.tokens, usage.prompt_tokens, usage.completion_tokens, self.config.ewma_alpha)
            s.cache = observe_usage(s.cache, f.replica, usage, reports, now_s)
            s.last_cached_tokens = usage.cached_tokens or 0
            s.avoid = frozenset()
            if rep is not None and usage.cached_tokens is not None and not rep.reports_cached_tokens:
                self.replicas[rep.id] = replace(rep, reports_cached_tokens=True)
        s.in_flight -= 1
        s.updated_s = now_s
        pool_changed = False
        if s.in_flight == 0:
            s.inflight_prompt_tokens = 0
            s.inflight_max_tokens = None
            s.acting_since_s = now_s
            if s.single_turn and s.held == 0:
                self._end(s.id)
                return
            leave = s.pause_pending or rep is None or rep.draining or not rep.healthy
            if s.admitted and (leave or (not self.config.gating and not self.config.sticky)):
                self._unadmit_in_place(s, now_s)
            pool_changed = not s.admitted
        self._put(s, pool_changed=pool_changed)

    def observe_kv_residency(self, now_s: float, session_id: str, replica_id: str, tokens: int | None) -> bool:
        """The prompt-prefix tokens of ``session_id`` that ``replica_id``'s KV events say it holds
        now (None: unknown, the usage-derived evidence stands alone). True when that changed the
        session's evidence (the session is then written; a pool session's change wakes the planner)."""
        s = self.sessions.get(session_id)
        rep = self.replicas.get(replica_id)
        if s is None or (tokens is not None and rep is None):
            return False
        if rep is not None and not rep.healthy:
            tokens = None  # a replica that is down holds nothing the session can use
        cache = observe_kv(s.cache, replica_id, tokens, now_s)
        if cache is None:
            return False
        s.cache = cache
        self._put(s, pool_changed=not s.admitted)
        return True

    def fail_before_first_byte(self, now_s: float, request_id: str, replica_down: bool) -> bool:
        """The request's replica failed before answering. Returns True when the request is
        held again for another replica, False when its attempts are used up (it is dropped)."""
        f = self.in_flight.pop(request_id, None)
        if f is None:
            return False
        self._bump(self.tenant_in_flight, f.tenant, -1)
        self.replica_in_flight[f.replica] -= 1
        if replica_down:
            self.replica_down(f.replica, now_s)
        s = self.sessions.get(f.session_id)
        if s is None:
            return False
        s = replace(s, in_flight=s.in_flight - 1, updated_s=now_s,
                    inflight_prompt_tokens=s.inflight_prompt_tokens if s.in_flight > 1 else 0,
                    inflight_max_tokens=s.inflight_max_tokens if s.in_flight > 1 else None)
        if s.admitted and s.replica == f.replica:
            s = self._unadmit(s, now_s, avoid=f.replica)
        attempts = f.held.attempts + 1
        if attempts >= self.config.max_attempts:
            s = replace(s, avoid=frozenset())
            if s.single_turn and s.idle:
                self._end(s.id)
            else:
                self._put(s, pool_changed=True)
            return False
        held = replace(f.held, attempts=attempts, exclude=f.held.exclude | {f.replica})
        self._hold(held, front=True)
        s = replace(
            s, held=s.held + 1, waiting_since_s=s.waiting_since_s or now_s,
            pending_prompt_tokens=max(s.pending_prompt_tokens, held.prompt_tokens_estimate),
            pending_max_tokens=held.max_tokens if s.held == 0 else s.pending_max_tokens,
        )
        self._put(s, pool_changed=True)
        return True

    def abandon(self, now_s: float, request_id: str) -> bool:
        """A held request gave up (hold timeout, client gone, session released)."""
        req = self._unhold(request_id)
        if req is None:
            return False
        s = self.sessions.get(req.session_id)
        if s is None:
            return True
        held = s.held - 1
        s = replace(
            s, held=held, updated_s=now_s, waiting_since_s=s.waiting_since_s if held else None,
            pending_prompt_tokens=s.pending_prompt_tokens if held else 0,
            pending_max_tokens=s.pending_max_tokens if held else None,
        )
        if s.single_turn and s.idle:
            self._end(s.id)
        else:
            self._put(s, pool_changed=True)
        return True

    # ------------------------------------------------------------------------- sessions

    def reveal_next_request(self, session_id: str, append_tokens: int, output_tokens: int) -> None:
        """The simulator's ``oracle`` only (docs/algorithms.md#oracle): the session's next request
        will append ``append_tokens`` to its context and produce ``output_tokens``. They replace
        the EWMA estimates in its footprint until its next request completes, so the footprint is
        that request's exact size (a session with no completed request keeps the default output
        estimate). Unknown sessions are ignored."""
        s = self.sessions.get(session_id)
        if s is None:
            return
        s.tokens = replace(s.tokens, ewma_append_tokens=float(max(0, append_tokens)),
                           ewma_output_tokens=float(max(0, output_tokens)))
        self._put(s)

    def release(self, now_s: float, session_id: str, force: bool = False) -> list[str]:
        """End a session; returns the ids of its held requests (the adapter answers them)."""
        s = self.sessions.get(session_id)
        if s is None:
            raise UnknownSession(f"unknown session {session_id!r}")
        if s.in_flight > 0 and not force:
            raise SessionBusy(f"session {session_id!r} has {s.in_flight} request(s) in flight; use force")
        cancelled = [r for r, h in self._held_by_tenant.get(s.tenant, {}).items() if h.session_id == session_id]
        for rid in cancelled:
            self._unhold(rid)
        self._end(session_id)
        return cancelled

    def expire(self, now_s: float) -> list[str]:
        """End sessions idle for longer than the TTL."""
        ttl = self.config.session_ttl_s
        gone = [s.id for s in self.sessions.values() if s.idle and now_s - s.updated_s > ttl]
        for sid in gone:
            self._end(sid)
        return gone

    def restore(self, sessions: Iterable[Session]) -> None:
        """Adopt sessions read back after a router restart (their requests died with the
        old process, so nothing is held or in flight; admission on known replicas is kept)."""
        for s in sessions:
            keep = s.admitted and s.replica in self.replicas
            self._put(replace(
                s, in_flight=0, held=0, pause_pending=False, waiting_since_s=None, pending_prompt_tokens=0,
                inflight_prompt_tokens=0, inflight_max_tokens=None,
                pending_max_tokens=None, admitted=keep, replica=s.replica if keep else None,
            ), pool_changed=True)

    # ------------------------------------------------------------------------- replicas

    def upsert_replica(self, rep: Replica, now_s: float) -> None:
        """Add or update a replica (health, metrics). Turning unhealthy re-pools its sessions."""
        old = self.replicas.get(rep.id)
        if old is not None and rep.reports_cached_tokens is False and old.reports_cached_tokens:
            rep = replace(rep, reports_cached_tokens=True)
        self.replicas[rep.id] = rep
        self._replicas_changed()
        self.used.setdefault(rep.id, 0)
        if (self.config.share_prefixes_below_tokens and old is not None
                and old.kv_capacity_tokens != rep.kv_capacity_tokens):  # whether it shares prefixes may change
            for s in [s for s in self.sessions.values() if s.admitted and s.replica == rep.id]:
                self._put(s)
            self._reprice_prefix_pool()
        if old != rep:
            self._d_replicas.add(rep.id)
        if not rep.healthy and ((old is not None and old.healthy) or self._has_admitted(rep.id)):
            self.replica_down(rep.id, now_s)
        if rep.draining and (old is None or not old.draining):
            self._drain_sessions(rep.id, now_s)
        elif old is not None and old.models != rep.models:  # it no longer serves some sessions' model
            self._drain_sessions(rep.id, now_s, keep=rep.serves)

    def _replicas_changed(self) -> None:
        """Refresh what is derived from the replica table (call after any change to a
        replica's capacity or usability)."""
        self._largest_capacity = max(
            (r.capacity_tokens(self.config.target_utilisation) for r in self.replicas.values() if r.usable),
            default=0)
        by_model: dict[str, int] = {}
        for r in self.replicas.values():
            if r.usable:
                cap = r.capacity_tokens(self.config.target_utilisation)
                for m in r.models:
                    by_model[m] = max(by_model.get(m, 0), cap)
        self._largest_by_model = by_model
        usable = frozenset(rid for rid, r in self.replicas.items() if self.eligible(r))
        if usable != self._usable_ids:
            self._usable_ids = usable
            self._reprice_prefix_pool()  # where a pool session may go changed

    def _has_admitted(self, replica_id: str) -> bool:
        return any(c is not None and c[0] == replica_id for c in self._contrib.values())

    def replica_down(self, replica_id: str, now_s: float) -> list[str]:
        """Replica failed: its sessions go back to the pool with zero credit there."""
        rep = self.replicas.get(replica_id)
        if rep is not None and rep.healthy:
            self.replicas[replica_id] = replace(rep, healthy=False)
            self._replicas_changed()
            self._d_replicas.add(replica_id)
        moved = []
        for s in list(self.sessions.values()):
            placed_here = s.admitted and s.replica == replica_id
            has_credit = any(e.replica == replica_id for e in s.cache)
            if not placed_here and not has_credit:
                continue
            new = replace(s, cache=drop_replica(s.cache, replica_id))
            if placed_here:
                new = self._unadmit(new, now_s)
                moved.append(s.id)
            self._put(new, pool_changed=placed_here)
        return moved

    def _drain_sessions(self, replica_id: str, now_s: float, keep: Callable[[str], bool] | None = None) -> None:
        """Sessions admitted on ``replica_id`` leave it (at once, or when their request ends),
        except those whose model ``keep`` accepts."""
        for s in list(self.sessions.values()):
            if s.admitted and s.replica == replica_id and (keep is None or not keep(s.model)):
                if s.in_flight > 0:
                    self._put(replace(s, pause_pending=True))
                else:
                    self._put(self._unadmit(s, now_s))

    def remove_replica(self, replica_id: str, now_s: float) -> None:
        self.replica_down(replica_id, now_s)
        self.replicas.pop(replica_id, None)
        self._replicas_changed()
        self._d_replicas.add(replica_id)

    # --------------------------------------------------------------------------- tenants

    def set_caps(self, caps: Mapping[str, int] | None, limits: Mapping[str, int] | None = None) -> None:
        """Caps and admission limits from the budget service (limits default to the caps)."""
        self.caps = None if caps is None else dict(caps)
        self.limits = dict(limits) if limits else (None if caps is None else dict(caps))

    def tenant_headroom(self) -> dict[str, int] | None:
        if self.caps is None:
            return None
        return {t: max(0, cap - self.tenant_in_flight.get(t, 0)) for t, cap in self.caps.items()}

    # ---------------------------------------------------------------------------- plans

    def apply_plan(self, now_s: float, plan: PlanDecision) -> ApplyReport:
        """Revalidate and apply a plan (see ``plans.apply_plan``); call ``dispatch`` after."""
        return plans.apply_plan(self, now_s, plan)

    def explain(self, session_id: str) -> str:
        return plans.explain(self, session_id)

    # --------------------------------------------------------------- per-request routing

    def _route(self, session_ids: list[str], now_s: float) -> None:
        """Per-request policies: place every listed pool session that holds a request."""
        todo = [sid for sid in session_ids
                if (s := self.sessions.get(sid)) is not None and s.held > 0 and not s.admitted]
        if not todo or self.policy is None:
            return
        snap: Snapshot = build_snapshot(self, now_s, {}, only=todo)
        plan = self.policy.plan(snap)
        chosen = {a.session: a.replica for a in plan.assignments}
        for sid in todo:
            s = self.sessions[sid]
            rid = chosen.get(sid)
            rep = self.replicas.get(rid) if rid else None
            if rep is None or not self._can_take(rep, s):
                rid = self._least_used(exclude=s.avoid, model=s.model)
            if rid is None:
                self.last_reject[sid] = f"no healthy replica serves model {s.model}" if s.model else \
                    "no healthy replica"
                continue
            self._admit(s, rid, now_s)

    def _least_used(self, exclude: frozenset[str], model: str = "") -> str | None:
        ok = [r for r in self.replicas.values() if self.eligible(r) and r.id not in exclude and r.serves(model)]
        if not ok:
            return None
        return min(ok, key=lambda r: (self.used.get(r.id, 0) / max(1, r.kv_capacity_tokens), r.id)).id
