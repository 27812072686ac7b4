"""Synthetic SWE-agent-like tool logs (tool events, docs/architecture.md#tool-events), for
tests and benchmarks.

The generator draws *what actually happens* (durations, progress) from latent per-repo and
per-task parameters, and emits only what a tool runner could know at each moment: the
command and any exposed deadline at start; progress reports computed causally from work
done so far (a tqdm-style ETA from a smoothed rate, a build's units done / total);
heartbeats every ``heartbeat_s`` of silence (as ``ToolReporter`` sends them); the finish.
Nothing about a call's duration leaks into its earlier events.

Sessions use one of three harnesses (shares 0.5 / 0.3 / 0.2): SWE-agent-like (tools
``str_replace_editor`` and ``bash``), Claude-Code-like (``Edit``, ``Grep``, ``Bash``) and
Terminus-like (every command typed through ``send_keys``; the command is drawn from the
SWE-agent mix). Between tool calls the LLM thinks for a log-normal ~4 s. Mix of tool
calls per harness (classes are the bench's "tool classes"):

=========  ======================================  =====  ======  ========
class      what                                    swe    claude  terminus
=========  ======================================  =====  ======  ========
edit       view / str_replace / create a file      0.32   0.30    —
search     grep -rn, find, cat, sed -n, ls, git    0.33   0.30    —
test       pytest / runtests.py on task targets    0.22   0.18    —
sleep      sleep N [&& curl | ; tail], wait loops  0.03   0.10    —
build      make/cmake/cargo/pip -e/npm (fraction)  0.05   0.06    —
eta        downloads, scripts with tqdm (ETA)      0.05   0.06    —
deadline   send_keys waiting a chosen `duration`    —      —      1.00
=========  ======================================  =====  ======  ========

Sources and judgement behind the numbers:

* Repositories: the 12 Python repositories of SWE-bench (Jimenez et al., ICLR 2024); each
  session works on one task; ``group_size`` sessions share a task, as RL rollouts sample
  several trajectories per task (GRPO-style groups) — set ``group_size=1`` for one-shot
  evaluation runs. Sessions make ~30 tool calls (SWE-agent / mini-SWE-agent trajectories
  on SWE-bench typically take a few dozen steps).
* Harness deadlines: the harness knows the timeout after which it kills a command and
  passes it to ``ToolReporter`` as ``deadline_s`` (an upper bound, not a return time):
  SWE-agent's action timeout (25 s, ``SWE_AGENT_ACTION_TIMEOUT``) on ``bash``, Claude Code's
  ``Bash`` default timeout (120 s); file tools expose none. Terminal-Bench's
  Terminus sends keystrokes with a ``duration`` (0.1 s for immediate commands, 1 s for
  compilers, longer for slow commands) and returns when it elapses — an exposed return
  deadline the tool meets, plus capture overhead.
* Durations (judgement, order of magnitude of a warm container): file edits/reads tens of
  ms; greps 0.05–0.5 s scaled by repository size; targeted test runs a few seconds with
  ~5 % run-to-run noise and a shift once the agent's fix lands; full builds tens of seconds,
  incremental ones 10–40 % of that; downloads and tqdm scripts ~20 s with a fluctuating
  rate; sleeps from what agents write (1–60 s, mostly ≤ 10 s).
* Test runs model pytest's output: start-up (imports, collection; django's test DB), then
  each test; ``-v`` prints ``[NN%]`` after every test, ``-q`` after each file's line of dots
  (a targeted run is one file: one ``[100%]`` when its tests are done, before teardown
  and the summary); django's ``runtests.py`` prints no percentages. The runner forwards
  percentages as ``fraction`` at most once a second. Repositories are drawn with
  SWE-bench's task counts as weights (django 850 of 2,294 tasks). A whole test module's
  tests belong to the repository (tasks on one repository running ``tests/test_io.py``
  run the same tests); a task's targeted tests are its own.
* Test commands vary between runs of one target (judgement from SWE-agent / OpenHands
  trajectories on SWE-bench: agents re-run the same test with other flags and often pipe
  the output through ``tail``/``head`` to keep the observation short). Each target has the
  agent's habitual spelling; with probability ``RESPELL_RATE`` (0.4) a run is spelled
  afresh: other pytest flags (``-x -q``, ``-xvs``, ``-q --tb=short``, ``-v``) or runtests.py
  options (``--verbosity 2``, ``--parallel 1``), and with probability ``PIPE_RATE`` (0.5) of
  those ``2>&1 | tail -n 30``-style pipes, which hide pytest's ``[NN%]`` from the runner (no
  fraction reports). A re-spelled run of a whole test module is narrowed with ``-k WORD``
  with probability ``K_RATE`` (0.25): it runs the module's tests selected by that word
  (about a fifth, the same ones for the same word), so its duration depends on the
  selection. Flags and pipes do not change a run's duration (only what runs does).
* Rare long outliers: 1.5 % of greps, tests, builds and ETA tools stall for 3–14× their
  normal duration at a random point (a lock, the network, a hung test); the harness kills
  anything past its timeout. They stay in their class and are flagged ``outlier``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.predictor.core.events import EventType, ToolEvent

CLASSES = ("edit", "search", "test", "sleep", "build", "eta", "deadline")
HARNESS_WEIGHTS = {"swe": 0.5, "claude": 0.3, "terminus": 0.2}
CLASS_WEIGHTS = {
    "swe": {"edit": 0.32, "search": 0.33, "test": 0.22, "sleep": 0.03, "build": 0.05, "eta": 0.05},
    "claude": {"edit": 0.30, "search": 0.30, "test": 0.18, "sleep": 0.10, "build": 0.06, "eta": 0.06},
}
SWE_TIMEOUT_S = 25.0  # SWE-agent SWE_AGENT_ACTION_TIMEOUT default (exposed as deadline_s)
CLAUDE_TIMEOUT_S = 120.0  # Claude Code Bash default timeout (exposed as deadline_s)
OUTLIER_RATE = 0.015
# test runs spelled unlike the agent's habit for that target; of those, piped through tail/head;
# re-spelled whole-module pytest runs narrowed with -k (module docstring, judgement)
RESPELL_RATE = 0.4
PIPE_RATE = 0.5
K_RATE = 0.25
_PYTEST_FLAGS = (("-x -q", "file"), ("-xvs", "verbose"), ("-q --tb=short", "file"), ("-v", "verbose"))
_RUNTESTS_OPTS = (" --verbosity 2", " --parallel 1", " --verbosity 2 --parallel 1", "")
_PIPES = (" 2>&1 | tail -n 30", " 2>&1 | tail -50", " 2>&1 | head -100")

# SWE-bench's 12 repositories: (name, tasks in SWE-bench — the sampling weight, grep scale,
# test start-up seconds (imports, collection, django's test DB), median seconds per test,
# where its tests live)
REPOS = (
    ("django", 850, 2.5, 1.8, 0.08, "tests"), ("sympy", 386, 2.0, 1.2, 0.6, "sympy/core/tests"),
    ("scikit-learn", 229, 1.8, 1.5, 0.4, "sklearn/tests"), ("sphinx", 187, 1.0, 0.8, 0.3, "tests"),
    ("matplotlib", 184, 1.6, 1.2, 0.3, "lib/matplotlib/tests"), ("pytest", 119, 0.8, 0.4, 0.1, "testing"),
    ("xarray", 110, 1.0, 1.5, 0.2, "xarray/tests"), ("astropy", 95, 2.0, 1.5, 0.3, "astropy/units/tests"),
    ("pylint", 57, 1.0, 0.8, 0.3, "tests"), ("requests", 44, 0.4, 0.3, 0.1, "tests"),
    ("seaborn", 22, 0.6, 1.0, 0.4, "tests"), ("flask", 11, 0.4, 0.3, 0.05, "tests"),
)  # fmt: skip
_WORDS = ("parser", "model", "query", "field", "config", "utils", "core", "base", "io", "array",
          "render", "cache", "client", "session", "token", "expr", "units", "table", "plot", "lint")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """A progress event ``at_s`` after the call started (None fields: a bare heartbeat)."""

    at_s: float
    eta_s: float | None = None
    fraction: float | None = None


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    """One generated tool call: what the runner sends and the hidden truth (duration)."""

    session_id: str
    call_id: str
    tool: str
    command: str
    tool_class: str
    start_s: float
    duration_s: float
    deadline_s: float | None
    progress: tuple[ProgressReport, ...] = ()
    outlier: bool = False

    def events(self) -> list[ToolEvent]:
        """started, progress..., finished — times rounded to the runner's 1 ms resolution."""
        sid, cid = self.session_id, self.call_id
        out = [ToolEvent(round(self.start_s, 3), sid, cid, EventType.STARTED, self.tool, self.command,
                         deadline_s=self.deadline_s, seq=0)]  # fmt: skip
        for i, r in enumerate(self.progress, start=1):
            out.append(ToolEvent(round(self.start_s + r.at_s, 3), sid, cid, EventType.PROGRESS, self.tool,
                                 eta_s=r.eta_s, fraction=r.fraction, seq=i))  # fmt: skip
        out.append(ToolEvent(round(self.start_s + self.duration_s, 3), sid, cid, EventType.FINISHED, self.tool,
                             seq=len(self.progress) + 1))  # fmt: skip
        return out

    def to_trace_tool(self) -> dict[str, Any]:
        """The ``tool`` object of a trace turn (docs/architecture.md#trace-format)."""
        d: dict[str, Any] = {"name": self.tool, "command": self.command, "duration_s": round(self.duration_s, 3)}
        if self.deadline_s is not None:
            d["deadline_s"] = self.deadline_s
        if self.progress:
            d["progress"] = [{"at_s": round(r.at_s, 3), "eta_s": r.eta_s, "fraction": r.fraction} for r in self.progress]
        return d


