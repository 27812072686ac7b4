"""Summary statistics of a trace (what the generator's documented distributions should show)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.stats import percentile
from services.sim.workload.trace import TraceSession


@dataclass(frozen=True)
class TraceStats:
    sessions: int
    turns_total: int
    turns_p50: float
    turns_p90: float
    output_tokens_p50: float
    append_tokens_p50: float  # turns > 0 (tool observations)
    append_tokens_p90: float
    final_context_tokens_p50: float
    final_context_tokens_max: int
    tool_calls: int
    tool_s_p50: float
    tool_s_p90: float
    tool_s_p99: float
    tools_with_deadline: float  # share
    tools_with_progress: float  # share
    tools_with_sleep: float  # share
    tool_names: dict[str, int]
    span_arrival_s: float

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def trace_stats(sessions: Sequence[TraceSession]) -> TraceStats:
    turns = [len(s.turns) for s in sessions]
    outputs = [t.output_tokens for s in sessions for t in s.turns]
    appends = [t.append_tokens for s in sessions for t in s.turns[1:]]
    finals = [s.prompt_tokens(len(s.turns) - 1) + s.turns[-1].output_tokens for s in sessions]
    tools = [t.tool for s in sessions for t in s.turns if t.tool is not None]
    durations = [t.duration_s for t in tools]
    n_tools = max(1, len(tools))
    return TraceStats(
        sessions=len(sessions),
        turns_total=sum(turns),
        turns_p50=percentile(turns, 50),
        turns_p90=percentile(turns, 90),
        output_tokens_p50=percentile(outputs, 50),
        append_tokens_p50=percentile(appends, 50),
        append_tokens_p90=percentile(appends, 90),
        final_context_tokens_p50=percentile(finals, 50),
        final_context_tokens_max=max(finals),
        tool_calls=len(tools),
        tool_s_p50=percentile(durations, 50),
        tool_s_p90=percentile(durations, 90),
        tool_s_p99=percentile(durations, 99),
        tools_with_deadline=sum(t.deadline_s is not None for t in tools) / n_tools,
        tools_with_progress=sum(bool(t.progress) for t in tools) / n_tools,
        tools_with_sleep=sum("sleep " in t.command for t in tools) / n_tools,
        tool_names=dict(Counter(t.name for t in tools).most_common()),
        span_arrival_s=max(s.arrival_s for s in sessions) - min(s.arrival_s for s in sessions),
    )
