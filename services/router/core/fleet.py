"""Fleet-wide admission slots, the decision side (pure; docs/architecture.md#router-fleet).

With several routers, a tenant's budget cap is split into *allotments*: each router holds some
of the tenant's slots in Redis (``services.common.fleet.SLOTS`` keeps Σ allotments <= cap) and
its core admits at most its allotment at once (``local_caps``). A router asks for more when it
has held requests that only a slot keeps waiting (``waiting_for_slot``), keeps a few spare slots while nobody else waits (so most requests are
admitted without a Redis round trip), and gives back what it does not use.

Ordering keeps Σ admitted <= cap at every instant: a router lowers its core's cap *before* it
gives slots back in Redis, and raises it only *after* Redis granted them; the core never admits
past its cap, and an allotment is never lowered below what is in flight.

Liveness: Redis keeps a router's allotment under its id, so whatever Redis holds there must
end up known to the router, or nobody gives it back. A router that rejoins in a new member term
(its lease lapsed in Redis: an event loop stalled past it) forgets its allotments, and a slot
call can fail after Redis applied it; until a call in the current term confirms a tenant's
allotment, the router asks for it even while idle (``slot_request``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.router.core.state import RouterCore


def slot_target(in_flight: int, held: int, cap: int, others: int, waiters: int) -> int:
    """How many slots of a tenant this router should hold: what is in flight and held, plus,
    while no other router waits for slots, half of what is still free as a spare; never above
    the cap, never below what is in flight (those slots are in use)."""
    need = in_flight + held
    spare = 0
    if waiters == 0:
        free = cap - others - need
        spare = max(0, (free + 1) // 2)
    return max(in_flight, min(cap, need + spare))


def slot_request(in_flight: int, held: int, cur: int, cap: int, others: int, waiters: int, *,
                 confirmed: bool, fresh: bool) -> int | None:
    """The allotment of a tenant to ask Redis for now (``fleet.SLOTS``), or None: no call due.

    ``cur``: the slots this router knows it holds; ``others``, ``waiters``: what its last call
    saw, ``fresh``: that call is recent; ``confirmed``: a call answered in the current member
    term since, and it left no waiting mark (it got what it asked). A tenant with nothing in
    flight or held and no slot known is left alone once confirmed; unconfirmed it is asked
    at 0: Redis may still count slots (or a waiting mark) under this router's id that it no
    longer knows of (it rejoined in a new term and forgot its allotments, or a call failed
    after Redis applied it), and an idle router would never give them back: the other routers'
    requests of the tenant would wait at cap 0 for as long as this one gets none of them."""
    if in_flight == 0 and held == 0 and cur == 0:
        return None if confirmed else 0
    target = slot_target(in_flight, held, cap, others, waiters)
    if confirmed and fresh and target == cur and held == 0 and waiters == 0:
        return None
    return target


def waiting_for_slot(core: RouterCore, tenant: str) -> int:
    """Held requests of ``tenant`` that only a free slot keeps waiting (their session is admitted
    on a healthy replica that serves them), plus one while any request waits in the pool (a
    session not admitted): the router's own plans see its slots as the tenant's headroom, so
    without one free slot they would never admit the session. Counting every pool request
    instead would let a router whose requests the plan holds sit on slots that another router's
    admitted sessions wait for."""
    n = 0
    pool = 0
    for req in core._held_by_tenant.get(tenant, {}).values():
        s = core.sessions.get(req.session_id)
        if s is None or s.pause_pending:
            continue
        if not s.admitted or s.replica is None:
            pool = 1
            continue
        rep = core.replicas.get(s.replica)
        if rep is not None and rep.healthy and s.replica not in req.exclude and rep.serves(req.model):
            n += 1
    return n + pool


def local_caps(caps: Mapping[str, int], allotments: Mapping[str, int]) -> dict[str, int]:
    """The caps of this router's core: per capped tenant, the slots it holds (never above the
    tenant's budget cap, which may have shrunk below the allotment meanwhile)."""
    return {t: min(cap, allotments.get(t, 0)) for t, cap in caps.items()}


def owner_token(rev: int, router_id: str) -> str:
    """The value of a session's entry in ``keys.SESSION_OWNERS``: its fencing revision and owner."""
    return f"{rev} {router_id}"
