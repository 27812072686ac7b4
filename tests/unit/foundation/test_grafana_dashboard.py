"""deploy/grafana/tao.json: a valid dashboard whose every query names only metrics the services
export (found by grepping the prometheus_client metric definitions in services/)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "tao.json"

DEFINITION = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|GaugeMetricFamily|CounterMetricFamily|HistogramMetricFamily)\(\s*"
    r"[\"']([a-zA-Z_:][a-zA-Z0-9_:]*)[\"']")
SUFFIXES = {
    "Counter": ("_total", "_created"), "CounterMetricFamily": ("_total",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"), "HistogramMetricFamily": ("_bucket", "_sum", "_count"),
    "Summary": ("_sum", "_count", "_created"), "Gauge": ("",), "GaugeMetricFamily": ("",),
}
PROMQL_WORDS = {
    # functions
    "abs", "absent", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "count_over_time",
    "delta", "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate", "label_replace",
    "label_values", "ln", "log2", "log10", "max_over_time", "min_over_time", "predict_linear", "rate", "resets",
    "round", "scalar", "sort", "sort_desc", "sqrt", "sum_over_time", "time", "timestamp", "vector",
    # aggregations and keywords
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "group", "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan",
}


def exported_metrics() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "services").rglob("*.py"):
        for kind, name in DEFINITION.findall(path.read_text()):
            names.update(name + suffix for suffix in SUFFIXES[kind])
    return names


def metric_names(expr: str) -> set[str]:
    """Identifiers of ``expr`` that can only be metric names."""
    text = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # dashboard variables
    text = re.sub(r"\"[^\"]*\"", " ", text)
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {w for w in words if w.lower() not in PROMQL_WORDS}


def queries(dashboard: dict[str, object]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_dashboard_is_valid_grafana_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        for t in p.get("targets", []):
            assert t["refId"] and t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for wanted in ("admitted vs held", "hold time", "solve time", "prediction error", "caps", "ttft",
                   "prefix-cache hit rate"):
        assert wanted in titles, wanted


def test_every_query_names_exported_metrics() -> None:
    exported = exported_metrics()
    assert {"tao_router_ttft_seconds_bucket", "grpc_server_handled_total", "tao_budget_cap_slots"} <= exported
    dash = json.loads(DASHBOARD.read_text())
    found = queries(dash)
    assert len(found) >= 20
    for title, expr in found:
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        unknown = names - exported
        assert not unknown, f"{title}: {sorted(unknown)} not exported by services/ ({expr!r})"
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            names = set(re.findall(r"\(([a-zA-Z_:][\w:]*)", var["query"])) - PROMQL_WORDS
            assert names <= exported, var


def test_the_checker_catches_an_unknown_metric() -> None:
    assert metric_names('sum by (le) (rate(tao_router_nope_bucket{job=~"$job"}[5m]))') == {"tao_router_nope_bucket"}
    assert metric_names('histogram_quantile(0.5, sum by (le, x) (rate(a_b[$__rate_interval]))) / c') == {"a_b", "c"}
