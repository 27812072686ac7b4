"""The TAO paper's 12-configuration grid, mirrored on the engine model.

The paper's setups: DeepSeek-V4-Flash on 2 nodes × 4×H100 (SWE-bench Lite with mini-SWE-agent and
Terminal-Bench 2.0 with a Claude-Code harness), Qwen3-32B on 4 nodes × 2×H100 (SWE-bench
Verified at 96/128/160 workers), GLM-4.7 on one 8×H100 node (SWE-bench Lite). Here:

- ``qwen``: 4 replicas of ``qwen3-32b-h100x2`` (TP2), ``swe-verified``, 500 sessions (the size of
  SWE-bench Verified), concurrency 96 / 128 / 160 — exactly the paper's worker counts;
- ``glm``: 1 replica of ``glm-4.7-fp8-h100x8`` (TP8), ``swe-lite``, 300 sessions (SWE-bench
  Lite), concurrency 32 / 48 / 64 — the paper gives no worker counts; these put the same
  sessions-per-KV-token pressure on its 548k-token cache as 96–160 put on Qwen's 4 × 301k;
- ``2node``: 2 replicas × 4×H100 with ``swe-lite`` (300 sessions, concurrency 96 / 128 / 160) and
  ``terminal-bench`` (178 sessions = 2 attempts of the 89 tasks, concurrency 32 / 48 / 64).
  STAND-IN: the engine model has no DeepSeek-V4-Flash profile (its compressed sparse attention
  is not modelled), so these replicas serve Qwen3-32B with TP4 (``QWEN3_32B_H100X4`` below:
  the engine's Qwen3-32B profile with tp=4, 852k KV tokens per replica). The numbers are for
  that model, not DeepSeek's.

Policies: TAO, the oracle and the baselines on every configuration; the ablations (the paper's
component analysis: − credit decay, − readiness, ThunderAgent pause order, BFD instead of DP)
on the middle concurrency of each setup (``ablation=True``), as the paper reports them on one
setup. "Best baseline" is the best of the external systems the paper compares against:
round-robin, least-loaded, cache-aware (Dynamo's KV router cost) and ThunderAgent; SJF
(the paper's DP comparison) is reported next to them but not counted as a system baseline.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from services.sim.engine.profiles import GLM47_FP8_H100X8, QWEN3_32B_H100X2, Profile
from services.sim.workload.generate import GenerateOptions, generate

QWEN3_32B_H100X4 = replace(QWEN3_32B_H100X2, name="qwen3-32b-h100x4", tp=4)
"""Qwen3-32B with TP4 on 4×H100 — the 2-node setup's stand-in model (see module docstring)."""

SYSTEM_BASELINES: tuple[str, ...] = ("round_robin", "least_loaded", "cache_aware", "thunderagent", "continuum",
                                     "sjf")
"""What "the best baseline" is taken over: every system a user could run instead (the per-request
routers, Dynamo's KV-router cost, ThunderAgent, Continuum) and the TAO paper's SJF comparison."""
OTHER_BASELINES: tuple[str, ...] = ("tao-paper",)
"""Reported next to the baselines, never counted as one: the TAO paper's own policy."""
MAIN_POLICIES: tuple[str, ...] = ("tao", "oracle", *SYSTEM_BASELINES, *OTHER_BASELINES)
ABLATIONS: tuple[str, ...] = ("tao-no-decay", "tao-no-readiness", "tao-ta-pause", "tao-bfd")


@dataclass(frozen=True, slots=True)
class GridPoint:
    key: str
    setup: str
    profile: Profile
    replicas: int
    kind: str
    sessions: int
    concurrency: int
    ablation: bool = False
    num_gpu_blocks: int | None = None  # smaller KV caches (quick runs), None = the profile's

    @property
    def policies(self) -> tuple[str, ...]:
        return MAIN_POLICIES + (ABLATIONS if self.ablation else ())


def _points(setup: str, profile: Profile, replicas: int, kind: str, sessions: int,
            levels: tuple[int, int, int]) -> list[GridPoint]:
    return [GridPoint(f"{setup}/{kind}/c{c}", setup, profile, replicas, kind, sessions, c, ablation=(i == 1))
            for i, c in enumerate(levels)]


GRID: tuple[GridPoint, ...] = tuple(
    _points("qwen-4xTP2", QWEN3_32B_H100X2, 4, "swe-verified", 500, (96, 128, 160))
    + _points("glm-1xTP8", GLM47_FP8_H100X8, 1, "swe-lite", 300, (32, 48, 64))
    + _points("2node-2xTP4", QWEN3_32B_H100X4, 2, "swe-lite", 300, (96, 128, 160))
    + _points("2node-2xTP4", QWEN3_32B_H100X4, 2, "terminal-bench", 178, (32, 48, 64))
)


def quick_grid() -> tuple[GridPoint, ...]:
    """A smoke version: one small point per setup, TAO + oracle + two baselines + one ablation.
    The KV caches are shrunk so that a few short sessions already contend for them."""
    return (
        GridPoint("qwen-4xTP2/swe-verified/quick", "qwen-4xTP2", QWEN3_32B_H100X2, 4, "swe-verified", 24, 24,
                  ablation=True, num_gpu_blocks=2500),
        GridPoint("glm-1xTP8/swe-lite/quick", "glm-1xTP8", GLM47_FP8_H100X8, 1, "swe-lite", 16, 16,
                  num_gpu_blocks=5000),
        GridPoint("2node-2xTP4/terminal-bench/quick", "2node-2xTP4", QWEN3_32B_H100X4, 2, "terminal-bench",
                  16, 16, num_gpu_blocks=8000),
    )


