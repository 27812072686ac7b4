"""The `tao up` report folder: summary JSON, PNG plots and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.driver.driver import DriverResult
from services.driver.results import to_records
from services.sim.cluster.metrics import BETTER, time_series
from services.sim.cluster.plots import write_plots
from services.sim.cluster.report import improvement_pct


def comparison(policies: Mapping[str, Mapping[str, Any]], main: str, baseline: str) -> dict[str, float | None]:
    """Improvement of ``main`` over ``baseline`` per metric, in percent (positive = better)."""
    out: dict[str, float | None] = {}
    for key in BETTER:
        a, b = policies[main].get(key), policies[baseline].get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[key] = improvement_pct(key, float(a), float(b))
    return out


def write_report(out_dir: Path, config: dict[str, Any], policies: dict[str, dict[str, Any]],
                 runs: Mapping[str, DriverResult], comparisons: dict[str, dict[str, float | None]],
                 lower_bound: Mapping[str, Any] | None = None, panels: Sequence[Path] = (),
                 capacity_bound: Mapping[str, Any] | None = None) -> Path:
    """``lower_bound`` and ``capacity_bound``: the trace's two lower bounds (``services.sim.cluster.lower_bound``);
    ``panels``: the dashboard panels' PNGs (``services/up/panels.py``), shown after the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"config": config, "policies": policies, "comparison": comparisons}
    if lower_bound is not None:
        summary["lower_bound"] = dict(lower_bound)
    if capacity_bound is not None:
        summary["capacity_bound"] = dict(capacity_bound)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    latencies, series = {}, {}
    for name, result in runs.items():
        requests, sessions = to_records(result)
        latencies[name] = sessions
        series[name] = time_series(requests, bin_s=max(5.0, (result.wall_s * result.time_scale) / 40))
    plots = write_plots(out_dir, latencies, series, title=f"tao up: {config.get('workload')}")
    rows = []
    keys = [k for k in next(iter(policies.values()))]
    for name, metrics in policies.items():
        cells = "".join(f"<td>{_fmt(metrics.get(k))}</td>" for k in keys)
        rows.append(f"<tr><th>{html.escape(name)}</th>{cells}</tr>")
    comp_rows = []
    for label, deltas in comparisons.items():
        cells = "".join(f"<td>{'' if v is None else f'{v:+.1f} %'}</td>" for v in deltas.values())
        comp_rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    comp_head = "".join(f"<th>{html.escape(k)}</th>" for k in next(iter(comparisons.values()), {}))
    images = "".join(
        f'<figure><img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        f"<figcaption>{p.stem}</figcaption></figure>" for p in [*plots, *panels]
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>TAO report</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}figure{{display:inline-block;margin:1em}}
img{{max-width:640px}}</style></head><body>
<h1>TAO — tao up report</h1>
<pre>{html.escape(json.dumps(config, indent=2))}</pre>
<h2>Metrics (model seconds)</h2>
{_bound_line(lower_bound)}{_capacity_line(capacity_bound)}
<table><tr><th>policy</th>{''.join(f'<th>{html.escape(k)}</th>' for k in keys)}</tr>{''.join(rows)}</table>
<h2>Improvement (positive = better)</h2>
<table><tr><th>comparison</th>{comp_head}</tr>{''.join(comp_rows)}</table>
<h2>Plots</h2>{images}
</body></html>"""
    (out_dir / "index.html").write_text(page)
    return out_dir / "index.html"


def _bound_line(bound: Mapping[str, Any] | None) -> str:
    if not bound:
        return ""
    return (f"<p>No-contention lower bound (each session alone on one replica of the engine model, cache never "
            f"evicted, tools at trace duration): mean {float(bound['mean_task_latency_s']):.1f} s; "
            f"latency_over_lower_bound = mean task latency / that bound.</p>")


def _capacity_line(bound: Mapping[str, Any] | None) -> str:
    if not bound:
        return ""
    return (f"<p>Capacity bound (the fleet's least engine-seconds, KV-limited batches, docs/algorithms.md#lower-bounds): "
            f"mean {float(bound['mean_task_latency_s']):.1f} s; least engine work {float(bound['work_s']):.0f} s; "
            f"latency_over_capacity_bound = mean task latency / that bound, busy_over_work_bound = the replicas' "
            f"busy seconds / that work.</p>")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))
