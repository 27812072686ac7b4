"""Workload parameters per kind, with their sources.

Distributions are clipped log-normals given by median and 90th percentile (``Dist``);
they are the published figures below turned into shapes, not fits to private data.
Where a figure is our estimate rather than a published number, the comment says so.

Sources (S1..S9 are referred to below):
- S1 mini-SWE-agent, ``config/extra/swebench.yaml`` (github.com/SWE-agent/mini-swe-agent):
  one bash command per step, ``step_limit: 250``, ``environment.timeout: 60`` s per command,
  observations longer than 10,000 characters are cut to head 5,000 + tail 5,000 characters
  (about 2,500 tokens at ~4 characters per token) plus a warning; system template ~110 tokens,
  instance template (instructions around the issue) ~1,400 tokens.
- S2 SWE-bench paper (Jimenez et al., ICLR 2024, Table 1): issue text mean 195 words,
  max 4,477 words (≈ 260 tokens mean, heavy tail).
- S3 nilenso, "SWE-Bench Pro trajectory analysis" (SWE-agent harness, 2,920 trajectories):
  median trajectory length 29–78 steps depending on the model.
- S4 TraceLab (Zhu et al. 2026, uw-syfi/TraceLab, 430k tool calls of Claude Code / Codex):
  median tool latency ~125 ms (Claude Code) and ~626 ms (Codex); file primitives (Read, Edit,
  Grep) take tens to hundreds of ms, shell execution seconds to minutes; most calls are fast but
  most tool *time* sits in the rare 1 s–10 min calls; long contexts with short outputs.
- S5 Claude Code ``/context`` output as published by users (e.g. dannywillems.github.io
  2026-01-16; wmedia.es tip #003): system prompt 2.6–3.3k tokens, built-in tool definitions
  11.6–17.6k tokens. Claude Code's Bash tool has a 120 s default / 600 s maximum timeout.
- S6 Terminal-Bench 2.0 (Merrill et al. 2026; harness configs such as hermes-agent
  ``terminalbench_2/default.yaml``): 89 long-horizon terminal tasks; harnesses allow 100–200
  turns and 300 s per command (builds, pip install).
- S7 OpenHands CodeAct (Wang et al. 2024, arXiv:2407.16741): tools execute_bash,
  str_replace_editor, think, finish; SWE-bench runs cap at 100 iterations. The system prompt
  plus tool schemas is ~3k tokens (our estimate from the published prompt and schemas).
- S8 ThunderAgent (Kang et al. 2026, arXiv:2602.13692): mini-SWE-agent and OpenHands tool calls
  are "lightweight and predictable"; agent steps reason on GPU, act on CPU.
- S9 the tenant budget-controller study (docs/algorithms.md#published-figures-budget-controller-study):
  bursty chat tenant with 64-token outputs versus a saturating
  batch tenant with 512-token outputs.
- S10 ThunderAgent's SWE-agent profile (github.com/ThunderAgent-org/ThunderAgent,
  ``SWE-agent-profile/real_chunk_prefill/...GLM-4.5-FP8...bs32/*/stage_timings.jsonl``): per step,
  tool execution 0.11–0.64 s, plus harness time around it (response parsing before the tool,
  0.02–0.5 s; observation packaging after it, 0.13–0.22 s), so requests follow each other
  0.4–1.1 s apart for fast tools; 26 steps for django__django-13933.
The step-phase shift (exploration early, edits and tests late) follows the trajectory analyses
of SWE-agent/OpenHands runs (e.g. Graphectory, arXiv:2512.02393: localisation → patching →
validation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Z90 = 1.2815515655446004  # standard normal 90th percentile


@dataclass(frozen=True)
class Dist:
    """Log-normal with the given median and 90th percentile, clipped to [lo, hi]."""

    median: float
    p90: float
    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (0 < self.lo <= self.median <= self.hi and self.median <= self.p90):
            raise ValueError(f"inconsistent distribution {self}")

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def sigma(self) -> float:
        return math.log(self.p90 / self.median) / Z90


def const(value: float) -> Dist:
    return Dist(value, value, value, value)


@dataclass(frozen=True)
class ToolKind:
    """One kind of tool call a harness makes.

    ``phase``: "explore" kinds are favoured early in a task, "act" kinds late (the weight is
    scaled by 1.5 - p or 0.5 + p at task progress p in [0, 1]); "any" is flat.
    ``hint``: what the runner exposes besides the command:
      "harness"   the harness's per-command timeout is the deadline (duration capped by it);
      "timeout"   the agent wraps the command in an explicit timeout (deadline from ``timeouts_s``);
      "sleep"     the command starts with ``sleep N`` (duration = N + the rest);
      "progress"  the runner reports fraction done while running (pytest %, cargo N/M);
      "eta"       the runner reports an ETA (downloads, pip);
      "none"      nothing.
    """

    label: str
    name: str
    weight: float
    duration_s: Dist
    obs_tokens: Dist
    commands: tuple[str, ...]
    phase: str = "any"
    hints: tuple[str, ...] = ()
    timeouts_s: tuple[float, ...] = ()
    extra_output_tokens: Dist | None = None  # e.g. file content written by an edit command


@dataclass(frozen=True)
class Arrival:
    """How sessions arrive: all at 0 (a batch of tasks run by C workers), Poisson, or bursts."""

    mode: str  # "batch" | "poisson" | "bursty"
    rate_per_s: float = 0.0
    burst_size: float = 0.0  # mean sessions per burst
    burst_gap_s: float = 0.0  # mean time between burst starts
    burst_span_s: float = 0.0  # sessions of one burst arrive within this window


@dataclass(frozen=True)
class KindSpec:
    kind: str
    harness: str
    tenant: str
    shared_prefix_id: str | None
    system_prompt_tokens: int
    first_append_tokens: Dist  # task statement + harness instructions in turn 0
    turns: Dist
    output_tokens: Dist
    wrap_tokens: int  # harness wrapping around every observation (return code, tags)
    tools: tuple[ToolKind, ...]
    harness_timeout_s: float | None
    arrival: Arrival
    repos: tuple[str, ...] = field(default=())
    # Harness time between an LLM response and the next request besides the tool itself
    # (parsing, observation packaging), folded into each tool's duration_s (S10).
    step_overhead_s: Dist | None = None


SWE_REPOS = (
    "django", "sympy", "scikit-learn", "matplotlib", "sphinx", "pytest", "astropy",
    "requests", "xarray", "pylint", "flask", "seaborn",
)  # the 12 SWE-bench repositories (S2)

# ---- swe-lite: mini-SWE-agent on SWE-bench Lite (S1, S2, S3, S4, S8) ----
_MINI_TOOLS = (
    ToolKind("read", "bash", 0.30, Dist(0.08, 0.30, 0.01, 5.0), Dist(700, 2200, 30, 2600),
             ("nl -ba {file} | sed -n '{a},{b}p'", "cat {file}", "head -n {n} {file}", "sed -n '{a},{b}p' {file}"),
             phase="explore", hints=("harness",)),
    ToolKind("search", "bash", 0.22, Dist(0.15, 1.2, 0.01, 20.0), Dist(250, 1500, 10, 2600),
             ("grep -rn '{sym}' {pkg}/ | head -50", "find {pkg} -name '*{word}*.py'", "ls -la {dir}",
              "grep -rn 'def {sym}' --include='*.py' . | head -20"),
             phase="explore", hints=("harness",)),
    ToolKind("edit", "bash", 0.18, Dist(0.05, 0.15, 0.01, 2.0), Dist(15, 60, 3, 400),
             ("sed -i 's/{sym}(self)/{sym}(self, strict=False)/' {file}", "cat <<'EOF' > {file}\n...\nEOF",
              "python - <<'EOF'\nimport re; p='{file}'; ...\nEOF"),
             phase="act", hints=("harness",), extra_output_tokens=Dist(250, 900, 20, 3000)),
    ToolKind("run", "bash", 0.15, Dist(0.8, 4.0, 0.05, 60.0), Dist(120, 900, 5, 2600),
             ("cd /testbed && python reproduce_issue.py", "python -c 'import {pkg}; print({pkg}.__version__)'",
              "python reproduce.py 2>&1 | tail -30"),
             phase="act", hints=("harness",)),
    ToolKind("test", "bash", 0.12, Dist(6.0, 35.0, 0.5, 60.0), Dist(400, 2000, 20, 2600),
             ("cd /testbed && python -m pytest {test} -x -q", "python -m pytest {test} -k {word} -q 2>&1 | tail -40",
              "./tests/runtests.py {word} --parallel 1"),
             phase="act", hints=("harness", "progress")),
    ToolKind("sleep", "bash", 0.02, Dist(5.0, 15.0, 1.0, 30.0), Dist(40, 300, 5, 1500),
             ("sleep {n_s} && tail -n 30 /tmp/run.log", "sleep {n_s} && cat /tmp/out.txt"),
             hints=("harness", "sleep")),
    ToolKind("install", "bash", 0.01, Dist(15.0, 45.0, 2.0, 60.0), Dist(200, 1200, 20, 2600),
             ("pip install -e . -q", "pip install {word}"),
             hints=("harness", "eta")),
)

SWE_LITE = KindSpec(
    kind="swe-lite", harness="mini-swe-agent", tenant="default",
    shared_prefix_id="mini-swe-agent/system", system_prompt_tokens=110,
    first_append_tokens=Dist(1660, 2300, 1450, 7400),  # instructions ~1,400 (S1) + issue ~260 mean (S2)
    turns=Dist(28, 60, 6, 150),  # median within S3's 29–78 for weaker models; step_limit 250 (S1)
    output_tokens=Dist(220, 700, 30, 4096),  # THOUGHT + one command; estimate, short outputs (S4)
    wrap_tokens=15,  # <returncode>…</returncode><output>…</output> (S1)
    tools=_MINI_TOOLS, harness_timeout_s=60.0,  # S1
    arrival=Arrival("batch"), repos=SWE_REPOS,
    step_overhead_s=Dist(0.4, 0.7, 0.15, 2.0),  # S10
)

# ---- swe-verified: OpenHands CodeAct on SWE-bench Verified (S2, S7, S8, S4) ----
_OPENHANDS_TOOLS = (
    ToolKind("view", "str_replace_editor", 0.30, Dist(0.06, 0.25, 0.01, 3.0), Dist(900, 3000, 30, 4000),
             ("view {file} [{a}, {b}]", "view {dir}"), phase="explore"),
    ToolKind("search", "execute_bash", 0.18, Dist(0.2, 1.5, 0.01, 20.0), Dist(250, 1500, 10, 4000),
             ("grep -rn '{sym}' /workspace/{pkg} | head -40", "find /workspace -name '*{word}*'"),
             phase="explore"),
    ToolKind("edit", "str_replace_editor", 0.20, Dist(0.05, 0.2, 0.01, 2.0), Dist(180, 600, 20, 2000),
             ("str_replace {file}", "create /workspace/reproduce.py", "insert {file} {a}"),
             phase="act", extra_output_tokens=Dist(200, 800, 20, 3000)),
    ToolKind("run", "execute_bash", 0.14, Dist(1.0, 5.0, 0.05, 120.0), Dist(120, 900, 5, 4000),
             ("cd /workspace && python reproduce.py", "python -c 'from {pkg} import {sym}'"), phase="act"),
    ToolKind("test", "execute_bash", 0.14, Dist(8.0, 40.0, 0.5, 300.0), Dist(500, 2500, 20, 4000),
             ("timeout {t} python -m pytest {test} -q", "cd /workspace && timeout {t} python -m pytest {test} -x"),
             phase="act", hints=("timeout", "progress"), timeouts_s=(60.0, 120.0, 300.0)),
    ToolKind("think", "think", 0.02, Dist(0.01, 0.03, 0.005, 0.1), Dist(10, 20, 5, 40), ("think",)),
    ToolKind("sleep", "execute_bash", 0.02, Dist(5.0, 15.0, 1.0, 30.0), Dist(40, 300, 5, 1500),
             ("sleep {n_s} && tail -n 40 /tmp/server.log",), hints=("sleep",)),
)

SWE_VERIFIED = KindSpec(
    kind="swe-verified", harness="openhands-codeact", tenant="default",
    shared_prefix_id="openhands/codeact-system", system_prompt_tokens=3000,  # S7 (estimate)
    first_append_tokens=Dist(700, 1500, 250, 6500),  # issue (S2) + OpenHands task wrapper (estimate)
    turns=Dist(35, 70, 8, 100),  # OpenHands SWE-bench max 100 iterations (S7); median within S3
    output_tokens=Dist(260, 800, 30, 4096),
    wrap_tokens=25,
    tools=_OPENHANDS_TOOLS, harness_timeout_s=None,
    arrival=Arrival("batch"), repos=SWE_REPOS,
    step_overhead_s=Dist(0.4, 0.7, 0.15, 2.0),  # S10 (same order for OpenHands' event loop; estimate)
)

# ---- terminal-bench: Claude Code harness on Terminal-Bench 2.0 (S4, S5, S6) ----
_CLAUDE_CODE_TOOLS = (
    ToolKind("read", "Read", 0.24, Dist(0.12, 0.5, 0.01, 5.0), Dist(800, 2800, 20, 6000),
             ("{file}",), phase="explore"),
    ToolKind("search", "Grep", 0.10, Dist(0.15, 0.8, 0.01, 10.0), Dist(200, 1200, 10, 4000),
             ("{sym}",), phase="explore"),
    ToolKind("edit", "Edit", 0.14, Dist(0.08, 0.3, 0.01, 2.0), Dist(60, 200, 10, 800),
             ("{file}",), phase="act", extra_output_tokens=Dist(200, 900, 20, 4000)),
    ToolKind("shell", "Bash", 0.30, Dist(0.6, 6.0, 0.02, 120.0), Dist(150, 1200, 5, 6000),
             ("ls -la {dir}", "cat /app/README.md", "python3 {file}", "gcc -O2 -o main main.c && ./main",
              "curl -s localhost:8080/health"),
             hints=("harness",)),
    ToolKind("build", "Bash", 0.09, Dist(25.0, 150.0, 2.0, 600.0), Dist(300, 2000, 20, 6000),
             ("make -j8 2>&1 | tail -40", "cargo build --release 2>&1 | tail -30", "cmake --build build -j8"),
             phase="act", hints=("timeout", "progress"), timeouts_s=(300.0, 600.0)),
    ToolKind("install", "Bash", 0.06, Dist(15.0, 90.0, 1.0, 300.0), Dist(200, 1500, 20, 6000),
             ("pip install {word} 2>&1 | tail -5", "apt-get install -y {word} > /dev/null 2>&1; echo $?",
              "npm install --silent"),
             hints=("timeout", "eta"), timeouts_s=(300.0,)),
    ToolKind("test", "Bash", 0.04, Dist(6.0, 40.0, 0.5, 300.0), Dist(300, 1800, 20, 6000),
             ("python3 -m pytest /app/tests -q 2>&1 | tail -20", "bash /app/run_tests.sh"),
             phase="act", hints=("harness", "progress")),
    ToolKind("wait", "Bash", 0.03, Dist(10.0, 45.0, 1.0, 120.0), Dist(60, 500, 5, 3000),
             ("sleep {n_s} && tail -n 20 /tmp/server.log", "sleep {n_s}; curl -s localhost:8000/status"),
             hints=("sleep",)),
)

TERMINAL_BENCH = KindSpec(
    kind="terminal-bench", harness="claude-code", tenant="default",
    shared_prefix_id="claude-code/system+tools", system_prompt_tokens=14800,  # 3.2k + 11.6k (S5)
    first_append_tokens=Dist(600, 1600, 150, 6000),  # task instruction + environment info (S6, estimate)
    turns=Dist(40, 100, 8, 200),  # long-horizon tasks, 100–200 turn caps (S6)
    output_tokens=Dist(250, 900, 20, 8192),
    wrap_tokens=20,
    tools=_CLAUDE_CODE_TOOLS, harness_timeout_s=120.0,  # Bash default timeout (S5)
    arrival=Arrival("batch"),
    step_overhead_s=Dist(0.3, 0.6, 0.1, 2.0),  # S10 order of magnitude (estimate for Claude Code)
)

# ---- chat-bursty / batch-steady: the two tenants of the budget study (S9) ----
CHAT_BURSTY = KindSpec(
    kind="chat-bursty", harness="chat", tenant="chat",
    shared_prefix_id="chat/system", system_prompt_tokens=400,
    first_append_tokens=Dist(120, 500, 10, 4000),
    turns=Dist(2, 4, 1, 8),
    output_tokens=const(64),  # S9
    wrap_tokens=4,
    tools=(ToolKind("think", "user", 1.0, Dist(6.0, 20.0, 0.5, 120.0), Dist(40, 200, 3, 2000), ("",)),),
    harness_timeout_s=None,
    arrival=Arrival("bursty", burst_size=24.0, burst_gap_s=15.0, burst_span_s=1.5),
)

BATCH_STEADY = KindSpec(
    kind="batch-steady", harness="batch", tenant="batch",
    shared_prefix_id="batch/system", system_prompt_tokens=200,
    first_append_tokens=Dist(1000, 2000, 100, 8000),
    turns=const(1),
    output_tokens=const(512),  # S9
    wrap_tokens=0,
    tools=(),
    harness_timeout_s=None,
    arrival=Arrival("poisson", rate_per_s=8.0),
)

KINDS: dict[str, KindSpec] = {
    k.kind: k for k in (SWE_LITE, SWE_VERIFIED, TERMINAL_BENCH, CHAT_BURSTY, BATCH_STEADY)
}
