"""``python -m bench.predictor [--quick] [--json OUT] [--skip-ingest]``

1. Accuracy per tool class on the synthetic SWE-agent-like mix (several seeds, and one
   run with no task groups), against simple baselines measured in the same run.
2. Ingest throughput of one predictor process with p50/p99 event-to-published latency,
   against one-event-per-call ingestion measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

from bench.predictor import accuracy, ingest


def machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.predictor", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", default=None, help="also write all figures to this file")
    ap.add_argument("--skip-ingest", action="store_true", help="accuracy only (no redis-server needed)")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    print(f"machine: {out['machine']}")
    t = time.perf_counter()
    sessions, seeds = (60, [0]) if args.quick else (400, [0, 1, 2])
    acc = accuracy.run(sessions, seeds)
    print(accuracy.render(acc))
    solo = accuracy.run(sessions, seeds[:1], group_size=1)
    print("without task groups (every session a different task):")
    print(accuracy.render(solo))
    out["accuracy"], out["accuracy_group_size_1"] = acc, solo
    if not args.skip_ingest:
        ing = ingest.run(sessions=200 if args.quick else 1600)
        print(ingest.render(ing))
        out["ingest"] = ing
    print(f"\n(bench took {time.perf_counter() - t:.1f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