@dataclass(frozen=True, slots=True)
class _Target:
    """A test command: start-up, the cost of each test it runs, how pytest reports progress."""

    command: str  # the agent's habitual spelling
    startup_s: float
    test_costs_s: tuple[float, ...]
    fixed_factor: float  # tests' cost multiplier once the agent's fix is in
    progress: str  # "verbose" ([NN%] per test, -v), "file" ([NN%] per file line, -q), "none"
    base: str = ""  # the command without flags: `python -m pytest tests/test_io.py`
    pytest: bool = True
    broad: bool = False


@dataclass(slots=True)
class _Task:
    repo: str
    grep_scale: float
    targets: list[_Target]  # the task's targeted tests, then one broad (whole-file) run
    build: tuple[str, float]  # (command, full build seconds)
    server_start_s: float
    port: int
    files: list[str]


@dataclass(slots=True)
class _SessionCtx:
    harness: str
    task: _Task
    builds_done: int = 0
    step: int = 0
    steps: int = 30
    extra: dict[str, float] = field(default_factory=dict)


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _make_target(rng: random.Random, repo: tuple[str, int, float, float, float, str], index: int,
                 broad: bool) -> _Target:  # fmt: skip
    """A targeted test of this task, or a whole test module of the repository. A module's
    tests (their count and cost) belong to the repository, not the task: tasks on the same
    repository that run ``tests/test_io.py`` run the same tests."""
    name, _, _, startup, per_test, where = repo
    mod, fn = rng.choice(_WORDS), rng.choice(_WORDS)
    own = random.Random(f"{name}/{mod}") if broad else rng
    n = own.randint(10, 120) if broad else rng.choice([1, 1, 1, 2, 3])
    costs = tuple(_lognormal(own, per_test, 0.8) for _ in range(n))
    start = _lognormal(own, startup, 0.3)
    if name == "django":  # unittest runner: dots / test names, no percentages
        label = f"{mod}_tests" if broad else f"{mod}_tests.tests.{fn.title()}Tests.test_{fn}_{index}"
        base = f"python tests/runtests.py {label}"
        return _Target(f"{base} --verbosity 2", start, costs, _lognormal(rng, 1.0, 0.15), "none", base, False,
                       broad)  # fmt: skip
    flags = rng.choice([("-x -q", "file"), ("-xvs", "verbose"), ("-q --tb=short", "file"), ("-v", "verbose")])
    target = f"{where}/test_{mod}.py" + ("" if broad else f"::test_{fn}_{index}")
    base = f"python -m pytest {target}"
    return _Target(f"{base} {flags[0]}", start, costs, _lognormal(rng, 1.0, 0.15), flags[1], base, True,
                   broad)  # fmt: skip


