"""KV events for the simulated per-request router: each replica's real prefix residency.

NVIDIA Dynamo's KV router learns what every worker caches from the engines' KV events (vLLM
publishes ``BlockStored`` when a full block is hashed into its prefix cache and
``BlockRemoved`` when the block is evicted; the router folds them into a radix tree over
chained block hashes, ``lib/llm/src/kv_router/indexer.rs`` in github.com/ai-dynamo/dynamo)
and scores a request by walking its block hashes from the root (``find_matches``: per worker,
the number of leading blocks of the request that worker holds). A block freed by its last
request but not yet evicted is still announced, so it still counts.

The simulated engines are the ground truth that tree mirrors. Before a per-request policy
routes, ``with_kv_events`` adds to every held session, for every replica of the snapshot, one
``kv_events`` credit (``services.planner.core.model.EVIDENCE_KINDS``, the strongest kind):
the leading full blocks of the held request's prompt the replica holds now
(``Engine.resident_prefix_blocks``, read-only), in tokens, observed at the snapshot's time.
It supersedes the router's usage-derived evidence, which stays at the last context after
the blocks are evicted and never sees a prefix shared with other sessions (a common system
prompt). A replica holding nothing of the prompt gets a 0-token credit: that is knowledge too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from services.common.core.evidence import CacheEvidence
from services.planner.core.model import SessionState, Snapshot
from services.sim.engine import Engine, TokenContent

HeldPrompt = Callable[[str], tuple[TokenContent, int] | None]
"""Session id -> (token content, prompt tokens) of its held request; None when none is held."""


def with_kv_events(snapshot: Snapshot, held_prompt: HeldPrompt, engines: Mapping[str, Engine], *,
                   only_held: bool = True) -> Snapshot:
    """``snapshot`` with a ``kv_events`` credit per (held session, replica), observed at ``now_s``.
    ``only_held=False``: for every session not running a request (admitted or not) that
    ``held_prompt`` knows a prompt of, as the live router reports it to gating policies
    (``services/router/kv_events.py`` refreshes every idle session)."""
    now = snapshot.now_s
    sessions: list[SessionState] = []
    changed = False
    for s in snapshot.sessions:
        skip = (s.admitted or s.phase != "WAITING") if only_held else s.phase == "RUNNING"
        prompt = None if skip else held_prompt(s.id)
        if prompt is None:
            sessions.append(s)
            continue
        content, tokens = prompt
        events = tuple(
            CacheEvidence.of_credit(r.id, engines[r.id].resident_prefix_blocks(content, tokens) * engines[r.id].block_size,
                           now, "kv_events")
            for r in snapshot.replicas
            if r.id in engines
        )
        kept = tuple(c for c in s.credits if c.kind != "kv_events")  # older events are superseded
        sessions.append(replace(s, credits=kept + events))
        changed = True
    return replace(snapshot, sessions=tuple(sessions)) if changed else snapshot
