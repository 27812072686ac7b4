"""``python -m bench.sim.sweep``: the configurations it draws, its summary, and its command line
(one cheap configuration; the sweep itself is a benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim.sweep import KINDS, PEERS, PROFILES, draw, draw_mixed, main, summarize


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


def test_mixed_configurations_put_two_kinds_on_one_fleet_interleaved() -> None:
    configs = [draw_mixed(i) for i in range(200)]
    assert configs == [draw_mixed(i) for i in range(200)]
    assert {c.replicas for c in configs} == {2, 3, 4, 6, 8} and {c.first_share for c in configs} == {0.25, 0.5, 0.75}
    for c in configs:
        assert c.second_kind in KINDS and c.second_kind != c.kind and 32 <= c.sessions <= 128
        assert c.concurrency in (None, c.sessions // 2, c.sessions // 4)
    c = draw_mixed(7)  # closed loop: terminal-bench a quarter, SWE-lite three quarters, all at t = 0
    assert c.label() == ("terminal-bench 25% + swe-lite 75%, 64 sessions at once, 32 active, "
                         "3 × qwen3-32b-h100x1, 0.5 of the cache")
    trace = c.trace(max_context_tokens=100_000)
    ids = [s.session_id for s in trace]
    assert len(set(ids)) == 64 and sum(i.startswith("terminal-bench") for i in ids) == 16
    # both kinds in the first eight to start, as in the whole trace: no kind queues behind the other
    assert sum(i.startswith("terminal-bench") for i in ids[:8]) == 2
    # a closed loop is a batch whatever the kinds' own arrival patterns (chat-bursty's are bursts)
    batch = draw_mixed(92)
    assert batch.arrival_rate_per_s == 0 and batch.second_kind == "chat-bursty"
    assert {s.arrival_s for s in batch.trace(max_context_tokens=100_000)} == {0.0}
    open_loop = draw_mixed(2)
    arrivals = [s.arrival_s for s in open_loop.trace(max_context_tokens=100_000)]
    assert open_loop.arrival_rate_per_s > 0 and arrivals == sorted(arrivals)


def test_the_summary_counts_tao_against_the_best_peer_and_leaves_out_failures() -> None:
    configs = [draw(i) for i in range(4)]

    def res(i: int, policy: str, latency: float, failed: int = 0) -> dict[str, object]:
        return {"index": i, "policy": policy, "latency_s": latency, "ttft_s": 0.1, "makespan_s": 3 * latency,
                "failed": failed, "incomplete": 0}

    results = [res(0, "tao", 102.0), res(0, "sjf", 100.0), res(0, "least_loaded", 120.0),
               res(1, "tao", 105.0), res(1, "sjf", 100.0), res(1, "least_loaded", 101.0),
               res(2, "tao", 150.0), res(2, "sjf", 100.0), res(2, "least_loaded", 130.0),
               res(3, "tao", 90.0), res(3, "sjf", 100.0, failed=1), res(3, "least_loaded", 95.0)]
    out = summarize(configs, results, ("sjf", "least_loaded"))
    assert out["counts"] == {"within_3pct": 1, "3_to_10pct": 1, "over_10pct": 1, "left_out": 1}
    assert [r["best_peer"] for r in out["rows"]] == ["sjf", "sjf", "sjf"]
    assert out["rows"][0]["tao_behind_pct"] == pytest.approx(2.0)
    # the makespan only where every session arrives at once: configuration 0 here (1–3 are open loops)
    assert [c.arrival_rate_per_s == 0 for c in configs] == [True, False, False, False]
    assert [("tao_makespan_behind_pct" in r) for r in out["rows"]] == [True, False, False]
    assert out["rows"][0]["best_makespan_peer"] == "sjf" and out["rows"][0]["tao_makespan_behind_pct"] == pytest.approx(2.0)
    assert out["batch_makespan_counts"] == {"within_3pct": 1, "3_to_10pct": 0, "over_10pct": 0}


def test_the_command_runs_one_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.json"
    # configuration 1: 32 tool-less batch sessions on 6 replicas of a 3B model, seconds to simulate
    assert main(["--first", "1", "--configs", "1", "--policies", "tao,least_loaded", "--jobs", "1",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["results"]] == ["tao", "least_loaded"]
    assert sum(doc["counts"].values()) == 1 and "within 3 %" in capsys.readouterr().out
    # mixed configuration 4: chat and batch sessions on 2 GLM replicas, an open loop
    assert main(["--mixed", "--first", "4", "--configs", "1", "--policies", "tao,least_loaded", "--jobs", "1",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["configs"][0]["second_kind"] == "batch-steady" and len(doc["results"]) == 2
    assert "chat-bursty 25% + batch-steady 75%" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--policies", "least_loaded,tao"])
    assert "thunderagent" in PEERS
