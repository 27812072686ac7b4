"""``tao predictor replay --events F [--json]``: replay a tool-event log, print accuracy.

The log is tool-event JSONL (docs/architecture.md#tool-events). It goes through the same
predictor core the service runs, on a virtual clock (definitions of every figure:
``services/predictor/replay.py``). Generate a log with
``python -m services.predictor.synthetic --sessions 400 -o events.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from services.predictor.core import ExplorationConfig, InvalidEventError, PredictorConfig, ToolEvent
from services.predictor.replay import replay, summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", required=True, help="tool-event JSONL file ('-' for stdin)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--tick-s", type=float, default=0.25, help="readiness sampling period (virtual s)")
    parser.add_argument("--no-calls", action="store_true", help="omit the per-call list from --json")
    parser.add_argument("--exploration-seed", type=int, default=0, help="seed of bounded exploration")


class EventFileError(ValueError):
    pass


def read_events(fh: TextIO) -> list[ToolEvent]:
    """Parse JSONL; ``EventFileError`` naming the line on malformed input."""
    out: list[ToolEvent] = []
    for lineno, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            out.append(ToolEvent.from_json(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise EventFileError(f"line {lineno}: not JSON ({exc.msg})") from None
        except InvalidEventError as exc:
            raise EventFileError(f"line {lineno}: {exc}") from None
    return out


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _row(name: str, d: dict[str, Any], ready: bool = True) -> str:
    cells = [
        f"{name:<26}",
        f"{d['tools']:>7}",
        f"{_fmt(d['mae_s']):>8}",
        f"{_fmt(d['within_0_5s'], True):>8}",
        f"{_fmt(d['mae_at_start_s']):>9}",
        f"{_fmt(d['within_0_5s_at_start'], True):>9}",
    ]
    if ready:
        cells += [f"{_fmt(d.get('ready_precision'), True):>8}", f"{_fmt(d.get('ready_recall'), True):>8}"]
    return " ".join(cells)


def render(s: dict[str, Any]) -> str:
    head = (
        f"{'':<26} {'tools':>7} {'MAE s':>8} {'≤0.5 s':>8} {'MAE@st s':>9} {'≤0.5@st':>9} {'r prec':>8} {'r rec':>8}"
    )
    lines = [
        f"events {s['events']} (rejected {s['invalid_events']}), finished calls {s['tools']}",
        "final = last prediction before the call finished; @st = prediction at its start;",
        "r prec / r rec = readiness precision / recall at the 1 s horizon",
        "",
        head,
        _row("all", s),
    ]
    for tool, d in s["per_tool"].items():
        lines.append(_row(f"  {tool}", d))
    lines += ["", f"{'final prediction by evidence':<32} {'tools':>7} {'share':>7} {'MAE s':>8} {'≤0.5 s':>8}"]
    n = max(1, s["tools"])
    for ev, d in s["by_evidence_final"].items():
        lines.append(
            f"  {ev:<30} {d['tools']:>7} {_fmt(d['tools'] / n, True):>7} {_fmt(d['mae_s']):>8} "
            f"{_fmt(d['within_0_5s'], True):>8}"
        )
    lines += ["", f"{'at-start prediction by evidence':<32} {'tools':>7} {'share':>7} {'MAE s':>8} {'≤0.5 s':>8}"]
    for ev, d in s["by_evidence_at_start"].items():
        lines.append(
            f"  {ev:<30} {d['tools']:>7} {_fmt(d['tools'] / n, True):>7} {_fmt(d['mae_at_start_s']):>8} "
            f"{_fmt(d['within_0_5s_at_start'], True):>8}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        if args.events == "-":
            events = read_events(sys.stdin)
        else:
            with open(args.events, encoding="utf-8") as fh:
                events = read_events(fh)
    except OSError as exc:
        print(f"tao predictor replay: cannot read {args.events}: {exc.strerror}", file=sys.stderr)
        return 2
    except EventFileError as exc:
        print(f"tao predictor replay: {args.events}: {exc}", file=sys.stderr)
        return 2
    if args.tick_s <= 0:
        print("tao predictor replay: --tick-s must be > 0", file=sys.stderr)
        return 2
    cfg = PredictorConfig(exploration=ExplorationConfig(seed=args.exploration_seed))
    s = summary(replay(events, cfg, tick_s=args.tick_s), include_calls=args.json and not args.no_calls)
    if args.json:
        json.dump(s, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print(render(s))
    return 0
