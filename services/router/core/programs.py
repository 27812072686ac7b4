"""ThunderAgent's program view of the router's sessions (pure: no I/O).

A harness written for ThunderAgent reads its proxy's JSON endpoints; these functions give
the same shapes from the router core's state. Sources (ThunderAgent-org/ThunderAgent):

- ``ThunderAgent/app.py``: ``GET /programs`` (``{program_id: {backend, context_len,
  total_tokens, step_count, status, state}}``), ``GET /health`` (``programs_count``,
  ``reasoning_count``, ``acting_count``, ``paused_count``, ``per_backend`` ...), ``GET
  /metrics`` (``{metrics_enabled, metrics_interval, backends: {url: ...}}``);
- ``ThunderAgent/program/state.py``: ``ProgramStatus`` (``reasoning`` on the GPU,
  ``acting`` off it) and ``ProgramState`` (``active``, ``paused``; ``terminated`` programs
  are removed at once, as the router removes ended sessions);
- ``ThunderAgent/scheduler/router.py``: ``get_program_stats`` (the ``per_backend`` entries)
  and ``update_program_before_request`` (a request sets the program to ``reasoning`` before
  it waits, and ``step_count`` counts requests as they arrive);
- ``ThunderAgent/backend/state.py``: ``BackendState.to_dict`` (a backend's ``/metrics``
  entry; ``backend/vllm_metrics.py`` adds ``healthy`` and the latest ``metrics``).

Mapping from the router's phases (``model.phase_of``): RUNNING -> reasoning/active;
WAITING -> reasoning, active when admitted else paused; ACTING -> acting/active; PAUSED ->
acting/paused. Token counts are the router's: ``total_tokens`` is the session's context
(its last prompt + output, or the prompt in flight or held before its first answer) and
``context_len`` the same number (ThunderAgent counts the characters of the last request
body there; the router keeps tokens only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.router.core.model import Replica, Session, phase_of


def status_of(s: Session) -> str:
    """ThunderAgent's ``ProgramStatus``: ``reasoning`` (a request in flight or held) or ``acting``."""
    return "reasoning" if s.in_flight > 0 or s.held > 0 else "acting"


def state_of(s: Session, gating: bool) -> str:
    """ThunderAgent's ``ProgramState``: ``paused`` while not admitted (its next request waits)."""
    phase = phase_of(s, gating)
    if phase == "RUNNING" or phase == "ACTING":
        return "active"
    return "active" if s.admitted else "paused"


def total_tokens(s: Session) -> int:
    """The session's context in tokens (see the module doc)."""
    if s.tokens.requests:
        return max(s.tokens.context_tokens, s.inflight_prompt_tokens, s.pending_prompt_tokens)
    return max(s.inflight_prompt_tokens, s.pending_prompt_tokens)


def program_entry(s: Session, replicas: Mapping[str, Replica], gating: bool) -> dict[str, Any]:
    """One value of ``GET /programs`` (ThunderAgent/app.py ``list_programs``)."""
    rep = replicas.get(s.replica) if s.admitted and s.replica is not None else None
    tokens = total_tokens(s)
    return {
        "backend": rep.url if rep is not None else None,
        "context_len": tokens,
        "total_tokens": tokens,
        "step_count": s.tokens.requests + s.in_flight + s.held,
        "status": status_of(s),
        "state": state_of(s, gating),
    }


def list_programs(sessions: Iterable[Session], replicas: Mapping[str, Replica], gating: bool,
                  tenant: str | None = None) -> dict[str, dict[str, Any]]:
    """``GET /programs``: every session (of ``tenant`` when given) by id."""
    return {s.id: program_entry(s, replicas, gating) for s in sessions if tenant is None or s.tenant == tenant}


def program_stats(sessions: Iterable[Session], replicas: Mapping[str, Replica], gating: bool) -> dict[str, Any]:
    """ThunderAgent's ``/health`` program counts (``scheduler/router.py`` ``get_program_stats``).
    A paused session is counted on the replica it last held cache on, as ThunderAgent counts a
    paused program on its origin backend."""
    per: dict[str, dict[str, int]] = {
        rep.url: {"total": 0, "reasoning": 0, "acting": 0, "paused": 0, "marked_for_pause": 0,
                  "future_paused_tokens": 0}
        for rep in replicas.values()
    }
    total = reasoning = acting = paused = marked = 0
    for s in sessions:
        total += 1
        status = status_of(s)
        if status == "reasoning":
            reasoning += 1
        else:
            acting += 1
        if s.pause_pending:
            marked += 1
        if state_of(s, gating) == "paused":
            paused += 1
            origin = s.cache[-1].replica if s.cache else None
            rep = replicas.get(origin) if origin is not None else None
            if rep is not None:
                per[rep.url]["paused"] += 1
            continue
        rep = replicas.get(s.replica) if s.admitted and s.replica is not None else None
        if rep is None:
            continue
        row = per[rep.url]
        row["total"] += 1
        row[status] += 1
        if s.pause_pending:
            row["marked_for_pause"] += 1
            row["future_paused_tokens"] += s.footprint_tokens
    return {"total": total, "reasoning": reasoning, "acting": acting, "paused": paused, "marked_for_pause": marked,
            "per_backend": per}


def backend_entry(rep: Replica, sessions: Iterable[Session], used_tokens: int, target_utilisation: float,
                  gating: bool, paused_programs: int) -> dict[str, Any]:
    """One ``backends`` value of ThunderAgent's ``GET /metrics`` (``backend/state.py``
    ``BackendState.to_dict`` + ``backend/vllm_metrics.py`` ``to_dict``), from the router's
    view of replica ``rep`` (``sessions``: those admitted on it)."""
    reasoning_tokens = acting_tokens = reasoning = acting = 0
    future_paused = 0
    for s in sessions:
        if status_of(s) == "reasoning":
            reasoning += 1
            reasoning_tokens += s.footprint_tokens
        else:
            acting += 1
            acting_tokens += s.footprint_tokens
        if s.pause_pending:
            future_paused += s.footprint_tokens
    capacity = rep.capacity_tokens(target_utilisation)
    out: dict[str, Any] = {
        "url": rep.url,
        "active_program_tokens": used_tokens,
        "reasoning_program_tokens": reasoning_tokens,
        "acting_program_tokens": acting_tokens,
        "active_program_count": reasoning + acting,
        "reasoning_program_count": reasoning,
        "acting_program_count": acting,
        "active_program_tokens_ratio": round(used_tokens / rep.kv_capacity_tokens, 4) if rep.kv_capacity_tokens else 0.0,
        "total_program_tokens": reasoning_tokens + acting_tokens,
        "paused_program_count": paused_programs,
        "future_paused_tokens": future_paused,
        "capacity_overflow": max(0, used_tokens - capacity) if capacity else 0,
        "healthy": rep.healthy,
        "monitoring": True,
        "metrics": {
            "num_requests_running": rep.running,
            "num_requests_waiting": rep.waiting,
            "kv_cache_usage_perc": round(rep.kv_cache_usage, 4),
            "prefix_cache_hit_rate": round(rep.prefix_hit_rate, 4),
        },
    }
    if rep.kv_capacity_tokens:
        out["cache_config"] = {"total_tokens_capacity": rep.kv_capacity_tokens}
    return out
