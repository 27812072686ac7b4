"""The sim-vs-live agreement arithmetic (bench/agreement/compare.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.agreement.compare import agree, kendall_tau, mean_metrics, ranking, relative_gap, spread_pct


def test_relative_gap() -> None:
    assert relative_gap(100.0, 110.0) == pytest.approx(10.0)
    assert relative_gap(100.0, 90.0) == pytest.approx(-10.0)
    assert relative_gap(0.0, 5.0) is None


def test_ranking_respects_metric_direction() -> None:
    lat = {"a": 3.0, "b": 1.0, "c": 2.0}
    assert ranking(lat, "mean_task_latency_s") == ["b", "c", "a"]
    assert ranking(lat, "decode_tok_s_makespan") == ["a", "c", "b"]
    assert ranking({"b": 1.0, "a": 1.0}, "mean_ttft_s") == ["a", "b"]  # ties by name


def test_kendall_tau_extremes_and_one_swap() -> None:
    assert kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    assert kendall_tau(["a", "b", "c"], ["b", "a", "c"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        kendall_tau(["a", "b"], ["a", "c"])


@given(st.permutations(list("abcdef")), st.permutations(list("abcdef")))
def test_kendall_tau_symmetric_and_bounded(a: list[str], b: list[str]) -> None:
    t = kendall_tau(a, b)
    assert -1.0 <= t <= 1.0
    assert t == pytest.approx(kendall_tau(b, a))


def test_agree_reports_discordant_pairs_with_both_gaps() -> None:
    base = {"mean_task_latency_s": 100.0, "mean_ttft_s": 1.0, "decode_tok_s_makespan": 50.0,
            "p90_task_latency_s": 200.0, "mean_ttft_after_tool_s": 1.0, "prefix_hit_rate": 0.9}
    sim = {"tao": dict(base, mean_task_latency_s=90.0), "rr": dict(base)}
    live = {"tao": dict(base, mean_task_latency_s=105.0), "rr": dict(base, mean_task_latency_s=100.0),
            "extra": dict(base)}  # only in one world: ignored
    res = {a.metric: a for a in agree(sim, live)}
    lat = res["mean_task_latency_s"]
    assert lat.sim_order == ["tao", "rr"] and lat.e2e_order == ["rr", "tao"]
    assert lat.tau == -1.0 and not lat.same_winner
    (d,) = lat.discords
    assert (d.first, d.second) == ("tao", "rr")
    assert d.sim_gap_pct == pytest.approx(10.0) and d.e2e_gap_pct == pytest.approx(-5.0)
    assert lat.gaps_pct["tao"] == pytest.approx(100.0 * 15 / 90)
    assert res["mean_ttft_s"].same_order and res["mean_ttft_s"].discords == []
    with pytest.raises(ValueError):
        agree({"tao": base}, {"tao": base})


def test_repeated_live_runs_average_and_mark_discords_within_noise() -> None:
    runs = [{"mean_task_latency_s": 100.0, "errors": 0, "note": "a"}, {"mean_task_latency_s": 110.0, "errors": 0}]
    assert mean_metrics(runs)["mean_task_latency_s"] == pytest.approx(105.0)
    assert mean_metrics(runs)["note"] == "a"
    assert spread_pct(runs, "mean_task_latency_s") == pytest.approx(100.0 * 10 / 105)
    assert spread_pct(runs[:1], "mean_task_latency_s") == 0.0
    base = {"mean_task_latency_s": 100.0, "mean_ttft_s": 1.0, "decode_tok_s_makespan": 50.0,
            "p90_task_latency_s": 200.0, "mean_ttft_after_tool_s": 1.0, "prefix_hit_rate": 0.9}
    sim = {"tao": dict(base, mean_task_latency_s=90.0), "rr": dict(base)}
    live = {"tao": dict(base, mean_task_latency_s=102.0), "rr": dict(base)}  # tao 2 % worse live
    noisy = {"tao": {"mean_task_latency_s": 5.0}, "rr": {"mean_task_latency_s": 1.0}}
    (d,) = next(a for a in agree(sim, live, noise_pct=noisy) if a.metric == "mean_task_latency_s").discords
    assert d.within_noise
    quiet = {"tao": {"mean_task_latency_s": 1.0}, "rr": {"mean_task_latency_s": 1.0}}
    lat = next(a for a in agree(sim, live, noise_pct=quiet) if a.metric == "mean_task_latency_s")
    assert not lat.discords[0].within_noise and len(lat.resolved_discords) == 1
