"""`python -m bench.engine [--quick] [--skip-server] [--skip-engine]`.

Part 1 (pure engine): simulated steps per CPU second and simulated seconds per CPU second
(baseline: real time, ratio > 1 = faster than the modelled GPU).
Part 2 (emulated replica): streams and tokens/s one `tao vllm-sim` process sustains at
time-scale 1 and 10 and how far it lags its model (baseline: the ideal keep-up ratio 1.0).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

from bench.engine.engine_bench import run_engine_bench
from bench.engine.server_bench import run_server_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine")
    ap.add_argument("--quick", action="store_true", help="small sizes (about 1 minute)")
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    args = ap.parse_args(argv)
    print(f"machine: cpus={os.cpu_count()} python={platform.python_version()} "
          f"impl={platform.python_implementation()} platform={platform.platform()}")
    if not args.skip_engine:
        print("\n== pure engine (sim.engine.Engine.step), CPU time ==")
        print(f"{'scenario':44} {'steps':>8} {'cpu s':>7} {'steps/s':>9} {'sim s':>9} {'sim/cpu':>8} "
              f"{'preempt':>7} {'hit':>6}")
        for r in run_engine_bench(args.quick):
            print(f"{r.scenario:44} {r.steps:8d} {r.cpu_s:7.2f} {r.steps_per_s:9.0f} {r.sim_s:9.1f} "
                  f"{r.sim_per_cpu:7.1f}x {r.preemptions:7d} {r.hit_rate:6.3f}")
    if not args.skip_server:
        print("\n== tao vllm-sim (qwen3-32b-h100x2), closed-loop streaming clients in this process ==")
        print(f"{'scale':>5} {'streams':>7} {'tok/s wall':>10} {'req':>6} {'err':>4} {'keep-up':>8} "
              f"{'lag end s':>9} {'max lag s':>9}")
        for s in run_server_bench(args.quick):
            print(f"{s.time_scale:5.0f} {s.streams:7d} {s.tok_per_s:10.0f} {s.requests:6d} {s.errors:4d} "
                  f"{s.keep_up:7.2f}x {s.lag_end_s:9.2f} {s.max_lag_s:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