def _make_task(rng: random.Random, index: int) -> _Task:
    repo = rng.choices(REPOS, weights=[r[1] for r in REPOS])[0]
    name, scale = repo[0], repo[2]
    files = [f"{name}/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}.py" for _ in range(6)]
    targets = [_make_target(rng, repo, index * 10 + k, broad=False) for k in range(rng.randint(1, 3))]
    targets.append(_make_target(rng, repo, index, broad=True))
    build_cmd = rng.choice(["make -j4", "cmake --build build -j 4", "cargo build --release",
                            "pip install -e .", "npm run build"])  # fmt: skip
    return _Task(name, scale, targets, (build_cmd, _lognormal(rng, 30.0, 0.6)),
                 _lognormal(rng, 4.0, 0.5), 8000 + rng.randrange(100), files)  # fmt: skip


def _spell(rng: random.Random, target: _Target) -> tuple[str, str, tuple[float, ...]]:
    """(command, progress mode, costs of the tests it runs) of one run of ``target``: the
    habitual spelling, or with ``RESPELL_RATE`` other flags, maybe a pipe (no progress), maybe
    ``-k`` on a whole module (module docstring)."""
    if rng.random() >= RESPELL_RATE:
        return target.command, target.progress, target.test_costs_s
    costs = target.test_costs_s
    if target.pytest:
        flags, progress = rng.choice(_PYTEST_FLAGS)
        sel = ""
        if target.broad and rng.random() < K_RATE:
            word = rng.choice(_WORDS)
            pick = random.Random(f"{target.base} -k {word}")  # the same word selects the same tests
            costs = tuple(c for c in costs if pick.random() < 0.2) or costs[:1]
            sel = f" -k {word}"
        command = f"{target.base}{sel} {flags}"
    else:
        command, progress = target.base + rng.choice(_RUNTESTS_OPTS), "none"
    if rng.random() < PIPE_RATE:
        command, progress = command + rng.choice(_PIPES), "none"  # the pipe holds the output back
    return command, progress, costs


