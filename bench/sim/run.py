"""Run the grid: every (configuration, policy) pair is an independent simulation.

Pairs run in a process pool (``--jobs``); each process generates the traces it needs once
(deterministic, so every policy of a configuration sees the same trace).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from bench.sim.grid import GridPoint
from sim.cluster.runner import run_policy
from sim.cluster.simulator import SimConfig
from sim.workload.generate import GenerateOptions, generate
from sim.workload.trace import Session


@dataclass(frozen=True, slots=True)
class Task:
    point: GridPoint
    policy: str
    seed: int
    max_turns: int | None


@functools.lru_cache(maxsize=8)
def _trace(kind: str, sessions: int, seed: int, max_turns: int | None) -> tuple[Session, ...]:
    return tuple(generate(GenerateOptions(kind=kind, sessions=sessions, seed=seed, max_turns=max_turns)))


def run_task(task: Task) -> dict[str, Any]:
    """One simulation; returns metrics plus run diagnostics (small, picklable)."""
    p = task.point
    trace = _trace(p.kind, p.sessions, task.seed, task.max_turns)
    cfg = SimConfig(replicas=p.replicas, profile=p.profile.name, concurrency=p.concurrency, seed=task.seed,
                    num_gpu_blocks=p.num_gpu_blocks)
    out = run_policy(trace, task.policy, cfg, profile=p.profile)
    return {
        "point": p.key,
        "policy": task.policy,
        "metrics": out.metrics,
        "wall_s": out.wall_s,
        "cpu_s": out.cpu_s,
        "sim_end_s": out.run.sim_end_s,
        "plans": out.run.plans,
        "counters": out.run.counters,
        "incomplete": len(out.run.incomplete),
    }


def run_grid(
    points: Sequence[GridPoint],
    policies_of: Callable[[GridPoint], Sequence[str]],
    seed: int,
    max_turns: int | None,
    jobs: int,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """All results (in grid order) and the wall time of the whole grid."""
    tasks = [Task(p, pol, seed, max_turns) for p in points for pol in policies_of(p)]
    order = {(t.point.key, t.policy): i for i, t in enumerate(tasks)}
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    t0 = time.perf_counter()
    if jobs <= 1:
        for t in tasks:
            r = run_task(t)
            results[order[(r["point"], r["policy"])]] = r
            if on_result:
                on_result(r)
    else:
        # Longest first: terminal-bench and the high-concurrency points dominate.
        tasks_sorted = sorted(tasks, key=lambda t: -(t.point.sessions * t.point.concurrency))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_task, t) for t in tasks_sorted]
            for f in as_completed(futures):
                r = f.result()
                results[order[(r["point"], r["policy"])]] = r
                if on_result:
                    on_result(r)
    return [r for r in results if r is not None], time.perf_counter() - t0
