"""The predictor benchmark runs end to end at tiny sizes (accuracy part; ingest needs a server)."""

from __future__ import annotations

from bench.predictor import accuracy


def test_accuracy_bench_smoke() -> None:
    res = accuracy.run(sessions=12, seeds=[0])
    (run,) = res["runs"]
    assert run["overall"]["tools"] > 100
    assert set(run["baselines"]) == {"default", "global-median", "tool-median"}
    # the predictor beats the simplest baseline even on a tiny log
    assert run["overall"]["mae_s"] < run["baselines"]["default"]["mae_s"]
    text = accuracy.render(res)
    assert "overall" in text and "baseline" in text and "targets" in text