def _test_run(rng: random.Random, target: _Target, fixed: bool, progress: str,
              costs: tuple[float, ...]) -> tuple[float, list[ProgressReport]]:  # fmt: skip
    """Duration and the runner's reports of one run of ``costs`` (the tests it runs): pytest
    prints ``[NN%]`` after each test (-v) or after each file's line of dots (-q; a targeted
    run is one file, so one line at the end of the tests); the runner forwards them at most
    once a second."""
    factor = (target.fixed_factor if fixed else 1.0) * _lognormal(rng, 1.0, 0.05)
    t = target.startup_s * _lognormal(rng, 1.0, 0.05)
    reports: list[ProgressReport] = []
    last = -math.inf
    n = len(costs)
    for i, cost in enumerate(costs, start=1):
        t += cost * factor
        if progress == "verbose" or (progress == "file" and i == n):
            if t - last >= 1.0:
                reports.append(ProgressReport(t, fraction=round(i / n, 4)))
                last = t
    return t + rng.uniform(0.03, 0.15), reports  # + teardown and the summary line


def _heartbeats(duration_s: float, reports: list[ProgressReport], every_s: float) -> list[ProgressReport]:
    """Add bare heartbeats wherever the call was silent for ``every_s``."""
    out: list[ProgressReport] = []
    last = 0.0
    for r in sorted(reports, key=lambda r: r.at_s):
        while r.at_s - last > every_s:
            last += every_s
            out.append(ProgressReport(last))
        out.append(r)
        last = r.at_s
    while duration_s - last > every_s:
        last += every_s
        out.append(ProgressReport(last))
    return out


def _build_progress(rng: random.Random, duration_s: float) -> list[ProgressReport]:
    """Units of uneven cost; a report (units done / total) when one completes, ≥ 1 s apart."""
    setup = min(duration_s * 0.2, rng.uniform(0.3, 2.0))
    units = max(5, int(duration_s * rng.uniform(2.0, 6.0)))
    costs = [math.exp(rng.gauss(0.0, 0.6)) for _ in range(units)]
    scale = (duration_s - setup) / sum(costs)
    t, last, reports = setup, -1.0, []
    for i, c in enumerate(costs[:-1], start=1):
        t += c * scale
        if t - last >= 1.0:
            reports.append(ProgressReport(t, fraction=round(i / units, 4)))
            last = t
    return reports


def _eta_progress(rng: random.Random, duration_s: float) -> list[ProgressReport]:
    """tqdm-like: work arrives at a fluctuating rate; ETA = remaining / smoothed rate, 1 s apart."""
    steps = max(2, int(duration_s / 0.25))
    speeds, x = [], 0.0
    for _ in range(steps):
        x = 0.8 * x + rng.gauss(0.0, 0.25)  # AR(1) log-speed
        speeds.append(math.exp(x))
    total_work = sum(speeds)
    dt = duration_s / steps
    done, rate_ema, reports, last = 0.0, 0.0, [], 0.0
    for i, v in enumerate(speeds[:-1], start=1):
        done += v
        inst = v / dt
        rate_ema = inst if rate_ema == 0.0 else 0.3 * inst + 0.7 * rate_ema  # tqdm smoothing 0.3
        t = i * dt
        if t - last >= 1.0:
            eta = (total_work - done) / rate_ema
            reports.append(ProgressReport(t, eta_s=round(eta, 3), fraction=round(done / total_work, 4)))
            last = t
    return reports


