"""Agent workloads: the trace format, its validator and the generator
(docs/architecture.md#trace-format)."""

from services.sim.workload.generate import GenerateOptions, UnknownKindError, generate
from services.sim.workload.trace import (
    Tool,
    TraceError,
    TraceSession,
    Turn,
    load_trace,
    parse_lines,
    write_trace,
)

__all__ = [
    "GenerateOptions",
    "Tool",
    "TraceError",
    "TraceSession",
    "Turn",
    "UnknownKindError",
    "generate",
    "load_trace",
    "parse_lines",
    "write_trace",
]
