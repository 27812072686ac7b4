"""Build the planner's ``Snapshot`` (docs/architecture.md#planner-core-api) from the router's live state.

Used by the local fallback policy (planner silent) and by per-request policies at request
arrival. Times stay on the router's clock. A replica is reported healthy only when it may
receive new sessions (healthy, not draining, capacity known for gating policies), so no
policy places anything on a draining or failed replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from services.planner.core.model import Snapshot, replica_view, session_view

if TYPE_CHECKING:
    from services.router.core.state import RouterCore


def build_snapshot(
    core: RouterCore,
    now_s: float,
    readiness: Mapping[str, bool],
    only: Iterable[str] | None = None,
    returns: Mapping[str, float] | None = None,
) -> Snapshot:
    """Snapshot at ``now_s``; ``readiness`` holds predicted readiness per session (a session
    with a held request is always ready); ``only`` restricts the sessions listed; ``returns``
    holds the predicted tool-return time per acting session (same clock as ``now_s``)."""
    returns = returns or {}
    replicas = tuple(
        replica_view(
            r.id,
            r.capacity_tokens(core.config.target_utilisation),
            core.used.get(r.id, 0),
            eligible=core.eligible(r),
            # the router's own in-flight count is live; the scraped one lags a scrape period
            running=max(r.running, core.replica_in_flight.get(r.id, 0)),
            waiting=r.waiting,
            prefix_hit_rate=r.prefix_hit_rate,
            models=r.models,
            block_size=r.block_size,
        )
        for r in sorted(core.replicas.values(), key=lambda r: r.id)
    )
    known = core.replicas
    ids = sorted(core.sessions) if only is None else list(only)
    sessions = []
    for sid in ids:
        s = core.sessions.get(sid)
        if s is None:
            continue
        sessions.append(
            session_view(
                s.id,
                s.tenant,
                known_replicas=known,
                footprint_tokens=s.footprint_tokens,
                ready=s.held > 0 or bool(readiness.get(s.id, False)),
                evidence=s.cache,
                phase=core.phase(s),
                replica=s.replica,
                admitted=s.admitted,
                context_tokens=s.tokens.context_tokens,
                acting_since_s=s.acting_since_s,
                waiting_since_s=s.waiting_since_s,
                tool_return_s=returns.get(s.id) if s.held == 0 else None,
                model=s.model,
            )
        )
    return Snapshot(now_s=now_s, replicas=replicas, sessions=tuple(sessions), tenant_headroom=core.tenant_headroom())
