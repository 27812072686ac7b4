"""The generator: valid, deterministic, and its documented distributions roughly hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.cli import main as tao_main
from services.sim.workload.generate import GenerateOptions, UnknownKindError, generate, generate_session
from services.sim.workload.params import KINDS, SWE_LITE
from services.sim.workload.stats import percentile, trace_stats
from services.sim.workload.trace import dump_lines, load_trace, parse_lines


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_generates_a_valid_trace(kind: str) -> None:
    sessions = generate(GenerateOptions(kind=kind, sessions=30, seed=3))
    reparsed = parse_lines(list(dump_lines(sessions)))  # validates every line again
    assert reparsed == sessions
    assert len({s.session_id for s in sessions}) == 30
    arrivals = [s.arrival_s for s in sessions]
    assert arrivals == sorted(arrivals)


def test_deterministic_for_a_seed_and_prefix_stable() -> None:
    a = list(dump_lines(generate(GenerateOptions(kind="swe-lite", sessions=40, seed=7))))
    b = list(dump_lines(generate(GenerateOptions(kind="swe-lite", sessions=40, seed=7))))
    c = list(dump_lines(generate(GenerateOptions(kind="swe-lite", sessions=40, seed=8))))
    short = list(dump_lines(generate(GenerateOptions(kind="swe-lite", sessions=10, seed=7))))
    assert a == b
    assert a != c
    assert short == a[:10]


def test_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(UnknownKindError, match="swe-lite"):
        generate(GenerateOptions(kind="nope", sessions=1))


def test_swe_lite_distributions_match_the_documented_parameters() -> None:
    sessions = generate(GenerateOptions(kind="swe-lite", sessions=400, seed=11))
    st = trace_stats(sessions)
    # turns: median 28 (clipped log-normal), within sampling noise
    assert 24 <= st.turns_p50 <= 32
    # tools: most calls sub-second, a long tail of tests, none beyond the 60 s harness timeout
    assert st.tool_s_p50 < 1.0
    assert 3.0 < st.tool_s_p90 < 20.0
    durations = [t.tool.duration_s for s in sessions for t in s.turns if t.tool]
    assert max(durations) <= 60.0
    assert st.tools_with_deadline == 1.0  # mini-SWE-agent's 60 s timeout applies to every command
    assert 0.005 < st.tools_with_sleep < 0.06
    # observations are truncated around 2,500 tokens (10,000 characters) + wrapping
    appends = [t.append_tokens for s in sessions for t in s.turns[1:]]
    assert max(appends) <= 2600 + SWE_LITE.wrap_tokens
    # shared system prompt
    assert {s.shared_prefix_id for s in sessions} == {"mini-swe-agent/system"}


def test_phase_shift_more_edits_and_tests_late() -> None:
    sessions = generate(GenerateOptions(kind="swe-lite", sessions=300, seed=5))
    early = late = early_act = late_act = 0
    for s in sessions:
        n = len(s.turns)
        for i, t in enumerate(s.turns):
            if t.tool is None:
                continue
            act = bool(re.search(r"pytest|sed -i|cat <<|python - <<|reproduce|runtests", t.tool.command))
            if i < n / 3:
                early += 1
                early_act += act
            elif i > 2 * n / 3:
                late += 1
                late_act += act
    assert late_act / late > 1.5 * early_act / early


def test_hints_are_consistent_with_the_truth() -> None:
    for kind in ("swe-lite", "swe-verified", "terminal-bench"):
        for s in generate(GenerateOptions(kind=kind, sessions=60, seed=2)):
            for t in s.turns:
                tool = t.tool
                if tool is None:
                    continue
                if tool.deadline_s is not None:
                    assert tool.duration_s <= tool.deadline_s + 1e-9
                m = re.match(r"sleep (\d+)", tool.command)
                if m:
                    assert int(m.group(1)) <= tool.duration_s <= int(m.group(1)) + 5.0  # rest of the command + harness
                fracs = [e.fraction for e in tool.progress or () if e.fraction is not None]
                assert fracs == sorted(fracs)


def test_chat_and_batch_tenants_follow_the_budget_seed() -> None:
    chat = generate(GenerateOptions(kind="chat-bursty", sessions=200, seed=1))
    batch = generate(GenerateOptions(kind="batch-steady", sessions=400, seed=1))
    assert {t.output_tokens for s in chat for t in s.turns} == {64}
    assert {s.tenant for s in chat} == {"chat"}
    assert {t.output_tokens for s in batch for t in s.turns} == {512}
    assert all(len(s.turns) == 1 for s in batch)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(batch, batch[1:], strict=False)]
    assert 0.10 < sum(gaps) / len(gaps) < 0.15  # Poisson at 8 sessions/s
    # bursty: most chat gaps are tiny (inside a burst), a few are long (between bursts)
    cgaps = [b.arrival_s - a.arrival_s for a, b in zip(chat, chat[1:], strict=False)]
    assert percentile(cgaps, 50) < 0.2 < 5.0 < max(cgaps)


def test_context_limit_ends_sessions_early() -> None:
    s = generate_session(KINDS["terminal-bench"], seed=1, index=0, max_context_tokens=20000)
    last = len(s.turns) - 1
    assert s.prompt_tokens(last) + s.turns[last].output_tokens <= 20000
    assert s.turns[last].tool is None


def test_cli_writes_a_loadable_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    rc = tao_main(["workload", "generate", "--kind", "swe-verified", "--sessions", "5", "--seed", "4",
                   "-o", str(out)])
    assert rc == 0
    assert len(load_trace(out)) == 5
    assert "swe-verified: 5 sessions" in capsys.readouterr().err
    assert tao_main(["workload", "generate", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "Session"
    assert tao_main(["workload", "generate", "--kind", "swe-lite", "--sessions", "0", "-o", str(out)]) == 2
