"""How accurate is cache credit? The router's KV-event index vs the engines' true residency vs the
usage-derived, time-decayed estimate, measured in the discrete-event simulator.

    python -m bench.kv_credit --kind swe-lite --sessions 24 --replicas 2 --blocks 6000

One ``ClusterSim`` run of a policy (default ``tao``) whose engines record vLLM KV events
(``services/sim/engine``); every batch goes, in sequence, through the router's ``KVBlockIndex``
(``services/router/core/kv_index.py``), with ``--drop`` of the batches lost and recovered
from a replay buffer the way the router's subscriber does. At every planner snapshot, for
every idle session that has run a request and every replica, it compares with the truth
T = the leading blocks of the session's last context (prompt + output) the replica's engine
holds now, in tokens (measured for every session not running a request: admitted ones
between requests and the pool):

- ``index``: the leading blocks of the session's last *prompt* the index says the replica
  holds (what the live router knows: it learns prompts, not outputs, see
  ``services/router/kv_events.py``);
- ``index_ctx``: the same over the whole last context (what the router would know if it also
  learned the output's token ids);
- ``decayed``: the planner's credit k = k0 · 2^(−τ/10 s) from the router's usage evidence
  (``cached_tokens``: k0 = last prompt + output on the replica that served it, 0 elsewhere);
- ``k0``: the same evidence undecayed.

Reported: mean absolute error / mean T, the share of (session, replica) pairs over- and
under-credited by more than one block, and the share of sessions whose best replica (largest
credit) holds the most of them.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.kv_events import KVEventBatch
from services.planner.core.registry import make_policy
from services.planner.core.values import credit_matrix
from services.router.core.kv_index import KVBlockIndex, block_digests
from services.sim.cluster.simulator import ClusterSim, SimConfig, _Replica
from services.sim.engine.tokens import SyntheticContent
from services.sim.workload.generate import GenerateOptions, generate

ESTIMATORS = ("index", "index_ctx", "decayed", "k0")


@dataclass
class Tally:
    pairs: int = 0
    truth_sum: int = 0
    abs_err: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ESTIMATORS, 0))
    over: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ESTIMATORS, 0))
    under: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ESTIMATORS, 0))
    sessions: int = 0
    best_ok: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ESTIMATORS, 0))


class MeasuredSim(ClusterSim):
    """``ClusterSim`` whose engines publish KV events into a ``KVBlockIndex``; measures at each plan."""

    def __init__(self, *args: object, drop: float = 0.0, seed: int = 0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.index = KVBlockIndex()
        self.buffers: dict[str, list[KVEventBatch]] = {}
        self.rng = random.Random(seed)
        self.drop = drop
        self.dropped = 0
        self.tally = Tally()
        self._digests: dict[str, tuple[SyntheticContent, list[int]]] = {}
        for rep in self.replicas:
            rep.engine.enable_kv_events()
            self.buffers[rep.id] = []

    def _kick(self, rep: _Replica) -> None:
        super()._kick(rep)
        events = rep.engine.take_kv_events()
        if not events:
            return
        buf = self.buffers[rep.id]
        seq = len(buf)
        buf.append(KVEventBatch(self.now, events))
        if self.rng.random() < self.drop:
            self.dropped += 1
            return  # lost on the wire; the next batch reveals the gap
        if self.index.offer(rep.id, seq, buf[seq]).outcome == "gap":
            for s in range(self.index.expected(rep.id), seq + 1):  # the replay socket's answer
                self.index.offer(rep.id, s, buf[s], live=False)

    def _prompt_digests(self, sid: str, content: SyntheticContent, tokens: int, bs: int) -> list[int]:
        have = self._digests.get(sid)
        if have is None or have[0] is not content:
            have = (content, [])
            self._digests[sid] = have
        digests = have[1]
        want = tokens // bs
        if len(digests) < want:
            start = len(digests)
            parent = digests[-1] if digests else 0
            digests.extend(block_digests(content.token_ids(start * bs, want * bs), bs, parent))
        return digests[:want]

    def _plan_and_apply_later(self) -> None:
        if self.active:
            self._measure()
        super()._plan_and_apply_later()

    def _measure(self) -> None:
        snap = self.snapshot()
        reps = snap.replicas
        pool = [ses for ses in snap.sessions if ses.phase != "RUNNING" and ses.credits]
        if not pool:
            return
        decayed = credit_matrix(snap.now_s, pool, reps)
        k0 = credit_matrix(snap.now_s, pool, reps, half_life_s=None)
        t = self.tally
        for i, ses in enumerate(pool):
            s = self.by_id[ses.id]
            if s.content is None or s.last_prompt_tokens == 0:
                continue
            truth: list[int] = []
            est: dict[str, list[int]] = {e: [] for e in ESTIMATORS}
            for j, r in enumerate(reps):
                eng = self.rep_by_id[r.id].engine
                bs = eng.block_size
                truth.append(eng.resident_prefix_blocks(s.content, s.context_tokens) * bs)
                ctx = self._prompt_digests(s.id, s.content, s.context_tokens, bs)
                got = self.index.prefix_blocks(r.id, ctx[:s.last_prompt_tokens // bs])
                est["index"].append((got or 0) * bs)
                est["index_ctx"].append((self.index.prefix_blocks(r.id, ctx) or 0) * bs)
                est["decayed"].append(int(decayed[i, j]))
                est["k0"].append(int(k0[i, j]))
            for j in range(len(reps)):
                t.pairs += 1
                t.truth_sum += truth[j]
                for e in ESTIMATORS:
                    err = est[e][j] - truth[j]
                    t.abs_err[e] += abs(err)
                    t.over[e] += err > bs
                    t.under[e] += err < -bs
            if max(truth) > 0:
                t.sessions += 1
                best = max(truth)
                for e in ESTIMATORS:
                    row = est[e]
                    pick = max(range(len(reps)), key=lambda j: (row[j], -j))
                    t.best_ok[e] += truth[pick] == best


def measure(kind: str, sessions: int, replicas: int, blocks: int | None, policy: str, seed: int,
            drop: float, max_turns: int | None) -> tuple[Tally, MeasuredSim, float]:
    trace = generate(GenerateOptions(kind=kind, sessions=sessions, seed=seed, max_turns=max_turns))
    t0 = time.perf_counter()
    sim = MeasuredSim(trace, make_policy(policy), SimConfig(replicas=replicas, num_gpu_blocks=blocks, seed=seed),
                      drop=drop, seed=seed)
    sim.run()
    return sim.tally, sim, time.perf_counter() - t0


def effect(kind: str, sessions: int, replicas: int, blocks: int | None, policy: str, seed: int,
           max_turns: int | None) -> int:
    """The policy's outcome with the router's usage-derived credit vs with ``kv_events`` credit."""
    from services.sim.cluster.runner import run_policy

    trace = generate(GenerateOptions(kind=kind, sessions=sessions, seed=seed, max_turns=max_turns))
    keys = ("mean_task_latency_s", "p90_task_latency_s", "prefix_hit_rate", "mean_ttft_after_tool_s", "preemptions")
    print(f"| {kind}, {sessions} sessions, {replicas} replicas, policy {policy} | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for kv in (False, True):
        out = run_policy(trace, policy, SimConfig(replicas=replicas, num_gpu_blocks=blocks, seed=seed,
                                                  kv_events_credit=kv))
        print(f"| {'kv_events' if kv else 'usage (decayed)'} credit | "
              + " | ".join(f"{float(out.metrics[k]):.3f}" for k in keys) + " |")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="swe-lite")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=None, help="KV blocks per replica (default: the profile's)")
    ap.add_argument("--policy", default="tao")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drop", type=float, default=0.0, help="share of event batches lost (recovered by replay)")
    ap.add_argument("--max-turns", type=int, default=None)
    ap.add_argument("--effect", action="store_true",
                    help="instead: run the policy with usage credit and with kv_events credit (SimConfig."
                         "kv_events_credit) on the same trace and compare task latency")
    a = ap.parse_args(argv)
    if a.effect:
        return effect(a.kind, a.sessions, a.replicas, a.blocks, a.policy, a.seed, a.max_turns)
    t, sim, wall = measure(a.kind, a.sessions, a.replicas, a.blocks, a.policy, a.seed, a.drop, a.max_turns)
    if t.pairs == 0:
        print("no pool session was measured")
        return 1
    mean_truth = t.truth_sum / t.pairs
    evictions = sum(r.engine.pool.num_evictions for r in sim.replicas)
    print(f"{a.kind}, {a.sessions} sessions, {a.replicas} replicas x {sim.replicas[0].engine.num_gpu_blocks} blocks, "
          f"policy {a.policy}, seed {a.seed}: {t.pairs} (session, replica) pairs at {sim.counters['plans_applied']} plans, "
          f"{t.sessions} sessions with something resident; mean truth {mean_truth:.0f} tokens; "
          f"{evictions} evicted blocks; {sim.dropped} event batches dropped and replayed; {wall:.1f} s")
    print("| estimator | MAE / mean truth | pairs over by > 1 block | pairs under by > 1 block | best replica right |")
    print("|---|---|---|---|---|")
    for e in ESTIMATORS:
        mae = t.abs_err[e] / t.pairs / mean_truth if mean_truth else 0.0
        print(f"| {e} | {mae:.3f} | {t.over[e] / t.pairs:.1%} | {t.under[e] / t.pairs:.1%} | "
              f"{t.best_ok[e] / max(1, t.sessions):.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
