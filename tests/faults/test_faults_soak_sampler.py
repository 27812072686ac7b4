"""The soak benchmark's instruments (bench/soak): /proc sampling and the growth report."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.soak.soak import ProcSample, Tick, report, sample, slope_per_10min


def test_sample_reads_rss_fds_and_threads_of_a_live_process() -> None:
    me = sample(os.getpid())
    assert me is not None and me.rss_mb > 1 and me.fds >= 3 and me.threads >= 1
    with open(os.devnull) as extra:  # one more open file shows up
        more = sample(os.getpid())
        assert more is not None and more.fds == me.fds + 1, (me, more, extra.name)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert sample(proc.pid) is None


def test_report_measures_growth_against_the_post_warmup_baseline() -> None:
    ticks = [Tick(t, 0, 0, {"leaky": ProcSample(100.0 + t, 10 + int(t // 60), 4),
                            "steady": ProcSample(50.0, 8, 2)}) for t in range(0, 601, 60)]
    ticks[0].procs["steady"] = ProcSample(20.0, 5, 2)  # warm-up sample, not the baseline
    out = report(ticks, warmup_s=60)
    assert out["steady"]["rss_base_mb"] == 50.0 and out["steady"]["rss_ratio"] == 1.0
    assert out["steady"]["rss_mb_per_10min"] == 0.0 and out["steady"]["fds_per_10min"] == 0.0
    assert out["leaky"]["rss_ratio"] == round(700 / 160, 3)
    assert abs(out["leaky"]["rss_mb_per_10min"] - 600.0) < 1e-6
    assert abs(out["leaky"]["fds_per_10min"] - 10.0) < 1e-6
    assert slope_per_10min([(0.0, 1.0)]) == 0.0
