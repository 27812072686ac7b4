"""Tenant workloads and scenarios of the budget benchmark (the budget-controller study's
scenario, made explicit).

The seed (real H200, Qwen2.5-3B-Instruct, B = 96, 90 s) gives: tenant A a bursty chat
tenant with short 64-token outputs that alternates bursts and idle gaps and "spends a
considerable part of the interval idle"; tenant B a batch tenant with 512-token outputs
whose completed slots are refilled at once ("closed-loop backpressure so the batch never
drains"). It gives no prompt lengths, burst rates or on/off times; the values below are
ours, stated here and printed with the results.

Latency is measured where each tenant feels it: for open-loop tenants (A, C) from arrival
at the admission point, so time held for a slot counts; for the closed-loop batch tenant
from admission, since its backlog is infinite by construction (a queue wait there would
only measure the backlog length we chose).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Kind = Literal["onoff", "poisson", "closed"]


@dataclass(frozen=True)
class TenantLoad:
    name: str
    kind: Kind
    output_tokens: int
    prompt_tokens: tuple[int, int]  # uniform range of the per-request part of the prompt
    system_prompt_tokens: int  # shared by all requests of the tenant (prefix-cacheable)
    rate_per_s: float = 0.0  # poisson rate; for onoff, the rate during ON
    on_s: float = 0.0
    off_s: float = 0.0
    outstanding: int = 0  # closed loop: requests kept queued or in flight at all times
    floor: int = 0
    weight: float = 1.0
    p99_slo_s: float | None = None

    def describe(self) -> str:
        prompt = f"prompt {self.system_prompt_tokens}+U{self.prompt_tokens}, output {self.output_tokens}"
        if self.kind == "onoff":
            return (f"{self.name}: bursty on/off, ON {self.on_s:g} s at {self.rate_per_s:g} req/s (Poisson), "
                    f"OFF {self.off_s:g} s (idle {self.off_s / (self.on_s + self.off_s):.0%}), {prompt}")
        if self.kind == "poisson":
            return f"{self.name}: steady Poisson {self.rate_per_s:g} req/s, {prompt}"
        return f"{self.name}: closed loop, {self.outstanding} outstanding (never drains), {prompt}"

    def arrivals(self, end_s: float, rng: random.Random) -> list[float]:
        """Arrival times in [0, end_s) of an open-loop tenant (random phase for on/off)."""
        return self.schedule(end_s, rng)[0]

    def schedule(self, end_s: float, rng: random.Random) -> tuple[list[float], list[tuple[float, float]]]:
        """``arrivals`` and, for on/off, every ON window [start, end) that begins before
        ``end_s`` plus one period (the foresight reference, ``bench/budget/foresight.py``, looks
        one window ahead); the same draws from ``rng`` as ``arrivals``."""
        if self.kind == "closed" or self.rate_per_s <= 0:
            return [], []
        out: list[float] = []
        if self.kind == "poisson":
            t = rng.expovariate(self.rate_per_s)
            while t < end_s:
                out.append(t)
                t += rng.expovariate(self.rate_per_s)
            return out, []
        period = self.on_s + self.off_s
        start = -rng.uniform(0.0, period)  # random phase of the on/off cycle
        windows: list[tuple[float, float]] = []
        while start < end_s:
            windows.append((start, start + self.on_s))
            t = max(0.0, start) + rng.expovariate(self.rate_per_s)
            while t < min(start + self.on_s, end_s):
                out.append(t)
                t += rng.expovariate(self.rate_per_s)
            start += period
        windows.append((start, start + self.on_s))
        return out, windows


@dataclass(frozen=True)
class PolicySpec:
    """One compared policy: a registry name and overrides of the controller's parameters
    (``DynamicParams`` field -> value) for this run only."""

    label: str
    registry: str
    overrides: tuple[tuple[str, Any], ...] = ()


#: the controller as the budget-controller study shipped it (issue 19's starting point): no
#: burst reserve, no gap lending, no p99 guard
V0 = (("burst_reserve_frac", 0.0), ("lend_horizon_s", 0.0), ("slo_guard_frac", 1e9))
STATIC_VS_DYNAMIC = (PolicySpec("static", "static"), PolicySpec("dynamic-v0", "dynamic", V0),
                     PolicySpec("dynamic", "dynamic"))


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    tenants: tuple[TenantLoad, ...]
    total_slots: int = 96
    profile: str = "qwen2.5-3b-h200"
    warmup_s: float = 10.0
    measure_s: float = 90.0
    tick_s: float = 2.0
    policies: tuple[PolicySpec, ...] = STATIC_VS_DYNAMIC
    notes: tuple[str, ...] = field(default_factory=tuple)

    def quick(self) -> Scenario:
        return replace(self, warmup_s=4.0, measure_s=30.0)


CHAT_A = TenantLoad("A", "onoff", output_tokens=64, prompt_tokens=(64, 448), system_prompt_tokens=128,
                    rate_per_s=60.0, on_s=8.0, off_s=12.0, floor=4)
BATCH_B = TenantLoad("B", "closed", output_tokens=512, prompt_tokens=(256, 768), system_prompt_tokens=256,
                     outstanding=192, floor=4)
STEADY_C = TenantLoad("C", "poisson", output_tokens=128, prompt_tokens=(128, 512), system_prompt_tokens=128,
                      rate_per_s=20.0, floor=4)

SEED = Scenario(
    "seed", "the budget-controller study: bursty chat A vs saturating batch B, B = 96, static {A:48, B:48} vs dynamic",
    (CHAT_A, BATCH_B),
    policies=STATIC_VS_DYNAMIC,
)
THREE = Scenario(
    "three-tenants", "third tenant C (steady interactive, 20 req/s, 128-token outputs); static split 32/32/32",
    (CHAT_A, BATCH_B, STEADY_C),
)
FLOOD_X = TenantLoad("X", "onoff", output_tokens=64, prompt_tokens=(64, 448), system_prompt_tokens=128,
                     rate_per_s=80.0, on_s=4.0, off_s=4.0, floor=4)
ADVERSARIAL = Scenario(
    "adversarial", "tenant X alternates idle and flood (80 req/s) every 4 s against the 2 s tick, vs saturating "
    "batch B; static {X:48, B:48}",
    (FLOOD_X, BATCH_B),
)
SLO = Scenario(
    "slo", "A bursts above its fair share (110 req/s ON) with a 1.5 s p99 SLO; dynamic with and without SLO boost",
    (replace(CHAT_A, rate_per_s=110.0, p99_slo_s=1.5), BATCH_B),
    policies=(PolicySpec("static", "static"), PolicySpec("dynamic-v0", "dynamic", V0),
              PolicySpec("dynamic-slo-blind", "dynamic", (("slo_boost", 1.0), ("slo_guard_frac", 1e9))),
              PolicySpec("dynamic", "dynamic")),
)
LONG = Scenario(
    "long-batch", "the seed case with B's requests 2,048 tokens long (~17 s a slot at 48 in flight): a slot lent "
    "in A's gap comes back long after A's next burst has started",
    (CHAT_A, replace(BATCH_B, output_tokens=2048)),
)
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (SEED, THREE, ADVERSARIAL, SLO, LONG)}
