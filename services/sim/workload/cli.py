"""`tao workload generate --kind K --sessions N --seed S -o trace.jsonl`."""

from __future__ import annotations

import argparse
import json
import sys

from services.sim.workload.generate import GenerateOptions, UnknownKindError, generate
from services.sim.workload.params import KINDS
from services.sim.workload.stats import trace_stats
from services.sim.workload.trace import json_schema, write_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=sorted(KINDS), help="workload kind")
    parser.add_argument("--sessions", type=int, default=160, help="number of sessions (default 160)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("-o", "--output", help="output JSONL path ('-' for stdout)")
    parser.add_argument("--arrival-rate", type=float, default=None,
                        help="override arrivals: 0 = all at t=0, > 0 = Poisson sessions/s")
    parser.add_argument("--tenant", default=None, help="override the tenant of every session")
    parser.add_argument("--max-turns", type=int, default=None, help="cap turns per session")
    parser.add_argument("--max-context-tokens", type=int, default=131072,
                        help="end a session before a turn that would exceed this context (default 131072)")
    parser.add_argument("--schema", action="store_true", help="print the JSON Schema of a trace line and exit")
    parser.add_argument("--quiet", action="store_true", help="do not print the summary to stderr")


def run(args: argparse.Namespace) -> int:
    if args.schema:
        print(json.dumps(json_schema(), indent=2))
        return 0
    if not args.kind or not args.output:
        print("tao workload generate: --kind and -o/--output are required", file=sys.stderr)
        return 2
    if args.sessions < 1:
        print(f"tao workload generate: --sessions must be >= 1, got {args.sessions}", file=sys.stderr)
        return 2
    if args.arrival_rate is not None and args.arrival_rate < 0:
        print("tao workload generate: --arrival-rate must be >= 0", file=sys.stderr)
        return 2
    if args.max_turns is not None and args.max_turns < 1:
        print("tao workload generate: --max-turns must be >= 1", file=sys.stderr)
        return 2
    if args.max_context_tokens < 2:
        print("tao workload generate: --max-context-tokens must be >= 2", file=sys.stderr)
        return 2
    if args.tenant is not None and not args.tenant.strip():
        print("tao workload generate: --tenant must not be empty", file=sys.stderr)
        return 2
    try:
        sessions = generate(GenerateOptions(kind=args.kind, sessions=args.sessions, seed=args.seed,
                                            arrival_rate_per_s=args.arrival_rate, tenant=args.tenant,
                                            max_turns=args.max_turns,
                                            max_context_tokens=args.max_context_tokens))
    except UnknownKindError as exc:
        print(f"tao workload generate: {exc}", file=sys.stderr)
        return 2
    if args.output == "-":
        from services.sim.workload.trace import dump_lines

        for line in dump_lines(sessions):
            sys.stdout.write(line + "\n")
    else:
        write_trace(sessions, args.output)
    if not args.quiet:
        st = trace_stats(sessions)
        print(
            f"{args.kind}: {st.sessions} sessions, {st.turns_total} turns "
            f"(p50 {st.turns_p50:.0f}, p90 {st.turns_p90:.0f}), {st.tool_calls} tool calls "
            f"(p50 {st.tool_s_p50:.2f} s, p90 {st.tool_s_p90:.2f} s, p99 {st.tool_s_p99:.1f} s), "
            f"final context p50 {st.final_context_tokens_p50:.0f} tokens"
            + ("" if args.output == "-" else f" -> {args.output}"),
            file=sys.stderr,
        )
    return 0
