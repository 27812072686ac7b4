"""A real lower bound of each session's task latency: the session with no contention.

Each session is played alone on one replica of the profile: its KV cache is never evicted (so
every turn hits the whole previous context that lies in full blocks), the shared system
prompt of its ``shared_prefix_id`` is already cached (other sessions may have warmed it in a
contended run), no router or planner delay, and every tool takes its trace duration. Its
latency is then

    Σ_turns (prefill steps + decode steps) + Σ_tools duration_s

with every step timed by the engine model's ``StepTimeModel`` at batch 1, exactly as
``services.sim.engine.Engine`` would schedule the request alone (FCFS, chunked prefill of
``max_num_batched_tokens`` per step, the first output token sampled in the step that
completes the prompt, one decode step per further token):

- prefix hit of turn t: ``min(cached_blocks, (P_t - 1) // block_size) * block_size`` where
  ``cached_blocks`` is ``(P_{t-1} + O_{t-1} - 1) // block_size`` (the full blocks of the previous
  request's computed tokens; vLLM never hits a prompt's last token) and, for turn 0, the full
  blocks of the shared system prompt;
- prefill chunk of ``n`` tokens after ``p`` computed: ``step_time_s(n, 1, sampled, p + n,
  n p + n (n + 1) / 2)``;
- decode step at ``p`` computed tokens: ``step_time_s(1, 1, 1, p + 1, p + 1)``; their sums come from
  a per-profile prefix-sum table (vectorised once), so a trace costs O(turns), not O(tokens).

``tests/unit/cluster/test_lower_bound.py`` checks it against the engine itself driven step by
step. With no contention no policy can do better on the engine model (a batch step is never
shorter than the same sequence's batch-1 step), so mean latency / mean lower bound ≥ 1 for
every policy, the oracle included.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.sim.engine.profiles import Profile
from services.sim.engine.step_time import StepTimeModel
from services.sim.workload.trace import TraceSession


@dataclass(frozen=True, slots=True)
class SessionBound:
    session_id: str
    latency_s: float  # start of turn 0 to the last output token
    llm_s: float  # time in engine steps
    tool_s: float  # time in tools


@dataclass(frozen=True, slots=True)
class LowerBound:
    sessions: tuple[SessionBound, ...]

    @property
    def mean_task_latency_s(self) -> float:
        return sum(s.latency_s for s in self.sessions) / len(self.sessions) if self.sessions else 0.0

    def mean_of(self, session_ids: Sequence[str]) -> float:
        """Mean bound over these sessions (e.g. the completed ones); all when none is known."""
        by_id = {s.session_id: s.latency_s for s in self.sessions}
        known = [by_id[i] for i in session_ids if i in by_id]
        return sum(known) / len(known) if known else self.mean_task_latency_s

    def to_json(self) -> dict[str, float | int]:
        xs = sorted(s.latency_s for s in self.sessions)
        p90 = 0.0
        if xs:
            pos = (len(xs) - 1) * 0.9
            lo = math.floor(pos)
            hi = min(lo + 1, len(xs) - 1)
            p90 = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
        n = len(self.sessions)
        return {
            "sessions": n,
            "mean_task_latency_s": self.mean_task_latency_s,
            "p90_task_latency_s": p90,
            "mean_llm_s": sum(s.llm_s for s in self.sessions) / n if n else 0.0,
            "mean_tool_s": sum(s.tool_s for s in self.sessions) / n if n else 0.0,
        }


class _Batch1:
    """Batch-1 step times of one profile, decode sums from a prefix-sum table."""

    def __init__(self, profile: Profile, max_num_batched_tokens: int | None = None) -> None:
        self.cost = StepTimeModel(profile)
        self.block = profile.block_size
        self.budget = profile.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
        self._cum = np.zeros(1)  # _cum[q] = Σ_{p<q} decode step at p computed tokens

    def _grow(self, upto: int) -> None:
        if upto < len(self._cum):
            return
        size = max(upto + 1, 2 * len(self._cum), 4096)
        p = np.arange(size - 1, dtype=np.float64)
        steps = np.asarray(self.cost.step_time_s(1, 1, 1, p + 1, p + 1), dtype=np.float64)  # type: ignore[arg-type]
        self._cum = np.concatenate(([0.0], np.cumsum(steps)))

    def decode_s(self, first_p: int, steps: int) -> float:
        """Decode steps at ``first_p``, ``first_p + 1``, ... computed tokens (``steps`` of them)."""
        if steps <= 0:
            return 0.0
        self._grow(first_p + steps)
        return float(self._cum[first_p + steps] - self._cum[first_p])

    def prefill_s(self, prompt: int, hit: int) -> float:
        """Chunked prefill of ``prompt`` tokens with ``hit`` cached; the last chunk samples."""
        t = 0.0
        p = hit
        while p < prompt:
            n = min(prompt - p, self.budget)
            sampled = 1 if p + n == prompt else 0
            t += self.cost.step_time_s(n, 1, sampled, p + n, n * p + n * (n + 1) * 0.5)
            p += n
        return t

    def session(self, s: TraceSession) -> SessionBound:
        bs = self.block
        cached = (s.system_prompt_tokens // bs) if s.shared_prefix_id else 0
        context = s.system_prompt_tokens
        llm = tool = 0.0
        for turn in s.turns:
            prompt = context + turn.append_tokens
            out = turn.output_tokens
            hit = min(cached, (prompt - 1) // bs) * bs
            llm += self.prefill_s(prompt, hit) + self.decode_s(prompt, out - 1)
            cached = max(cached, (prompt + out - 1) // bs)
            context = prompt + out
            if turn.tool is not None:
                tool += turn.tool.duration_s
        return SessionBound(s.session_id, llm + tool, llm, tool)


def lower_bound(sessions: Sequence[TraceSession], profile: Profile,
                max_num_batched_tokens: int | None = None) -> LowerBound:
    """Every session's no-contention latency on ``profile`` (see the module docstring)."""
    model = _batch1(profile, max_num_batched_tokens)
    return LowerBound(tuple(model.session(s) for s in sessions))


@functools.lru_cache(maxsize=16)
def _batch1(profile: Profile, max_num_batched_tokens: int | None) -> _Batch1:
    return _Batch1(profile, max_num_batched_tokens)


_BY_TRACE: dict[tuple[int, str, int | None], tuple[Sequence[TraceSession], LowerBound]] = {}


def cached_lower_bound(sessions: Sequence[TraceSession], profile: Profile,
                       max_num_batched_tokens: int | None = None) -> LowerBound:
    """``lower_bound`` memoised per (trace object, profile): every policy of a run, and every
    grid point on the same trace and profile, compute it once per process."""
    key = (id(sessions), profile.name, max_num_batched_tokens)
    hit = _BY_TRACE.get(key)
    if hit is not None and hit[0] is sessions:
        return hit[1]
    lb = lower_bound(sessions, profile, max_num_batched_tokens)
    if len(_BY_TRACE) >= 16:
        _BY_TRACE.pop(next(iter(_BY_TRACE)))
    _BY_TRACE[key] = (sessions, lb)
    return lb
