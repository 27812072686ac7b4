"""Random planner snapshots for benchmarks and tests (deterministic for a seed).

Shapes follow agent serving on vLLM (docs/architecture.md, docs/algorithms.md#footprint): replica KV capacity of a few hundred
thousand tokens, 20–95 % of it already used; session footprints 4k–64k tokens (log-uniform:
context plus expected output); ~30 % of pool sessions ready; ~70 % carry cache evidence on
the replica they last ran on (some on two), 0–60 s old, of mixed evidence kinds.
"""

from __future__ import annotations

import math
import random

from services.common.core.evidence import CacheEvidence
from services.planner.core.model import ReplicaState, SessionState, Snapshot

KINDS = ("kv_events", "cached_tokens", "volume")


def random_snapshot(
    seed: int,
    replicas: int,
    pool: int,
    *,
    capacity_tokens: int = 400_000,
    used_range: tuple[float, float] = (0.2, 0.95),
    footprint_range: tuple[int, int] = (4_000, 64_000),
    ready_share: float = 0.3,
    credit_share: float = 0.7,
    admitted_per_replica: int = 0,
    now_s: float = 1_000.0,
) -> Snapshot:
    rng = random.Random(seed)
    reps = []
    for j in range(replicas):
        used = int(capacity_tokens * rng.uniform(*used_range))
        reps.append(ReplicaState(id=f"r{j:02d}", capacity_tokens=capacity_tokens, used_tokens=used,
                                 healthy=rng.random() > 0.02, prefix_hit_rate=rng.uniform(0.3, 0.9)))
    lo, hi = footprint_range
    sessions = []
    for i in range(pool):
        foot = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        credits: list[CacheEvidence] = []
        if rng.random() < credit_share:
            homes = rng.sample(range(replicas), k=min(replicas, 2 if rng.random() < 0.15 else 1))
            for h in homes:
                credits.append(CacheEvidence.of_credit(replica=f"r{h:02d}", tokens=int(foot * rng.uniform(0.3, 0.95)),
                                              observed_at_s=now_s - rng.uniform(0.0, 60.0), kind=rng.choice(KINDS)))
        sessions.append(SessionState(
            id=f"s{i:05d}", tenant=f"t{i % 3}", footprint_tokens=foot, ready=rng.random() < ready_share,
            credits=tuple(credits), phase=rng.choice(("WAITING", "PAUSED", "ACTING")),
            context_tokens=int(foot * 0.9), waiting_since_s=now_s - rng.uniform(0.0, 30.0),
        ))
    for j in range(replicas):
        for a in range(admitted_per_replica):
            foot = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
            sessions.append(SessionState(
                id=f"a{j:02d}-{a:03d}", tenant=f"t{a % 3}", footprint_tokens=foot, ready=rng.random() < ready_share,
                credits=(CacheEvidence.of_credit(f"r{j:02d}", int(foot * 0.8), now_s - rng.uniform(0, 30)),),
                phase=rng.choice(("RUNNING", "ACTING")), replica=f"r{j:02d}", admitted=True,
                context_tokens=int(foot * 0.9), acting_since_s=now_s - rng.uniform(0, 20),
            ))
    return Snapshot(now_s=now_s, replicas=tuple(reps), sessions=tuple(sessions))
