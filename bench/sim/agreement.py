"""Do two grid runs rank the policies alike? (``python -m bench.sim --agreement FULL.json FAST.json``)

For each configuration in both files (a fast-grid key ``…/fast`` matches the full key without
the suffix) and each metric — mean task latency, mean TTFT, both decode throughputs — the
policies both runs have, ranked best-first in each, Kendall's tau between the two rankings
and whether the winner is the same (``bench.agreement.compare.agree``, the simulator-vs-live
comparison); then per metric the mean tau and the share of configurations whose winner agrees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.agreement.compare import agree
from bench.sim.grid import FAST_SUFFIX

METRICS: tuple[str, ...] = ("mean_task_latency_s", "mean_ttft_s", "decode_tok_s_makespan", "decode_tok_s_busy")
SHORT = {"mean_task_latency_s": "latency", "mean_ttft_s": "TTFT", "decode_tok_s_makespan": "decode (makespan)",
         "decode_tok_s_busy": "decode (busy)"}

Grid = dict[str, dict[str, dict[str, Any]]]  # configuration -> policy -> metrics


def base_key(key: str) -> str:
    return key.removesuffix(FAST_SUFFIX)


def load_grid(path: str | Path) -> Grid:
    """{configuration (fast suffix dropped): {policy: metrics}} from a ``--json`` output."""
    doc = json.loads(Path(path).read_text())
    return {base_key(c["key"]): c["policies"] for c in doc["configurations"]}


def grid_agreement(full: Mapping[str, Mapping[str, Mapping[str, Any]]],
                   fast: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Per configuration and metric: both rankings, tau, same winner; per metric the mean tau and
    the share of configurations whose winner agrees."""
    per: dict[str, dict[str, Any]] = {}
    for key in full:
        if key not in fast or len(set(full[key]) & set(fast[key])) < 2:
            continue
        per[key] = {a.metric: {"full_order": a.sim_order, "fast_order": a.e2e_order, "kendall_tau": a.tau,
                               "same_winner": a.same_winner}
                    for a in agree(full[key], fast[key], METRICS)}
    overall: dict[str, Any] = {}
    for m in METRICS:
        rows = [p[m] for p in per.values() if m in p]
        if rows:
            overall[m] = {"configurations": len(rows),
                          "mean_kendall_tau": sum(r["kendall_tau"] for r in rows) / len(rows),
                          "min_kendall_tau": min(r["kendall_tau"] for r in rows),
                          "winner_agrees_share": sum(r["same_winner"] for r in rows) / len(rows)}
    return {"metrics": list(METRICS), "per_configuration": per, "overall": overall}


def agreement_table(result: Mapping[str, Any]) -> list[Table]:
    metrics = [m for m in result["metrics"] if m in result["overall"]]
    t = Table(title="full vs fast grid: Kendall tau of the policy rankings (winner: = same, ≠ differs)")
    t.add_column("configuration")
    for m in metrics:
        t.add_column(SHORT[m], justify="right")
    t.add_column("winners full / fast (latency)")
    for key, p in result["per_configuration"].items():
        cells = ["—" if m not in p else f"{p[m]['kendall_tau']:+.2f} {'=' if p[m]['same_winner'] else '≠'}"
                 for m in metrics]
        lat = p.get("mean_task_latency_s")
        t.add_row(key, *cells, "—" if lat is None else f"{lat['full_order'][0]} / {lat['fast_order'][0]}")
    o = result["overall"]
    t.add_row("mean tau", *(f"{o[m]['mean_kendall_tau']:+.2f}" for m in metrics), "")
    t.add_row("winner agrees", *(f"{o[m]['winner_agrees_share']:.0%}" for m in metrics), "")
    return [t]
