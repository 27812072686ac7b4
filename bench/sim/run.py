"""Run the grid: every (configuration, policy) pair is an independent simulation.

Pairs run in a process pool (``--jobs``); each process generates the traces it needs once
(deterministic, so every policy of a configuration sees the same trace).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.sim.grid import GridPoint
from services.sim.cluster.lower_bound import CapacityBound, LowerBound, cached_lower_bound
from services.sim.cluster.metrics import upgrade_metrics
from services.sim.cluster.runner import capacity_ratios, run_policy, sim_capacity_bound
from services.sim.cluster.simulator import SimConfig
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.trace import TraceSession


@dataclass(frozen=True, slots=True)
class Task:
    point: GridPoint
    policy: str
    seed: int
    max_turns: int | None
    kv_events_credit: bool = False  # SimConfig.kv_events_credit: the router's credit from KV events


@functools.lru_cache(maxsize=8)
def _trace(kind: str, sessions: int, seed: int, max_turns: int | None) -> tuple[TraceSession, ...]:
    return tuple(generate(GenerateOptions(kind=kind, sessions=sessions, seed=seed, max_turns=max_turns)))


def run_task(task: Task) -> dict[str, Any]:
    """One simulation; returns metrics plus run diagnostics (small, picklable)."""
    p = task.point
    trace = _trace(p.kind, p.sessions, task.seed, task.max_turns)
    cfg = SimConfig(replicas=p.replicas, profile=p.profile.name, concurrency=p.concurrency, seed=task.seed,
                    num_gpu_blocks=p.num_gpu_blocks, kv_events_credit=task.kv_events_credit)
    out = run_policy(trace, task.policy, cfg, profile=p.profile)
    capacity_ratios(out.metrics, out.run, point_capacity_bound(p, task.seed, task.max_turns))
    return {
        "point": p.key,
        "policy": task.policy,
        "seed": task.seed,
        "sessions": p.sessions,
        "metrics": out.metrics,
        "wall_s": out.wall_s,
        "cpu_s": out.cpu_s,
        "sim_end_s": out.run.sim_end_s,
        "plans": out.run.plans,
        "counters": out.run.counters,
        "incomplete": len(out.run.incomplete),
    }


def point_lower_bound(point: GridPoint, seed: int, max_turns: int | None) -> LowerBound:
    """The no-contention lower bound of a configuration's trace (cached per trace and profile)."""
    return cached_lower_bound(_trace(point.kind, point.sessions, seed, max_turns), point.profile)


@functools.lru_cache(maxsize=8)
def point_capacity_bound(point: GridPoint, seed: int, max_turns: int | None) -> CapacityBound:
    """The capacity bound of a configuration (its trace on its fleet and worker count), computed
    once per process for all the policies run on it."""
    cfg = SimConfig(replicas=point.replicas, profile=point.profile.name, concurrency=point.concurrency,
                    num_gpu_blocks=point.num_gpu_blocks)
    return sim_capacity_bound(_trace(point.kind, point.sessions, seed, max_turns), cfg, point.profile)


def grid_key(r: dict[str, Any]) -> tuple[str, str, int]:
    """A grid result's checkpoint key: (point, policy, sessions)."""
    return r["point"], r["policy"], r["sessions"]


def load_checkpoint(path: Path | None, key: Callable[[dict[str, Any]], tuple[str, str, int]] = grid_key,
                    ) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Results already recorded in a checkpoint (JSONL), by ``key`` (the grid's: ``grid_key``)."""
    done: dict[tuple[str, str, int], dict[str, Any]] = {}
    if path is None or not path.exists():
        return done
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            upgrade_metrics(r["metrics"])  # results written before the decode-throughput rename
            done[key(r)] = r
    return done


def execute(tasks: Sequence[Task], jobs: int, record: Callable[[dict[str, Any]], None],
            checkpoint: Path | None = None) -> None:
    """Run ``tasks`` (in a process pool of ``jobs`` when more than one), handing each result to
    ``record`` as it arrives and, with ``checkpoint``, appending it to that JSONL file first."""
    sink = checkpoint.open("a") if checkpoint is not None else None

    def done(r: dict[str, Any]) -> None:
        if sink is not None:
            sink.write(json.dumps(r) + "\n")
            sink.flush()
        record(r)

    try:
        if jobs <= 1:
            for t in tasks:
                done(run_task(t))
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for f in as_completed([pool.submit(run_task, t) for t in tasks]):
                    done(f.result())
    finally:
        if sink is not None:
            sink.close()


def run_grid(
    points: Sequence[GridPoint],
    policies_of: Callable[[GridPoint], Sequence[str]],
    seed: int,
    max_turns: int | None,
    jobs: int,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    checkpoint: Path | None = None,
    kv_events_credit: bool = False,
) -> tuple[list[dict[str, Any]], float]:
    """All results (in grid order) and the wall time of the whole grid. With ``checkpoint``,
    every result is appended to that JSONL file as it arrives and results already there (same
    configuration, policy and session count) are reused, so an interrupted grid resumes."""
    tasks = [Task(p, pol, seed, max_turns, kv_events_credit) for p in points for pol in policies_of(p)]
    order = {(t.point.key, t.policy): i for i, t in enumerate(tasks)}
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    done = load_checkpoint(checkpoint)
    todo = []
    for t in tasks:
        prev = done.get((t.point.key, t.policy, t.point.sessions))
        if prev is not None:
            results[order[(t.point.key, t.policy)]] = prev
        else:
            todo.append(t)

    def record(r: dict[str, Any]) -> None:
        results[order[(r["point"], r["policy"])]] = r
        if on_result:
            on_result(r)

    t0 = time.perf_counter()
    if jobs > 1:  # longest first: the high-concurrency points dominate
        todo.sort(key=lambda t: -(t.point.sessions * t.point.concurrency))
    execute(todo, jobs, record, checkpoint)
    return [r for r in results if r is not None], time.perf_counter() - t0
