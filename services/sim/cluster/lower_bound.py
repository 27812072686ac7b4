"""Two real lower bounds of the mean task latency: each session with no contention, and the
fleet's capacity.

**No contention** (``lower_bound``). Each session is played alone on one replica of the profile: its KV cache is never evicted (so
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

``capacity_bound`` (the block comment before it) is the second bound: the fleet's capacity in
a closed loop, which the first ignores (docs/algorithms.md#lower-bounds).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from services.sim.engine.engine import default_max_model_len, length_violation
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

    def session(self, s: TraceSession, max_model_len: int | None = None) -> SessionBound:
        """``s`` alone; with ``max_model_len``, up to the request vLLM's 400 refuses."""
        llm = tool = 0.0
        for prompt, hit, out, tool_s in turns_alone(s, self.block, max_model_len):
            llm += self.prefill_s(prompt, hit) + self.decode_s(prompt, out - 1)
            tool += tool_s
        return SessionBound(s.session_id, llm + tool, llm, tool)


def turns_alone(s: TraceSession, block_size: int, max_model_len: int | None = None,
                ) -> Iterator[tuple[int, int, int, float]]:
    """(prompt tokens, prefix hit, output tokens, the tool's seconds after it) of each turn of
    ``s`` played alone with its cache never evicted (the module docstring's hit rule); with
    ``max_model_len``, the turns before the first request vLLM's 400 refuses."""
    bs = block_size
    cached = (s.system_prompt_tokens // bs) if s.shared_prefix_id else 0
    context = s.system_prompt_tokens
    for turn in s.turns:
        prompt = context + turn.append_tokens
        out = turn.output_tokens
        if max_model_len is not None and length_violation(prompt, out, max_model_len) is not None:
            return  # vLLM's 400 ends the session here (as the simulator and the driver do)
        yield prompt, min(cached, (prompt - 1) // bs) * bs, out, turn.tool.duration_s if turn.tool is not None else 0.0
        cached = max(cached, (prompt + out - 1) // bs)
        context = prompt + out


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


# ------------------------------------------------------------------------- capacity bound
#
# The no-contention bound above ignores that sessions share the fleet: in a closed loop of C
# workers the mean latency is set by how fast the fleet gets through the work, not by one
# session alone. The capacity bound below is a second valid lower bound that counts that.
#
# 1. **Closed loop, exactly.** With every session arriving at t = 0 and C < N workers, the
#    first C sessions start at 0 and every later one starts the instant another ends, so
#        Σ_i latency_i = Σ_i end_i − Σ_i start_i = e_(N−C+1) + … + e_(N),
#    the sum of the last C completion times (e_(1) ≤ … ≤ e_(N) sorted). With no worker limit
#    it is Σ_j e_(j) − Σ_i arrival_i. The last C completions are also the C largest, so the
#    sum is at least that of the ends of the last C sessions in trace order (the harness
#    starts sessions in that order), each of which starts at the (i − C)-th completion and
#    then takes at least its no-contention latency.
# 2. **Work.** By the j-th completion at least j sessions have been served on R replicas, so
#    e_(j) ≥ W_j / R, W_j the least engine-seconds of any j sessions; e_(j) is also at least
#    the j-th smallest (arrival + no-contention latency).
# 3. **Engine-seconds of a set of sessions.** ``StepTimeModel`` prices a step as fixed +
#    L3(weights read, linear FLOPs) + L3(KV read, attention FLOPs) + all-reduce bytes·tokens +
#    per-seq·seqs, L3(a, b) = (a³ + b³)^⅓. Summed over steps, the L3 terms are at least the L3
#    of the sums (Minkowski), a step reads at least one token's weights, and the rest is
#    additive, with every prefix hit of the no-contention bound (cache never evicted, no
#    preemption). The step count S is at least each of Σ seq-steps / max_num_seqs (or C),
#    Σ tokens / max_num_batched_tokens and Σ tokens the scheduled sequences hold / K (every
#    running sequence's computed tokens stay resident; the shared system prompt is held once
#    for all, so it is left out). The cost is non-decreasing in every per-session sum, so the
#    sum of the j smallest of each, taken separately, bounds every set of j sessions.
#
# What it leaves out, so what the gap to it holds: the KV a session keeps (or recomputes)
# around its tool calls, steps smaller than KV allows (too few ready sessions), idle
# replicas, imbalance between replicas, and the order of completions (the bound lets the
# cheapest sessions finish first at the whole fleet's rate). A second form tried with it,
# engine-seconds mixed with KV-token-seconds and a tool's context kept or recomputed, never
# bound on the grid (a tool's hold is 4–13 % of the KV-token-seconds there) and was dropped.


@dataclass(frozen=True, slots=True)
class SessionWork:
    """One session's least engine work (section 3 of the block comment above)."""

    session_id: str
    seq_steps: int  # (sequence, step) pairs: one per decode step, one per prefill chunk
    tokens: int  # tokens computed: uncached prompt tokens plus decode tokens
    sampled: int  # output tokens (each samples once)
    kv_read: int  # KV tokens the attention reads, summed over steps
    attn_pairs: float  # causal query-key pairs
    held: int  # private tokens held, summed over the seq-steps (shared system prompt excluded)
    alone_s: float  # its no-contention latency, up to vLLM's 400 where one ends it
    completion_s: float  # arrival + alone_s: no completion is earlier


@dataclass(frozen=True, slots=True)
class CapacityBound:
    """``mean_task_latency_s``: a lower bound of the mean task latency that counts the fleet's
    capacity; ``no_contention_s`` the per-session bound's mean; ``work_s`` the least engine
    seconds of the whole trace (all replicas together);
    ``min_steps`` their least step count."""

    sessions: int
    mean_task_latency_s: float
    no_contention_s: float
    work_s: float
    min_steps: float
    binding: str  # "capacity" or "no-contention": which bound is larger

    def ratios(self, mean_task_latency_s: float, busy_s: float | None, complete: bool) -> dict[str, float | None]:
        """A run's ``latency_over_capacity_bound`` (None unless every session ``complete``d: the
        bound counts them all, a mean over the completed ones does not) and ``busy_over_work_bound``
        (its engines' busy seconds over the least work; None when unknown)."""
        return {
            "latency_over_capacity_bound": (mean_task_latency_s / self.mean_task_latency_s
                                            if complete and self.mean_task_latency_s > 0 else None),
            "busy_over_work_bound": busy_s / self.work_s if busy_s is not None and self.work_s > 0 else None,
        }

    def to_json(self) -> dict[str, float | int | str]:
        return {"sessions": self.sessions, "mean_task_latency_s": self.mean_task_latency_s,
                "no_contention_s": self.no_contention_s, "work_s": self.work_s,
                "min_steps": self.min_steps, "binding": self.binding}


class _Work:
    """One profile's unit costs and per-step caps (section 3)."""

    def __init__(self, batch1: _Batch1, profile: Profile, kv_tokens: int, max_seqs: int) -> None:
        self.b1 = batch1
        self.u = batch1.cost.unit_costs()
        self.kv_tokens = kv_tokens
        self.max_seqs = max_seqs
        self.budget = batch1.budget
        self.block = profile.block_size

    def session(self, s: TraceSession, max_model_len: int) -> SessionWork:
        bs, budget = self.block, self.budget
        shared = (s.system_prompt_tokens // bs) * bs if s.shared_prefix_id else 0
        seq_steps = tokens = sampled = kv = held = 0
        pairs = 0.0
        for prompt, hit, out, _ in turns_alone(s, bs, max_model_len):
            p = hit
            while p < prompt:  # prefill chunks of at most max_num_batched_tokens
                n = min(prompt - p, budget)
                seq_steps += 1
                kv += p + n
                held += p + n - shared
                p += n
            n = prompt - hit
            tokens += n + (out - 1)
            sampled += out
            pairs += n * hit + n * (n + 1) * 0.5
            d = out - 1  # decode steps at prompt, …, prompt + out − 2 computed tokens, each reads p + 1
            if d > 0:
                seq_steps += d
                kv_d = d * (prompt + 1) + d * (d - 1) // 2
                kv += kv_d
                pairs += kv_d
                held += kv_d - d * shared
        alone = self.b1.session(s, max_model_len).latency_s
        return SessionWork(s.session_id, seq_steps, tokens, sampled, kv, pairs, held, alone, s.arrival_s + alone)

    def steps(self, seq_steps: float, tokens: float, held: float) -> float:
        return max(seq_steps / self.max_seqs, tokens / self.budget, held / self.kv_tokens)

    def seconds(self, seq_steps: float, tokens: float, sampled: float, kv_read: float, attn_pairs: float,
                held: float) -> float:
        """The least engine-seconds of this much work (section 3)."""
        u = self.u
        s = self.steps(seq_steps, tokens, held)
        lin = _l3(s * u.weights_s, tokens * u.flop_token_s + sampled * u.flop_sample_s)
        attn = _l3(kv_read * u.kv_token_s, attn_pairs * u.pair_s)
        return s * u.fixed_s + lin + attn + tokens * u.ar_token_s + seq_steps * u.seq_s


def _l3(a: float, b: float) -> float:
    return float((a**3 + b**3) ** (1.0 / 3.0))


def capacity_bound(sessions: Sequence[TraceSession], profile: Profile, replicas: int,
                   concurrency: int | None = None, num_gpu_blocks: int | None = None,
                   max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                   ) -> CapacityBound:
    """A lower bound of the mean task latency of ``sessions`` on ``replicas`` replicas of
    ``profile`` with at most ``concurrency`` sessions active (the block comment above); the
    other arguments override the profile's engine settings as the simulator's ``SimConfig`` does."""
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    n = len(sessions)
    if n == 0:
        return CapacityBound(0, 0.0, 0.0, 0.0, 0.0, "no-contention")
    blocks = profile.default_num_gpu_blocks if num_gpu_blocks is None else num_gpu_blocks
    max_len = default_max_model_len(profile, blocks)
    c = n if concurrency is None else min(concurrency, n)
    seqs = profile.max_num_seqs if max_num_seqs is None else max_num_seqs
    work = _Work(_batch1(profile, max_num_batched_tokens), profile, blocks * profile.block_size, min(seqs, c))
    ws = [work.session(s, max_len) for s in sessions]
    no_contention = sum(w.alone_s for w in ws) / n
    # section 3: each sum over the j cheapest sessions, j = 1 … n, taken separately
    cols = {f: np.cumsum(np.sort(np.asarray([getattr(w, f) for w in ws], dtype=np.float64)))
            for f in ("seq_steps", "tokens", "sampled", "kv_read", "attn_pairs", "held")}
    by_work = np.asarray([work.seconds(**{f: float(col[j]) for f, col in cols.items()}) / replicas
                          for j in range(n)])
    e = np.maximum(by_work, np.sort(np.asarray([w.completion_s for w in ws])))
    arrivals = [s.arrival_s for s in sessions]
    if c >= n:
        total = float(e.sum()) - sum(arrivals)  # every session starts at its arrival
    elif all(a == 0.0 for a in arrivals):
        # section 1: the last C completions; they are also the C largest, so at least the ends
        # of the last C sessions in trace order, each started at the (i − C)-th completion
        starts = np.concatenate((np.zeros(c), e[: n - c]))
        alone = np.asarray([w.alone_s for w in ws])
        total = max(float(e[n - c:].sum()), float((starts + alone)[n - c:].sum()))
    else:
        total = 0.0  # a worker limit with staggered arrivals: only the per-session bound holds
    capacity = total / n
    return CapacityBound(
        sessions=n,
        mean_task_latency_s=max(capacity, no_contention),
        no_contention_s=no_contention,
        work_s=work.seconds(**{f: float(col[-1]) for f, col in cols.items()}),
        min_steps=work.steps(float(cols["seq_steps"][-1]), float(cols["tokens"][-1]), float(cols["held"][-1])),
        binding="capacity" if capacity > no_contention else "no-contention",
    )
