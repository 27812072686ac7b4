"""bench.sim: summaries on hand-made numbers, and a minimal smoke run of the grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.__main__ import main as bench_main
from bench.sim.__main__ import parse_scales
from bench.sim.grid import GRID, MAIN_POLICIES
from bench.sim.run import load_checkpoint
from bench.sim.summary import gain_pct, grid_summary, point_summary


def _m(lat: float, ttft: float, dec: float) -> dict[str, float]:
    return {"mean_task_latency_s": lat, "mean_ttft_s": ttft, "decode_tok_s_makespan": dec,
            "decode_tok_s_busy": dec / 2}


def test_gain_sign_follows_the_metric_direction() -> None:
    assert gain_pct("mean_task_latency_s", 80.0, 100.0) == pytest.approx(20.0)
    assert gain_pct("decode_tok_s_makespan", 120.0, 100.0) == pytest.approx(20.0)
    assert gain_pct("decode_tok_s_makespan", 80.0, 100.0) == pytest.approx(-20.0)


def test_point_summary_uses_the_best_system_baseline_per_metric() -> None:
    pols = {
        "tao": _m(90, 1.0, 110),
        "oracle": _m(88, 0.9, 112),
        "round_robin": _m(150, 3.0, 80),
        "thunderagent": _m(95, 0.8, 100),  # best on TTFT: TAO loses there
        "cache_aware": _m(100, 2.0, 105),
        "sjf": _m(97, 1.2, 100),  # the paper's DP comparison counts as a baseline
        "tao-paper": _m(80, 0.5, 200),  # TAO's own paper policy: never "best"
    }
    s = point_summary(pols)
    assert s["vs_best"]["mean_task_latency_s"]["baseline"] == "thunderagent"
    assert s["vs_best"]["decode_tok_s_makespan"]["baseline"] == "cache_aware"
    assert s["vs_best"]["mean_ttft_s"]["gain_pct"] == pytest.approx(-25.0)
    assert not s["beats_best_on_all_three"]
    assert s["latency_vs_oracle_pct"] == pytest.approx(100 * 2 / 88)
    assert s["within_5pct_of_oracle"]
    faster_sjf = {**pols, "sjf": _m(85, 1.2, 100)}
    assert point_summary(faster_sjf)["vs_best"]["mean_task_latency_s"]["baseline"] == "sjf"
    g = grid_summary({"a": pols, "b": {**pols, "thunderagent": _m(95, 1.5, 100)}})
    assert g["tao_beats_best_baseline_on_all_three"] == 1
    assert g["configurations_won"] == ["b"]
    assert g["wins_per_metric"]["mean_task_latency_s"] == 2 and g["wins_per_metric"]["mean_ttft_s"] == 1


def test_grid_mirrors_the_seed() -> None:
    assert len(GRID) == 12
    assert len({p.key for p in GRID}) == 12
    qwen = [p for p in GRID if p.setup.startswith("qwen")]
    assert [p.concurrency for p in qwen] == [96, 128, 160] and {p.replicas for p in qwen} == {4}
    assert sum(p.ablation for p in GRID) == 4
    assert all(set(MAIN_POLICIES) <= set(p.policies) for p in GRID)


def test_quick_smoke_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "grid.json"
    assert bench_main(["--quick", "--only", "glm", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (cfg,) = doc["configurations"]
    assert set(cfg["policies"]) == {"tao", "oracle", "thunderagent", "round_robin"}
    assert doc["summary"]["configurations"] == 1
    assert doc["machine"]["cpu_count"] >= 1 and doc["runtime_s"] > 0
    assert cfg["lower_bound"]["sessions"] == cfg["sessions"] and cfg["lower_bound"]["mean_task_latency_s"] > 0
    cap = cfg["capacity_bound"]
    assert cap["sessions"] == cfg["sessions"] and cap["mean_task_latency_s"] >= cap["no_contention_s"] > 0
    for m in cfg["policies"].values():
        assert m["latency_over_lower_bound"] >= 1.0 and m["decode_tok_s_busy"] > 0
        assert m["latency_over_capacity_bound"] >= 1.0 and m["busy_over_work_bound"] >= 1.0
    gm = doc["summary"]["bounds_geomean"]
    assert set(gm) == set(cfg["policies"])
    for name, g in gm.items():  # one configuration: the geometric mean is its own ratio
        assert g["latency_over_capacity_bound"] == pytest.approx(cfg["policies"][name]["latency_over_capacity_bound"])


def test_a_checkpoint_written_before_the_decode_rename_still_resumes(tmp_path: Path) -> None:
    ck = tmp_path / "ck.jsonl"
    old = {"point": "p", "policy": "tao", "sessions": 3, "metrics": {"mean_task_latency_s": 1.0,
                                                                     "decode_tokens_per_s": 42.0}}
    ck.write_text(json.dumps(old) + "\n")
    (got,) = load_checkpoint(ck).values()
    assert got["metrics"]["decode_tok_s_makespan"] == 42.0 and got["metrics"]["decode_tok_s_busy"] is None
    assert "decode_tokens_per_s" not in got["metrics"]


def test_sessions_scale_for_all_or_per_setup() -> None:
    setups = {"a", "b"}
    assert parse_scales("0.5", setups) == {"a": 0.5, "b": 0.5}
    assert parse_scales("b=0.25", setups) == {"b": 0.25}
    for bad in ("0", "-1", "c=0.5", "a=0", "a=x"):
        with pytest.raises(ValueError):
            parse_scales(bad, setups)
    assert bench_main(["--quick", "--only", "nothing-matches"]) == 2
    assert bench_main(["--sessions-scale", "nope=2"]) == 2


def test_two_node_stand_in_is_tp4_with_its_kv_cache() -> None:
    """The 2-node setup's replicas are Qwen3-32B on 4×H100 (TP4), not a renamed TP2 profile."""
    from bench.sim.grid import QWEN3_32B_H100X4
    from services.sim.engine import Engine

    assert QWEN3_32B_H100X4.tp == 4
    assert Engine(QWEN3_32B_H100X4).num_gpu_blocks * 16 > 800_000
