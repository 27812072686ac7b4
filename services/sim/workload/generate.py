"""Deterministic generation of agent-workload traces from the kind specs in ``params``.

Invariant: session i of (kind, seed) depends only on (kind, seed, i) — generating 10 sessions
gives exactly the first 10 of a 160-session trace (arrival times excepted for Poisson/bursty
kinds, which depend on the count only through how many are drawn, so they also agree).
Python's ``random.Random`` seeded with a string is used (sha512 seeding: stable across runs
and platforms, independent of PYTHONHASHSEED).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from services.sim.workload.params import KINDS, Dist, KindSpec, ToolKind
from services.sim.workload.trace import ProgressEvent, Tool, TraceSession, Turn

_WORDS = (
    "parse", "render", "cache", "field", "query", "model", "token", "format", "index", "array",
    "units", "quantity", "axes", "figure", "manager", "config", "mixin", "expr", "solver", "matrix",
)
_SLEEP_STEPS = (1, 2, 3, 5, 8, 10, 15, 20, 30, 45, 60, 90, 120)


class UnknownKindError(ValueError):
    """The requested workload kind does not exist."""


def sample(rng: random.Random, d: Dist) -> float:
    """One draw of the clipped log-normal ``d``."""
    if d.lo == d.hi:
        return d.lo
    v = math.exp(rng.gauss(d.mu, d.sigma)) if d.sigma > 0 else d.median
    return min(d.hi, max(d.lo, v))


def sample_int(rng: random.Random, d: Dist) -> int:
    return max(int(d.lo), min(int(d.hi), int(round(sample(rng, d)))))


def _pick_tool(rng: random.Random, tools: Sequence[ToolKind], progress: float) -> ToolKind:
    weights = []
    for t in tools:
        w = t.weight
        if t.phase == "explore":
            w *= 1.5 - progress
        elif t.phase == "act":
            w *= 0.5 + progress
        weights.append(w)
    return rng.choices(list(tools), weights=weights, k=1)[0]


def _fill(rng: random.Random, template: str, repo: str, extra: dict[str, object]) -> str:
    word = rng.choice(_WORDS)
    pkg = repo.replace("-", "_") if repo else "app"
    a = rng.randint(1, 800)
    values: dict[str, object] = {
        "pkg": pkg,
        "word": word,
        "sym": f"_{word}_{rng.choice(_WORDS)}",
        "file": f"{pkg}/{rng.choice(_WORDS)}/{word}.py" if repo else f"/app/{word}.py",
        "dir": f"{pkg}/{word}" if repo else "/app",
        "test": f"{pkg}/tests/test_{word}.py" if repo else f"/app/tests/test_{word}.py",
        "a": a,
        "b": a + rng.choice((20, 40, 60, 100)),
        "n": rng.choice((50, 100, 200)),
    }
    values.update(extra)
    return template.format(**values)


def _ticks(duration_s: float, step_s: float) -> list[float]:
    """Report times k * step strictly before the end, floored to the millisecond."""
    out = []
    k = 1
    while k * step_s < duration_s:
        t = math.floor(k * step_s * 1000.0) / 1000.0
        if t < duration_s:
            out.append(t)
        k += 1
    return out


def _progress_events(rng: random.Random, duration_s: float, hints: tuple[str, ...]) -> tuple[ProgressEvent, ...]:
    """Runner progress reports: fraction done (possibly non-linear in time) or a noisy ETA."""
    if duration_s < 1.5:
        return ()
    events: list[ProgressEvent] = []
    if "progress" in hints:
        gamma = rng.uniform(0.7, 1.4)  # test suites and builds do not progress linearly
        step = max(0.5, duration_s / 8.0)
        for t in _ticks(duration_s, step):
            frac = max(0.001, min(0.999, round((t / duration_s) ** gamma, 3)))
            events.append(ProgressEvent(after_s=t, fraction=frac))
    elif "eta" in hints:
        step = max(1.0, duration_s / 5.0)
        for t in _ticks(duration_s, step):
            eta = (duration_s - t) * math.exp(rng.gauss(0.0, 0.3))
            events.append(ProgressEvent(after_s=t, eta_s=round(eta, 3)))
    return tuple(events)


def _make_tool(rng: random.Random, spec: KindSpec, kind: ToolKind, repo: str) -> Tool:
    duration = sample(rng, kind.duration_s)
    extra: dict[str, object] = {}
    deadline: float | None = None
    if "sleep" in kind.hints:
        n = min(_SLEEP_STEPS, key=lambda s: abs(s - duration))
        extra["n_s"] = n
        duration = n + sample(rng, Dist(0.05, 0.4, 0.01, 3.0))  # the command after the sleep
    if "timeout" in kind.hints and kind.timeouts_s:
        deadline = rng.choice(kind.timeouts_s)
        extra["t"] = int(deadline)
        duration = min(duration, deadline)  # killed at the timeout
    if spec.step_overhead_s is not None:
        duration += sample(rng, spec.step_overhead_s)
        if deadline is not None:
            duration = min(duration, deadline)
    if "harness" in kind.hints and spec.harness_timeout_s is not None:
        duration = min(duration, spec.harness_timeout_s)
        deadline = spec.harness_timeout_s if deadline is None else min(deadline, spec.harness_timeout_s)
    command = _fill(rng, rng.choice(kind.commands), repo, extra)
    duration = round(duration, 4)
    progress = _progress_events(rng, duration, kind.hints)
    return Tool(name=kind.name, command=command, duration_s=duration, deadline_s=deadline,
                progress=progress or None)


DEFAULT_MAX_CONTEXT_TOKENS = 131072  # 128k-token context windows (Qwen3 with YaRN, GLM-4.x, DeepSeek)


def generate_session(spec: KindSpec, seed: int, index: int, arrival_s: float = 0.0,
                     max_turns: int | None = None,
                     max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS) -> TraceSession:
    """Session ``index`` of kind ``spec`` for ``seed`` (deterministic).

    A session whose next turn would not fit ``max_context_tokens`` (prompt + output) ends at
    the previous turn, as harnesses do on context overflow (SWE-agent's ``exit_context``).
    """
    rng = random.Random(f"tao-workload:{spec.kind}:{seed}:{index}")
    repo = rng.choice(spec.repos) if spec.repos else ""
    n_turns = sample_int(rng, spec.turns)
    if max_turns is not None:
        n_turns = max(1, min(n_turns, max_turns))
    turns: list[Turn] = []
    append = sample_int(rng, spec.first_append_tokens)
    context = spec.system_prompt_tokens
    for i in range(n_turns):
        output = sample_int(rng, spec.output_tokens)
        tool: Tool | None = None
        next_append = 0
        if i < n_turns - 1 and spec.tools:
            progress = i / max(1, n_turns - 2)
            kind = _pick_tool(rng, spec.tools, progress)
            if kind.extra_output_tokens is not None:
                output += sample_int(rng, kind.extra_output_tokens)
            tool = _make_tool(rng, spec, kind, repo)
            next_append = sample_int(rng, kind.obs_tokens) + spec.wrap_tokens
        if context + append + output > max_context_tokens:
            if turns:  # end at the previous turn: its tool never runs
                prev = turns[-1]
                turns[-1] = Turn(append_tokens=prev.append_tokens, output_tokens=prev.output_tokens, tool=None)
                break
            append = max(0, min(append, max_context_tokens - context - 1))
            output = max(1, max_context_tokens - context - append)
            tool = None
            n_turns = 1
        if i == n_turns - 1:
            tool = None
        context += append + output
        turns.append(Turn(append_tokens=append, output_tokens=output, tool=tool))
        if tool is None:
            break
        append = next_append
    width = 5
    return TraceSession(
        session_id=f"{spec.kind}-{index:0{width}d}",
        tenant=spec.tenant,
        arrival_s=round(arrival_s, 4),
        system_prompt_tokens=spec.system_prompt_tokens,
        shared_prefix_id=spec.shared_prefix_id,
        turns=tuple(turns),
    )


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method; fine for the small means used here.
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def arrival_times(spec: KindSpec, n: int, seed: int, rate_per_s: float | None = None) -> list[float]:
    """Arrival time of each of ``n`` sessions, non-decreasing.

    ``rate_per_s`` overrides the kind's pattern: 0 = all at t=0 (a batch run by C workers),
    > 0 = Poisson at that rate.
    """
    rng = random.Random(f"tao-arrivals:{spec.kind}:{seed}")
    mode = spec.arrival.mode
    rate = spec.arrival.rate_per_s
    if rate_per_s is not None:
        mode, rate = ("batch", 0.0) if rate_per_s == 0 else ("poisson", rate_per_s)
    if mode == "batch":
        return [0.0] * n
    if mode == "poisson":
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    # bursty: burst starts ~ Poisson process, sizes ~ Poisson(mean), spread over a short window
    out, start = [], 0.0
    while len(out) < n:
        size = max(1, _poisson(rng, spec.arrival.burst_size))
        out.extend(start + rng.uniform(0.0, spec.arrival.burst_span_s) for _ in range(size))
        start += rng.expovariate(1.0 / spec.arrival.burst_gap_s)
    return sorted(out[:n])


@dataclass(frozen=True)
class GenerateOptions:
    kind: str
    sessions: int
    seed: int = 0
    arrival_rate_per_s: float | None = None
    tenant: str | None = None
    max_turns: int | None = None
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS


def kind_spec(kind: str) -> KindSpec:
    try:
        return KINDS[kind]
    except KeyError:
        raise UnknownKindError(f"unknown workload kind {kind!r}; known: {', '.join(sorted(KINDS))}") from None


def generate(opts: GenerateOptions) -> list[TraceSession]:
    """The whole trace for ``opts`` (deterministic)."""
    if opts.sessions < 1:
        raise ValueError(f"sessions must be >= 1, got {opts.sessions}")
    spec = kind_spec(opts.kind)
    arrivals = arrival_times(spec, opts.sessions, opts.seed, opts.arrival_rate_per_s)
    out = []
    for i, t in enumerate(arrivals):
        s = generate_session(spec, opts.seed, i, t, opts.max_turns, opts.max_context_tokens)
        if opts.tenant is not None:
            s = s.model_copy(update={"tenant": opts.tenant})
        out.append(s)
    return out
