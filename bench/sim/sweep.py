"""``python -m bench.sim.sweep``: `tao` against the peers on random configurations a user might run
(docs/benchmarks.md#a-shared-prefix-reserved-once-per-replica-2026-12-05).

The grid and ``bench.sim.unseen`` hold the fleet and the workload kind fixed and vary the trace.
Users vary everything else: the engine profile, the number of replicas, the KV cache (a small
GPU, or a replica shared with other work), closed or open loops, tens of sessions or a few. Each
configuration here is drawn from ``--first`` on (one ``random.Random`` per index, so configuration
*i* is the same in every run): a workload kind and engine profile, 1–6 replicas, 8–64 sessions,
all at once (a closed loop with all, or half, of them active) or Poisson arrivals at 0.02–0.2/s,
and the profile's default KV cache or a half or a quarter of it; sessions end before a turn that
would pass the replica's ``max_model_len`` (less 4,096 tokens), so no policy meets vLLM's 400.
``--mixed`` draws another set in which two workload kinds share the fleet (a quarter, half or
three quarters of the sessions of the first kind, interleaved in arrival order), on 2–8 replicas
with 32–128 sessions, open loops up to 0.3/s and closed loops with a half or a quarter of the
sessions active: coding agents beside chat or batch traffic, as a shared fleet serves them.
Every policy plays the same trace; the table lists, per configuration, `tao`'s mean task latency
against the best peer's, and the summary counts the configurations where `tao` is within 3 %,
3–10 % or more than 10 % behind (a configuration where a session failed under any policy is left
out of the counts).

    python -m bench.sim.sweep [--configs 100] [--first 0] [--mixed] [--jobs 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.sim.cluster.metrics import makespan_s
from services.sim.cluster.runner import run_policy
from services.sim.cluster.simulator import SimConfig
from services.sim.engine.engine import default_max_model_len
from services.sim.engine.profiles import get_profile
from services.sim.workload.generate import GenerateOptions, generate
from services.sim.workload.trace import TraceSession

KINDS = ("swe-lite", "swe-verified", "terminal-bench", "chat-bursty", "batch-steady")
PROFILES = ("qwen3-32b-h100x2", "qwen3-32b-h100x1", "qwen2.5-3b-h200", "glm-4.7-fp8-h100x8")
PEERS = ("thunderagent", "thunderagent-reserved", "sjf", "continuum-affine", "least_loaded", "cache_aware")
"""The gating peers of issue 13 (ThunderAgent with its own token count and on TAO's reservations)
and the per-request routers (least-loaded, the Dynamo cost)."""
SEED_BASE = 5000
"""Configuration ``i`` is drawn by ``random.Random(SEED_BASE + i)``; its trace's seed is 6000 + ``i``."""
MIXED_SEED_BASE = 9000
"""Mixed configuration ``i`` is drawn by ``random.Random(MIXED_SEED_BASE + i)``; its two kinds'
traces have the seeds 7000 + 2``i`` and 7001 + 2``i``."""


@dataclass(frozen=True, slots=True)
class Config:
    index: int
    kind: str
    profile: str
    replicas: int
    sessions: int
    arrival_rate_per_s: float  # 0: all at t = 0
    concurrency: int | None
    cache_share: float  # of the profile's default KV blocks
    #: ``--mixed``: the kind that shares the fleet with ``kind``, and ``kind``'s share of the sessions
    second_kind: str | None = None
    first_share: float = 1.0

    @property
    def num_gpu_blocks(self) -> int | None:
        if self.cache_share >= 1.0:
            return None
        return int(get_profile(self.profile).default_num_gpu_blocks * self.cache_share)

    def label(self) -> str:
        loop = f"at {self.arrival_rate_per_s:g}/s" if self.arrival_rate_per_s else (
            "at once" + ("" if self.concurrency in (None, self.sessions) else f", {self.concurrency} active"))
        cache = "" if self.cache_share >= 1.0 else f", {self.cache_share:g} of the cache"
        kind = self.kind if self.second_kind is None else (
            f"{self.kind} {self.first_share:.0%} + {self.second_kind} {1 - self.first_share:.0%}")
        return f"{kind}, {self.sessions} sessions {loop}, {self.replicas} × {self.profile}{cache}"

    def trace(self, max_context_tokens: int) -> list[TraceSession]:
        """The configuration's trace (deterministic). Mixed: each kind's sessions generated on their
        own (an open loop's rate split by the shares, a closed loop's all at t = 0; generated ids
        name their kind, so they stay unique), interleaved by arrival and then evenly by position,
        so a closed loop starts both kinds side by side."""
        if self.second_kind is None:
            parts = ((6000 + self.index, self.kind, self.sessions),)
        else:
            first = max(1, min(self.sessions - 1, round(self.sessions * self.first_share)))
            parts = ((7000 + 2 * self.index, self.kind, first),
                     (7001 + 2 * self.index, self.second_kind, self.sessions - first))
        keyed: list[tuple[float, float, TraceSession]] = []
        for seed, kind, n in parts:
            # 0 stays 0: every session at t = 0, whatever the kind's own arrival pattern
            rate = self.arrival_rate_per_s * (n / self.sessions)
            part = generate(GenerateOptions(kind=kind, sessions=n, seed=seed, arrival_rate_per_s=rate,
                                            max_context_tokens=max_context_tokens))
            keyed += [(s.arrival_s, (i + 0.5) / n, s) for i, s in enumerate(part)]
        keyed.sort(key=lambda k: (k[0], k[1]))
        return [s for _, _, s in keyed]


def draw(index: int) -> Config:
    r = random.Random(SEED_BASE + index)
    kind, profile = r.choice(KINDS), r.choice(PROFILES)
    replicas = r.choice((1, 2, 2, 3, 4, 6))
    sessions = r.choice((8, 16, 24, 32, 48, 64))
    rate = r.choice((0.0, 0.0, 0.02, 0.05, 0.2))
    concurrency = r.choice((None, sessions, max(1, sessions // 2))) if rate == 0 else None
    share = r.choice((1.0, 1.0, 0.5, 0.25))
    return Config(index, kind, profile, replicas, sessions, rate, concurrency, share)


def draw_mixed(index: int) -> Config:
    """Mixed configuration ``index`` (``--mixed``): two kinds on one fleet, larger than ``draw``'s."""
    r = random.Random(MIXED_SEED_BASE + index)
    kind, second = r.sample(KINDS, 2)
    profile = r.choice(PROFILES)
    replicas = r.choice((2, 3, 4, 6, 8))
    sessions = r.choice((32, 48, 64, 96, 128))
    rate = r.choice((0.0, 0.0, 0.05, 0.1, 0.3))
    concurrency = r.choice((None, sessions // 2, sessions // 4)) if rate == 0 else None
    share = r.choice((1.0, 1.0, 0.5, 0.25))
    first_share = r.choice((0.25, 0.5, 0.75))
    return Config(index, kind, profile, replicas, sessions, rate, concurrency, share, second, first_share)


def simulate(task: tuple[Config, str]) -> dict[str, Any]:
    """One policy on one configuration's trace."""
    cfg, policy = task
    profile = get_profile(cfg.profile)
    blocks = cfg.num_gpu_blocks
    mml = default_max_model_len(profile, profile.default_num_gpu_blocks if blocks is None else blocks)
    trace = cfg.trace(max_context_tokens=min(131072, mml - 4096))
    sim = SimConfig(replicas=cfg.replicas, profile=cfg.profile, concurrency=cfg.concurrency, seed=0,
                    num_gpu_blocks=blocks)
    out = run_policy(trace, policy, sim)
    return {"index": cfg.index, "policy": policy, "latency_s": out.metrics["mean_task_latency_s"],
            "ttft_s": out.metrics["mean_ttft_s"], "makespan_s": makespan_s(out.run.sessions),
            "failed": len(out.run.failed), "incomplete": len(out.run.incomplete)}


def summarize(configs: Sequence[Config], results: Sequence[dict[str, Any]], peers: Sequence[str]) -> dict[str, Any]:
    """Per configuration `tao` against the best peer on mean task latency (+ = `tao` behind), and
    the counts within 3 %, 3–10 % and beyond 10 % behind. Where every session arrives at once (a
    batch, as an RL rollout step launches one) the batch's makespan, first start to last end, is the
    other figure users judge by: the same comparison and counts on it (``batch_makespan_counts``)."""
    by = {(r["index"], r["policy"]): r for r in results}
    rows, counts = [], {"within_3pct": 0, "3_to_10pct": 0, "over_10pct": 0, "left_out": 0}
    batch = {"within_3pct": 0, "3_to_10pct": 0, "over_10pct": 0}

    def bucket(gap: float) -> str:
        return "within_3pct" if gap <= 3 else "3_to_10pct" if gap <= 10 else "over_10pct"

    for c in configs:
        mine = [by[(c.index, p)] for p in ("tao", *peers) if (c.index, p) in by]
        if len(mine) < 1 + len(peers) or any(r["failed"] or r["incomplete"] for r in mine):
            counts["left_out"] += 1
            continue
        tao, best = mine[0], min(mine[1:], key=lambda r: r["latency_s"])
        if best["latency_s"] <= 0:
            counts["left_out"] += 1
            continue
        gap = 100.0 * (tao["latency_s"] / best["latency_s"] - 1.0)
        counts[bucket(gap)] += 1
        row = {"index": c.index, "config": c.label(), "tao_s": tao["latency_s"], "best_peer": best["policy"],
               "best_s": best["latency_s"], "tao_behind_pct": gap}
        if c.arrival_rate_per_s == 0 and all(r.get("makespan_s", 0.0) > 0 for r in mine):
            first = min(mine[1:], key=lambda r: r["makespan_s"])
            row |= {"tao_makespan_s": tao["makespan_s"], "best_makespan_peer": first["policy"],
                    "best_makespan_s": first["makespan_s"],
                    "tao_makespan_behind_pct": 100.0 * (tao["makespan_s"] / first["makespan_s"] - 1.0)}
            batch[bucket(row["tao_makespan_behind_pct"])] += 1
        rows.append(row)
    return {"rows": rows, "counts": counts, "batch_makespan_counts": batch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=100)
    ap.add_argument("--first", type=int, default=0, help="index of the first configuration")
    ap.add_argument("--mixed", action="store_true", help="two workload kinds share each fleet (another set)")
    ap.add_argument("--policies", default="tao," + ",".join(PEERS), help="tao first, then the peers")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, dest="json_out")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if args.configs <= 0 or args.jobs <= 0 or not policies or policies[0] != "tao" or len(policies) < 2:
        ap.error("--configs and --jobs must be > 0, and --policies must start with tao and name a peer")
    configs = [(draw_mixed if args.mixed else draw)(i) for i in range(args.first, args.first + args.configs)]
    tasks = [(c, p) for c in configs for p in policies]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(simulate, tasks))
    summary = summarize(configs, results, policies[1:])
    for row in summary["rows"]:
        print(f"{row['index']:4d}  {row['config']:<100}  tao {row['tao_s']:9.1f} s  best {row['best_peer']:<16} "
              f"{row['best_s']:9.1f} s  {row['tao_behind_pct']:+6.1f} %"
              + (f"   makespan {row['tao_makespan_behind_pct']:+6.1f} % ({row['best_makespan_peer']})"
                 if "tao_makespan_behind_pct" in row else ""))
    c = summary["counts"]
    print(f"tao against the best of {', '.join(policies[1:])} on mean task latency: within 3 % on "
          f"{c['within_3pct']}, 3–10 % behind on {c['3_to_10pct']}, more than 10 % behind on {c['over_10pct']} "
          f"({c['left_out']} left out: a session failed); {time.perf_counter() - t0:.0f} s wall")
    b = summary["batch_makespan_counts"]
    print(f"on the makespan of the {sum(b.values())} where every session arrives at once: within 3 % on "
          f"{b['within_3pct']}, 3–10 % behind on {b['3_to_10pct']}, more than 10 % behind on {b['over_10pct']}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"configs": [asdict(x) for x in configs], "results": results,
                                             **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
