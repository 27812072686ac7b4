"""Run several policies on one trace and assemble the `tao sim run` JSON."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from services.planner.core.fits import fitted
from services.planner.core.registry import make_policy
from services.sim.cluster import oracle as _oracle  # noqa: F401  (registers "oracle")
from services.sim.cluster.lower_bound import CapacityBound, LowerBound, cached_lower_bound, capacity_bound
from services.sim.cluster.metrics import summarize
from services.sim.cluster.simulator import ClusterSim, RunResult, SimConfig
from services.sim.engine import Engine, Profile, get_profile
from services.sim.workload.trace import TraceSession


@dataclass(slots=True)
class PolicyOutcome:
    name: str
    metrics: dict[str, Any]
    run: RunResult
    wall_s: float
    cpu_s: float  # process CPU time: comparable across loaded and idle machines


def run_policy(sessions: Sequence[TraceSession], name: str, cfg: SimConfig,
               profile: Profile | None = None) -> PolicyOutcome:
    """Simulate ``name`` on ``sessions``; ``profile`` overrides ``cfg.profile``. The policy
    estimates prefill and decode times by the engine profile's fits when it has them
    (``services.planner.core.fits``), else by the default profile's."""
    policy = make_policy(name, engine_profile=fitted(profile.name if profile is not None else cfg.profile))
    t0, c0 = time.perf_counter(), time.process_time()
    run = ClusterSim(sessions, policy, cfg, profile=profile).run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    metrics = summarize(run.requests, run.sessions, run.preemptions, run.planner_wall_s, run.busy_s)
    return PolicyOutcome(name, metrics, run, wall, cpu)


def lower_bound_ratio(metrics: dict[str, Any], run: RunResult, bound: LowerBound) -> float:
    """Mean task latency / mean no-contention lower bound, over the sessions that completed."""
    lb = bound.mean_of([s.session_id for s in run.sessions])
    return float(metrics["mean_task_latency_s"]) / lb if lb > 0 else 0.0


def sim_capacity_bound(sessions: Sequence[TraceSession], cfg: SimConfig,
                       profile: Profile | None = None) -> CapacityBound:
    """The capacity bound of ``sessions`` on the fleet ``cfg`` describes (``profile`` overrides
    ``cfg.profile``, as in ``run_policy``)."""
    return capacity_bound(sessions, profile if profile is not None else get_profile(cfg.profile), cfg.replicas,
                          cfg.concurrency, cfg.num_gpu_blocks, cfg.max_num_seqs)


def capacity_ratios(metrics: dict[str, Any], run: RunResult, bound: CapacityBound) -> None:
    """Add ``latency_over_capacity_bound`` (mean task latency / the capacity bound; None when
    vLLM's 400 ended sessions, which the bound counts and the mean leaves out) and
    ``busy_over_work_bound`` (engine-busy seconds / the least engine seconds of the trace)."""
    metrics.update(bound.ratios(float(metrics["mean_task_latency_s"]), run.busy_s, not run.failed))


def machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def compare(
    sessions: Sequence[TraceSession],
    policies: Sequence[str],
    cfg: SimConfig,
    trace_name: str = "",
    progress: Callable[[PolicyOutcome], None] | None = None,
) -> tuple[dict[str, Any], list[PolicyOutcome]]:
    """Run every policy; return the JSON document and the outcomes (for tables and plots).
    Every policy's metrics carry ``latency_over_lower_bound`` (mean task latency / the
    no-contention lower bound, ``services.sim.cluster.lower_bound``; the bound is in
    ``lower_bound``) and the two ratios of ``capacity_ratios`` (the bound in ``capacity_bound``)."""
    profile = get_profile(cfg.profile)
    t0 = time.perf_counter()
    bound = cached_lower_bound(sessions, profile)
    capacity = sim_capacity_bound(sessions, cfg, profile)
    bound_wall = time.perf_counter() - t0
    outcomes = []
    for name in policies:
        out = run_policy(sessions, name, cfg)
        out.metrics["latency_over_lower_bound"] = lower_bound_ratio(out.metrics, out.run, bound)
        capacity_ratios(out.metrics, out.run, capacity)
        outcomes.append(out)
        if progress is not None:
            progress(out)
    eng = Engine(profile, num_gpu_blocks=cfg.num_gpu_blocks)
    config: dict[str, Any] = {
        "trace": trace_name,
        "sessions": len(sessions),
        "turns": sum(len(s.turns) for s in sessions),
        **asdict(cfg),
        "policies": list(policies),
        "kv_tokens_per_replica": eng.num_gpu_blocks * eng.block_size,
        "capacity_tokens_per_replica": int(eng.num_gpu_blocks * eng.block_size * cfg.utilisation_target),
        "sim_wall_s": {o.name: round(o.wall_s, 3) for o in outcomes},
        "sim_cpu_s": {o.name: round(o.cpu_s, 3) for o in outcomes},
        "sim_end_s": {o.name: round(o.run.sim_end_s, 3) for o in outcomes},
        "plans": {o.name: o.run.plans for o in outcomes},
        "incomplete": {o.name: o.run.incomplete for o in outcomes if o.run.incomplete},
        "failed": {o.name: o.run.failed for o in outcomes if o.run.failed},
        "lower_bound_wall_s": round(bound_wall, 3),
        "machine": machine(),
    }
    doc = {"config": config, "lower_bound": bound.to_json(), "capacity_bound": capacity.to_json(),
           "policies": {o.name: o.metrics for o in outcomes}}
    return doc, outcomes