QUICK_POLICIES: tuple[str, ...] = ("tao", "oracle", "thunderagent", "round_robin")
QUICK_ABLATIONS: tuple[str, ...] = ("tao-bfd",)
QUICK_MAX_TURNS = 12


# --------------------------------------------------------------------------- the fast grid
#
# ``python -m bench.sim --fast``: the same 12 configurations (setups, profiles, replica counts,
# workload kinds, three concurrency levels, ablations at the middle one), scaled down to run in
# ≤ 10 min wall with ``--jobs 2`` on a 2-core machine. The scaling keeps the contention regime:
#
# 1. turns per session are capped at ``FAST_MAX_TURNS`` (session i is still session i of the
#    full trace, cut short: ``services.sim.workload.generate``);
# 2. concurrency C' = round(c · C) with a per-(setup, workload) factor c (``FAST_CONCURRENCY_SCALE``);
# 3. KV blocks per replica B' = ceil(B · (C'/C) · occ'/occ), where occ is the turn-weighted mean
#    prompt of the trace (Σ over all turns of the prompt tokens / number of turns — the KV a
#    session in flight holds on average) and occ' that of the capped trace. This keeps
#    ρ = C · occ / (replicas · B · block_size), the concurrency over how many sessions fit in
#    the KV caches, equal to the full grid's; sessions fitting per replica shrink by c;
# 4. sessions N' = C' · min(N/C, ``FAST_WAVES``): the closed loop still turns over a few waves
#    (the full grid's own N/C is 1.9–9.4), never more sessions than the full grid's.
#
# Every session's last prompt (plus its output) must fit B' blocks (the simulator refuses
# otherwise); ``fast_grid`` checks it and tests/unit/cluster/test_fast_grid.py too. What the
# scale cannot keep: the cap shortens the longest sessions (less spread in session length) and
# halves contexts, so a cache miss costs less re-prefill relative to decode; c < 1 makes each
# session a larger share of a replica's KV. c is 1 for GLM (one replica, cheap) and as small as
# the largest capped session allows elsewhere (0.4: ~4 sessions fit a replica's KV instead of
# ~9–12; terminal-bench 0.5). Measured on GLM c48 (TAO vs round-robin, mean latency): full grid
# +55.9 %; capped at 24 turns with C and ρ kept +25 % (2.5 or 6.25 waves alike) — the cap, not
# the waves, narrows the per-request routers' gap. Check a ranking with ``--agreement FULL FAST``.

FAST_MAX_TURNS = 24
FAST_WAVES = 2.0
FAST_CONCURRENCY_SCALE: dict[str, float] = {
    "qwen-4xTP2/swe-verified": 0.4,
    "glm-1xTP8/swe-lite": 1.0,
    "2node-2xTP4/swe-lite": 0.4,
    "2node-2xTP4/terminal-bench": 0.5,
}
FAST_POLICIES: tuple[str, ...] = ("tao", "tao-paper", "oracle", "thunderagent", "continuum", "cache_aware", "sjf",
                                  "round_robin", "least_loaded")
FAST_ABLATIONS: tuple[str, ...] = ABLATIONS
FAST_SUFFIX = "/fast"


@functools.cache
def _occupancy_and_max(kind: str, sessions: int, seed: int, max_turns: int | None) -> tuple[float, int]:
    """(turn-weighted mean prompt tokens, largest final context = last prompt + its output)."""
    trace = generate(GenerateOptions(kind=kind, sessions=sessions, seed=seed, max_turns=max_turns))
    prompts = turns = 0
    largest = 0
    for s in trace:
        last = len(s.turns) - 1
        prompts += sum(s.prompt_tokens(i) for i in range(len(s.turns)))
        turns += len(s.turns)
        largest = max(largest, s.prompt_tokens(last) + s.turns[last].output_tokens)
    return prompts / turns, largest


def fast_point(p: GridPoint, scale: float, max_turns: int = FAST_MAX_TURNS, waves: float = FAST_WAVES,
               seed: int = 0) -> GridPoint:
    """``p`` scaled down by the rule above (key: ``p.key`` + ``/fast``)."""
    c = max(2, round(p.concurrency * scale))
    n = min(p.sessions, max(c, round(c * min(p.sessions / p.concurrency, waves))))
    occ_full, _ = _occupancy_and_max(p.kind, p.sessions, seed, None)
    occ_fast, largest = _occupancy_and_max(p.kind, n, seed, max_turns)
    blocks_full = p.num_gpu_blocks or p.profile.default_num_gpu_blocks
    blocks = math.ceil(blocks_full * (c / p.concurrency) * occ_fast / occ_full)
    if largest >= min(blocks * p.profile.block_size, p.profile.max_model_len):
        raise ValueError(f"{p.key}: a session of {largest} tokens does not fit {blocks} blocks; raise its scale")
    return replace(p, key=p.key + FAST_SUFFIX, sessions=n, concurrency=c, num_gpu_blocks=blocks)


@functools.cache
def fast_grid(seed: int = 0) -> tuple[GridPoint, ...]:
    """The full grid's 12 configurations scaled down (see the rule above)."""
    return tuple(fast_point(p, FAST_CONCURRENCY_SCALE[f"{p.setup}/{p.kind}"], seed=seed) for p in GRID)
