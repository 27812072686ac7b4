"""How far the simulator and the live stack agree on one trace (pure: no I/O).

The simulator's claims are only worth what the engine model and the policy plumbing are
worth, so we play the same trace both ways and compare (issue 8 §5):

- per metric and policy, the relative gap ``(e2e − sim) / sim``;
- per metric, the policies ranked best-first in each world and Kendall's tau between the two
  rankings, plus the discordant pairs with how far apart the pair is in each world — a swap
  of two policies within noise of each other says much less than a swap across a big gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from services.sim.cluster.metrics import BETTER

#: the metrics compared (the headline three first); preemptions and pause wait are reported
#: too but their sim/e2e definitions differ in detail (see README "Simulator vs live stack")
COMPARED: tuple[str, ...] = (
    "mean_task_latency_s", "mean_ttft_s", "decode_tok_s_makespan", "p90_task_latency_s",
    "mean_ttft_after_tool_s", "prefix_hit_rate", "decode_tok_s_busy",
)


def relative_gap(sim: float, e2e: float) -> float | None:
    """(e2e − sim) / |sim| in percent; None when the simulator's value is 0."""
    if sim == 0:
        return None
    return 100.0 * (e2e - sim) / abs(sim)


def ranking(values: Mapping[str, float], metric: str) -> list[str]:
    """Policies best-first on ``metric`` (ties by name, so the order is deterministic)."""
    lower = BETTER.get(metric, "lower") == "lower"
    return sorted(values, key=lambda p: ((values[p] if lower else -values[p]), p))


def kendall_tau(a: Sequence[str], b: Sequence[str]) -> float:
    """Kendall's tau-a between two orderings of the same items (1 = same order, −1 = reversed)."""
    if sorted(a) != sorted(b):
        raise ValueError("the two rankings must hold the same items")
    n = len(a)
    if n < 2:
        return 1.0
    pos = {p: i for i, p in enumerate(b)}
    concordant = discordant = 0
    for x, y in combinations(a, 2):  # x before y in a
        if pos[x] < pos[y]:
            concordant += 1
        else:
            discordant += 1
    return (concordant - discordant) / (n * (n - 1) / 2)


@dataclass(frozen=True, slots=True)
class Discord:
    """Two policies ordered differently by the simulator and the live stack."""

    metric: str
    first: str  # better in the simulator
    second: str
    sim_gap_pct: float  # how much better ``first`` is in the simulator (positive)
    e2e_gap_pct: float  # how much better ``first`` is live (negative: it is worse)
    #: the live gap is no larger than the live run-to-run spread of either policy on this
    #: metric (only known with repeated live runs): the live order is not resolved
    within_noise: bool = False


def _better_pct(metric: str, a: float, b: float) -> float:
    """How much better ``a`` is than ``b`` on ``metric``, in % of ``b``."""
    if b == 0:
        return 0.0
    d = 100.0 * (a - b) / abs(b)
    return -d if BETTER.get(metric, "lower") == "lower" else d


@dataclass(frozen=True, slots=True)
class MetricAgreement:
    metric: str
    sim_order: list[str]
    e2e_order: list[str]
    tau: float
    discords: list[Discord]
    gaps_pct: dict[str, float | None]  # per policy, (e2e − sim) / sim

    @property
    def same_order(self) -> bool:
        return self.sim_order == self.e2e_order

    @property
    def same_winner(self) -> bool:
        return self.sim_order[0] == self.e2e_order[0]

    @property
    def resolved_discords(self) -> list[Discord]:
        """Discordant pairs whose live gap exceeds the live noise."""
        return [d for d in self.discords if not d.within_noise]


def spread_pct(runs: Sequence[Mapping[str, Any]], metric: str) -> float:
    """(max − min) / |mean| of ``metric`` over repeated runs, in percent (0 for one run)."""
    values = [float(r[metric]) for r in runs if r.get(metric) is not None]
    mean = sum(values) / len(values) if values else 0.0
    if len(values) < 2 or mean == 0:
        return 0.0
    return 100.0 * (max(values) - min(values)) / abs(mean)


def mean_metrics(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Numeric metrics averaged over repeated runs (others from the first run)."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = sum(float(r[k]) for r in runs) / len(runs)
    return out


def agree(sim: Mapping[str, Mapping[str, Any]], e2e: Mapping[str, Mapping[str, Any]],
          metrics: Sequence[str] = COMPARED,
          noise_pct: Mapping[str, Mapping[str, float]] | None = None) -> list[MetricAgreement]:
    """Compare the two worlds' results ({policy: {metric: value}}) over the policies both ran.
    ``noise_pct`` ({policy: {metric: live spread %}}) marks discordant pairs within noise."""
    policies = sorted(set(sim) & set(e2e))
    if len(policies) < 2:
        raise ValueError("need at least two policies present in both results")
    out = []
    for m in metrics:
        if any(sim[p].get(m) is None or e2e[p].get(m) is None for p in policies):
            continue  # not reported by one side (decode_tok_s_busy from replicas without the counter)
        s = {p: float(sim[p][m]) for p in policies}
        e = {p: float(e2e[p][m]) for p in policies}
        so, eo = ranking(s, m), ranking(e, m)
        pos = {p: i for i, p in enumerate(eo)}
        discords = []
        for x, y in combinations(so, 2):
            if pos[x] > pos[y]:
                live_gap = _better_pct(m, e[x], e[y])
                noise = max((noise_pct or {}).get(x, {}).get(m, 0.0), (noise_pct or {}).get(y, {}).get(m, 0.0))
                discords.append(Discord(m, x, y, _better_pct(m, s[x], s[y]), live_gap,
                                        within_noise=noise > 0 and abs(live_gap) <= noise))
        out.append(MetricAgreement(m, so, eo, kendall_tau(so, eo), discords,
                                   {p: relative_gap(s[p], e[p]) for p in policies}))
    return out


def to_json(result: Sequence[MetricAgreement]) -> list[dict[str, Any]]:
    return [
        {"metric": a.metric, "sim_order": a.sim_order, "e2e_order": a.e2e_order, "kendall_tau": round(a.tau, 4),
         "same_order": a.same_order, "same_winner": a.same_winner,
         "gaps_pct": {p: (None if g is None else round(g, 2)) for p, g in a.gaps_pct.items()},
         "discordant_pairs": [{"sim_better": d.first, "sim_worse": d.second, "sim_gap_pct": round(d.sim_gap_pct, 2),
                               "e2e_gap_pct": round(d.e2e_gap_pct, 2), "within_live_noise": d.within_noise}
                              for d in a.discords],
         "resolved_discordant_pairs": len(a.resolved_discords)}
        for a in result
    ]
