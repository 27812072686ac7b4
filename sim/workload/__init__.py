"""Agent workloads: the trace format, its validator and the generator
(docs/architecture.md#trace-format)."""

from sim.workload.generate import GenerateOptions, UnknownKindError, generate
from sim.workload.trace import Session, Tool, TraceError, Turn, load_trace, parse_lines, write_trace

__all__ = [
    "GenerateOptions",
    "Session",
    "Tool",
    "TraceError",
    "Turn",
    "UnknownKindError",
    "generate",
    "load_trace",
    "parse_lines",
    "write_trace",
]
