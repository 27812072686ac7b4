"""``python -m bench.sim.sweep``: the configurations it draws, its summary, and its command line
(one cheap configuration; the sweep itself is a benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.sweep import KINDS, PEERS, PROFILES, draw, main, summarize


def test_configurations_are_drawn_the_same_every_run_and_cover_the_ranges() -> None:
    configs = [draw(i) for i in range(200)]
    assert configs == [draw(i) for i in range(200)]
    assert {c.kind for c in configs} == set(KINDS) and {c.profile for c in configs} == set(PROFILES)
    assert {c.cache_share for c in configs} == {1.0, 0.5, 0.25}
    assert {c.replicas for c in configs} == {1, 2, 3, 4, 6}
    for c in configs:
        assert 8 <= c.sessions <= 64
        if c.arrival_rate_per_s > 0:
            assert c.concurrency is None  # an open loop has no worker limit
        assert c.concurrency in (None, c.sessions, max(1, c.sessions // 2))
        assert (c.num_gpu_blocks is None) == (c.cache_share == 1.0)
    assert draw(6).label() == "swe-verified, 64 sessions at 0.2/s, 1 × qwen3-32b-h100x1"


def test_the_summary_counts_tao_against_the_best_peer_and_leaves_out_failures() -> None:
    configs = [draw(i) for i in range(4)]

    def res(i: int, policy: str, latency: float, failed: int = 0) -> dict[str, object]:
        return {"index": i, "policy": policy, "latency_s": latency, "ttft_s": 0.1, "failed": failed, "incomplete": 0}

    results = [res(0, "tao", 102.0), res(0, "sjf", 100.0), res(0, "least_loaded", 120.0),
               res(1, "tao", 105.0), res(1, "sjf", 100.0), res(1, "least_loaded", 101.0),
               res(2, "tao", 150.0), res(2, "sjf", 100.0), res(2, "least_loaded", 130.0),
               res(3, "tao", 90.0), res(3, "sjf", 100.0, failed=1), res(3, "least_loaded", 95.0)]
    out = summarize(configs, results, ("sjf", "least_loaded"))
    assert out["counts"] == {"within_3pct": 1, "3_to_10pct": 1, "over_10pct": 1, "left_out": 1}
    assert [r["best_peer"] for r in out["rows"]] == ["sjf", "sjf", "sjf"]
    assert out["rows"][0]["tao_behind_pct"] == pytest.approx(2.0)


def test_the_command_runs_one_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.json"
    # configuration 1: 32 tool-less batch sessions on 6 replicas of a 3B model, seconds to simulate
    assert main(["--first", "1", "--configs", "1", "--policies", "tao,least_loaded", "--jobs", "1",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["results"]] == ["tao", "least_loaded"]
    assert sum(doc["counts"].values()) == 1 and "within 3 %" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--policies", "least_loaded,tao"])
    assert "thunderagent" in PEERS
