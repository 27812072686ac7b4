"""Pure-engine speed: simulated engine steps per CPU second, and simulated seconds per CPU second.

The baseline is real time: ``sim_s_per_cpu_s`` > 1 means the model runs faster than the GPU it
models. Times are process CPU time (other processes on a shared machine do not distort them).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from services.sim.engine import ChainCache, Engine, EngineRequest, SyntheticContent, get_profile


@dataclass(frozen=True)
class EngineBenchRow:
    scenario: str
    steps: int
    cpu_s: float
    sim_s: float
    preemptions: int
    hit_rate: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.cpu_s

    @property
    def sim_per_cpu(self) -> float:
        return self.sim_s / self.cpu_s


def _drive(e: Engine, max_steps: int | None = None) -> tuple[int, float, float]:
    t0 = time.process_time()
    steps, sim_s = 0, 0.0
    while e.has_work() and (max_steps is None or steps < max_steps):
        sim_s += e.step().duration_s
        steps += 1
    return steps, time.process_time() - t0, sim_s


def _row(name: str, e: Engine, steps: int, cpu: float, sim_s: float) -> EngineBenchRow:
    q = e.prefix_cache_queries
    return EngineBenchRow(name, steps, cpu, sim_s, e.num_preemptions_total, e.prefix_cache_hits / q if q else 0.0)


def decode_batch(batch: int, steps: int) -> EngineBenchRow:
    e = Engine(get_profile("qwen2.5-3b-h200"))
    for i in range(batch):
        e.add_request(EngineRequest(f"r{i}", SyntheticContent(f"s{i}"), 2000, 10**6 // batch + steps + 10))
    while e.num_waiting:
        e.step()
    e.step()
    n, cpu, sim_s = _drive(e, steps)
    return _row(f"decode batch={batch} ctx=2k", e, n, cpu, sim_s)


def sharegpt(n: int) -> EngineBenchRow:
    rng = random.Random(0)
    e = Engine(get_profile("qwen3-32b-h100x1"))
    added = 0
    while added < n:
        p = int(rng.lognormvariate(math.log(120), 1.1))
        o = int(rng.lognormvariate(math.log(100), 1.2))
        if 4 <= p <= 1024 and o >= 4 and p + o <= 2048:
            e.add_request(EngineRequest(f"r{added}", SyntheticContent(f"s{added}"), p, o))
            added += 1
    steps, cpu, sim_s = _drive(e)
    return _row(f"sharegpt {n} req qwen3-32b-h100x1", e, steps, cpu, sim_s)


def swe_like(sessions: int, turns: int) -> EngineBenchRow:
    """Closed-loop multi-turn sessions, contexts 8k->60k, no tool gaps (worst case for the cache)."""
    rng = random.Random(1)
    e = Engine(get_profile("qwen3-32b-h100x2"))
    chains = ChainCache()
    ctx = {s: rng.randint(8000, 12000) for s in range(sessions)}
    done = dict.fromkeys(range(sessions), 0)
    for s in range(sessions):
        e.add_request(EngineRequest(f"{s}:0", chains.synthetic(f"s{s}", "sys", 6000), ctx[s], rng.randint(100, 500)))
    t0 = time.process_time()
    steps, sim_s = 0, 0.0
    while e.has_work():
        r = e.step()
        steps += 1
        sim_s += r.duration_s
        for f in r.finished:
            s = int(f.request_id.split(":")[0])
            done[s] += 1
            ctx[s] += f.output_tokens + rng.randint(500, 2000)
            if done[s] < turns and ctx[s] < 60000:
                e.add_request(EngineRequest(f"{s}:{done[s]}", chains.synthetic(f"s{s}", "sys", 6000), ctx[s],
                                            rng.randint(100, 500)))
    return _row(f"swe-like {sessions} sessions qwen3-32b-h100x2", e, steps, time.process_time() - t0, sim_s)


def run_engine_bench(quick: bool) -> list[EngineBenchRow]:
    steps = 500 if quick else 3000
    rows = [decode_batch(b, steps) for b in (8, 64, 256)]
    rows.append(sharegpt(200 if quick else 1000))
    rows.append(swe_like(10, 8 if quick else 30))
    if not quick:
        rows.append(swe_like(40, 30))
    return rows