def _call(rng: random.Random, ctx: _SessionCtx, cls: str) -> tuple[str, float, list[ProgressReport]]:
    """(command, natural duration s, progress reports) for a tool class."""
    task = ctx.task
    f = rng.choice(task.files)
    if cls == "edit":
        verb = rng.choice(["view", "view", "str_replace", "str_replace", "create", "insert"])
        return f"{verb} /testbed/{f}", _lognormal(rng, 0.04, 0.4), []
    if cls == "search":
        kind = rng.random()
        if kind < 0.45:
            cmd = rng.choice([f'grep -rn "{rng.choice(_WORDS)}_{rng.choice(_WORDS)}" {task.repo}/',
                              f'find . -name "*{rng.choice(_WORDS)}*.py"'])  # fmt: skip
            return cmd, task.grep_scale * _lognormal(rng, 0.1, 0.5), []
        a = rng.randrange(1, 400)
        cmd = rng.choice([f"cat {f}", f"sed -n '{a},{a + 40}p' {f}", f"ls {task.repo}/", "git diff", "git status",
                          f"head -n 60 {f}"])  # fmt: skip
        return cmd, _lognormal(rng, 0.015, 0.5), []
    if cls == "test":
        target = rng.choice(task.targets[:-1]) if rng.random() < 0.8 else task.targets[-1]
        command, progress, costs = _spell(rng, target)
        d, reports = _test_run(rng, target, ctx.step > 0.6 * ctx.steps, progress, costs)
        return command, d, reports
    if cls == "sleep":
        if rng.random() < 0.1:
            cmd = f"until curl -s localhost:{task.port}/health > /dev/null; do sleep 1; done"
            start = _lognormal(rng, task.server_start_s, 0.1)
            return cmd, math.ceil(start) + _lognormal(rng, 0.03, 0.3), []
        n = rng.choices([1, 2, 3, 5, 10, 15, 30, 60], weights=[15, 20, 15, 20, 15, 5, 7, 3])[0]
        spelled = rng.choice([str(n), f"{n}s", f"{n}"]) if n < 60 else rng.choice(["60", "1m"])
        tail = rng.random()
        if tail < 0.4:
            return f"sleep {spelled}", n + _lognormal(rng, 0.003, 0.3), []
        if tail < 0.75:
            return (f"sleep {spelled} && curl -s localhost:{task.port}/health",
                    n + _lognormal(rng, 0.04, 0.4), [])  # fmt: skip
        return f"sleep {spelled}; tail -n 20 /tmp/server.log", n + _lognormal(rng, 0.006, 0.3), []
    if cls == "build":
        cmd, full = task.build
        d = full if ctx.builds_done == 0 else full * rng.uniform(0.1, 0.4)
        ctx.builds_done += 1
        return cmd, d, []
    if cls == "eta":
        cmd = rng.choice([f"python scripts/download_{rng.choice(_WORDS)}.py", "huggingface-cli download org/model",
                          f"python train.py --max-steps {rng.choice([50, 100, 200])}",
                          f"wget -q --show-progress https://example.org/{rng.choice(_WORDS)}.tar.gz"])  # fmt: skip
        return cmd, _lognormal(rng, 20.0, 0.7), []
    raise ValueError(f"unknown class {cls}")


