"""``python -m bench.sim.unseen``: the paired statistics, the pairing over traces, the checkpoint,
and the command line (one tiny simulation pair; the scenarios themselves are benchmarks)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

import bench.sim.run as bench_run
import bench.sim.unseen as unseen
from bench.sim.grid import GridPoint
from bench.sim.unseen import (
    DEFAULT_POLICIES,
    EXTRA_POLICIES,
    FIRST_SEED,
    SCENARIOS,
    paired,
    run,
    seeds_of,
    summarize,
    t975,
)
from services.sim.engine.profiles import QWEN3_32B_H100X2


def test_paired_is_the_geometric_mean_ratio_with_a_t_interval() -> None:
    values, reference = [110.0, 90.0, 120.0, 100.0], [100.0, 100.0, 100.0, 100.0]
    c = paired(values, reference, sign=-1)
    logs = [math.log(v / 100.0) for v in values]
    mean, half = statistics.fmean(logs), 3.182 * statistics.stdev(logs) / 2.0
    assert c.ratio == pytest.approx(math.exp(mean))
    assert (c.low, c.high) == (pytest.approx(math.exp(mean - half)), pytest.approx(math.exp(mean + half)))
    assert c.low < c.ratio < c.high
    assert (c.better, c.traces) == (1, 4)  # lower is better: only the 90 beats its reference
    assert paired(values, reference, sign=1).better == 2  # higher is better: 110 and 120
    # one trace: no interval; the same values: ratio 1, nothing better
    one = paired([2.0], [1.0], sign=1)
    assert (one.ratio, one.low, one.high, one.better) == (pytest.approx(2.0), pytest.approx(2.0),
                                                          pytest.approx(2.0), 1)
    same = paired([3.0, 4.0], [3.0, 4.0], sign=-1)
    assert (same.ratio, same.low, same.high, same.better) == (1.0, 1.0, 1.0, 0)


def test_paired_refuses_unpaired_or_non_positive_values() -> None:
    with pytest.raises(ValueError, match="equally many"):
        paired([1.0, 2.0], [1.0], sign=1)
    with pytest.raises(ValueError, match="equally many"):
        paired([], [], sign=1)
    with pytest.raises(ValueError, match="positive"):
        paired([0.0], [1.0], sign=1)


def test_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(7) == 2.365 and t975(30) == 2.042
    assert t975(31) == t975(1000) == 1.96


def test_scenarios_are_fresh_and_sized_as_documented() -> None:
    assert seeds_of(3) == [FIRST_SEED, FIRST_SEED + 1, FIRST_SEED + 2] and FIRST_SEED > 115
    new_user = [p for p in SCENARIOS.values() if p.setup == "qwen-4xTP2"]
    assert {p.kind for p in new_user} == {"swe-lite", "swe-verified", "terminal-bench"}
    assert all((p.replicas, p.sessions, p.concurrency, p.profile.name) == (4, 160, 128, "qwen3-32b-h100x2")
               for p in new_user)
    tight = SCENARIOS["tight-kv/terminal-bench/n12"]
    assert (tight.replicas, tight.sessions, tight.num_gpu_blocks) == (2, 12, 6000)
    assert set(EXTRA_POLICIES) <= set(SCENARIOS) and EXTRA_POLICIES[tight.key] == ("least_loaded",)
    assert DEFAULT_POLICIES[0] == "tao"


def _result(point: str, policy: str, seed: int, latency: float, incomplete: int = 0) -> dict[str, Any]:
    metrics = {"mean_task_latency_s": latency, "mean_ttft_s": latency / 100, "decode_tok_s_makespan": 1000 / latency,
               "decode_tok_s_busy": 500.0}
    return {"point": point, "policy": policy, "seed": seed, "metrics": metrics, "incomplete": incomplete,
            "cpu_s": 1.0}


def test_summarize_pairs_only_the_traces_both_policies_completed() -> None:
    results = [
        _result("p", "tao", 1, 100.0), _result("p", "peer", 1, 110.0),
        _result("p", "tao", 2, 200.0), _result("p", "peer", 2, 220.0),
        _result("p", "tao", 3, 100.0), _result("p", "peer", 3, 1.0, incomplete=2),  # left out
        _result("p", "tao", 4, 100.0),  # the peer never ran seed 4
        _result("other", "peer", 1, 1.0),
    ]
    s = summarize(results, "p", ["tao", "peer"])
    assert s["tao"]["traces"] == 4 and "ratio" not in s["tao"]["mean_task_latency_s"]
    assert s["tao"]["mean_task_latency_s"]["mean"] == pytest.approx(125.0)
    peer = s["peer"]
    assert peer["traces"] == 2
    lat = peer["mean_task_latency_s"]
    assert (lat["ratio"], lat["low"], lat["high"], lat["better"]) == (pytest.approx(1.1), pytest.approx(1.1),
                                                                      pytest.approx(1.1), 0)
    assert peer["decode_tok_s_makespan"]["ratio"] == pytest.approx(1 / 1.1)
    assert peer["decode_tok_s_busy"]["ratio"] == pytest.approx(1.0) and peer["decode_tok_s_busy"]["better"] == 0


TINY = GridPoint("tiny/swe-lite/n3", "tiny", QWEN3_32B_H100X2, 1, "swe-lite", 3, 3, num_gpu_blocks=3000)


def test_run_simulates_each_pair_once_and_resumes_from_the_checkpoint(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    real = bench_run.run_task

    def counted(task: Any) -> dict[str, Any]:
        calls.append((task.policy, task.seed))
        return real(task)

    monkeypatch.setattr(bench_run, "run_task", counted)  # what bench.sim.run.execute calls
    ck = tmp_path / "ck.jsonl"
    results, _ = run([TINY], lambda _: ["tao", "sjf"], [7, 8], jobs=1, checkpoint=ck)
    assert sorted(calls) == [("sjf", 7), ("sjf", 8), ("tao", 7), ("tao", 8)]
    assert sorted((r["policy"], r["seed"]) for r in results) == sorted(calls)
    assert all(r["point"] == TINY.key and r["metrics"]["mean_task_latency_s"] > 0 for r in results)
    assert len(ck.read_text().splitlines()) == 4
    calls.clear()
    again, _ = run([TINY], lambda _: ["tao", "sjf"], [7, 8, 9], jobs=1, checkpoint=ck)
    assert sorted(calls) == [("sjf", 9), ("tao", 9)]  # seeds 7 and 8 come from the checkpoint
    assert len(again) == 6
    assert {json.loads(line)["seed"] for line in ck.read_text().splitlines()} == {7, 8, 9}
    calls.clear()
    fewer, _ = run([TINY], lambda _: ["tao"], [8], jobs=1, checkpoint=ck)
    assert not calls and [(r["policy"], r["seed"]) for r in fewer] == [("tao", 8)]


def test_the_command_line_refuses_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--scenarios", "nope"], "unknown scenario"),
                          (["--policies", "tao,nope"], "unknown policy"),
                          (["--policies", "tao"], "at least two policies"),
                          (["--traces", "0"], "at least two policies and one trace")):
        with pytest.raises(SystemExit) as exc:
            unseen.main(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