def session_calls(
    rng: random.Random, session_id: str, task: _Task, harness: str, arrival_s: float, heartbeat_s: float = 10.0
) -> Iterator[ToolCallPlan]:
    """The tool calls of one session, in order (LLM think time between them)."""
    ctx = _SessionCtx(harness, task, steps=max(5, int(_lognormal(rng, 30, 0.35))))
    t = arrival_s
    for step in range(ctx.steps):
        ctx.step = step
        t += _lognormal(rng, 4.0, 0.6)  # the LLM turn before this tool call
        cid = f"{session_id}-c{step}"
        if harness == "terminus":
            cls = _pick(rng, CLASS_WEIGHTS["swe"])
            cmd, natural, _ = _call(rng, ctx, cls)
            dur_choice = 0.1 if natural < 0.1 else (1.0 if natural < 1.0 else rng.choice([5.0, 10.0, 15.0, 30.0, 60.0]))
            wait_s = float(min(60.0, dur_choice))
            d = wait_s + _lognormal(rng, 0.04, 0.3)
            plan = ToolCallPlan(session_id, cid, "send_keys", cmd + "\n", "deadline", t, d, wait_s,
                                tuple(_heartbeats(d, [], heartbeat_s)))  # fmt: skip
        else:
            cls = _pick(rng, CLASS_WEIGHTS[harness])
            cmd, d, reports = _call(rng, ctx, cls)
            outlier = cls in ("search", "test", "build", "eta") and rng.random() < OUTLIER_RATE
            if outlier:  # a stall (lock, network, hung test) somewhere in the run
                at, extra = rng.uniform(0.0, d), d * rng.uniform(3.0, 14.0)
                reports = [ProgressReport(r.at_s + extra, r.eta_s, r.fraction) if r.at_s > at else r for r in reports]
                d += extra
            limit = SWE_TIMEOUT_S if harness == "swe" else CLAUDE_TIMEOUT_S
            if d > limit:  # the harness kills it
                d = limit + _lognormal(rng, 0.05, 0.3)
                reports = [r for r in reports if r.at_s < d]
            if cls == "build":
                reports = _build_progress(rng, d)
            elif cls == "eta":
                reports = _eta_progress(rng, d)
            if harness == "swe":
                tool = "str_replace_editor" if cls == "edit" else "bash"
                deadline = SWE_TIMEOUT_S if tool == "bash" else None
            else:
                tool = {"edit": "Edit", "search": "Grep"}.get(cls, "Bash")
                deadline = CLAUDE_TIMEOUT_S if tool == "Bash" else None
            plan = ToolCallPlan(session_id, cid, tool, cmd, cls, t, d, deadline,
                                tuple(_heartbeats(d, reports, heartbeat_s)), outlier)  # fmt: skip
        yield plan
        t += plan.duration_s


@dataclass(frozen=True, slots=True)
class SyntheticLog:
    calls: tuple[ToolCallPlan, ...]
    events: tuple[ToolEvent, ...]  # all calls' events, sorted by time


def generate(sessions: int, seed: int = 0, group_size: int = 4, mean_interarrival_s: float = 2.0,
             heartbeat_s: float = 10.0) -> SyntheticLog:  # fmt: skip
    """A log of ``sessions`` concurrent agent sessions (deterministic for a seed)."""
    if sessions < 1 or group_size < 1:
        raise ValueError("sessions and group_size must be >= 1")
    rng = random.Random(seed)
    tasks = [_make_task(rng, i) for i in range(math.ceil(sessions / group_size))]
    calls: list[ToolCallPlan] = []
    t = 0.0
    for i in range(sessions):
        t += rng.expovariate(1.0 / mean_interarrival_s)
        harness = _pick(rng, HARNESS_WEIGHTS)
        srng = random.Random(f"{seed}-{i}")
        calls.extend(session_calls(srng, f"s{i:05d}", tasks[i // group_size], harness, t, heartbeat_s))
    events = sorted((e for c in calls for e in c.events()), key=lambda e: (e.t, e.session_id, e.seq))
    return SyntheticLog(tuple(calls), tuple(events))


def write_jsonl(events: Sequence[ToolEvent], path: str) -> None:
    with (sys.stdout if path == "-" else open(path, "w", encoding="utf-8")) as fh:
        for e in events:
            fh.write(json.dumps(e.to_json(), separators=(",", ":")) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.predictor.synthetic", description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("-o", "--out", default="-", help="JSONL path ('-' for stdout)")
    ap.add_argument("--calls-out", default=None, help="also write per-call truth (class, duration) as JSONL")
    a = ap.parse_args(argv)
    log = generate(a.sessions, a.seed, a.group_size)
    write_jsonl(log.events, a.out)
    if a.calls_out:
        with open(a.calls_out, "w", encoding="utf-8") as fh:
            for c in log.calls:
                fh.write(json.dumps({"call_id": c.call_id, "session_id": c.session_id, "tool": c.tool,
                                     "class": c.tool_class, "duration_s": c.duration_s,
                                     "outlier": c.outlier}) + "\n")  # fmt: skip
    print(f"{len(log.calls)} calls, {len(log.events)} events", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
