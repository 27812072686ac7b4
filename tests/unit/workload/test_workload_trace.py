"""The trace validator: valid traces load, invalid ones fail with a precise message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.sim.workload.trace import TraceError, json_schema, load_trace, parse_lines, write_trace


def _session(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "session_id": "s1",
        "tenant": "t",
        "arrival_s": 0.0,
        "system_prompt_tokens": 100,
        "shared_prefix_id": "sys",
        "turns": [
            {"append_tokens": 50, "output_tokens": 10,
             "tool": {"name": "bash", "command": "sleep 2", "duration_s": 2.0, "deadline_s": 60.0,
                      "progress": [{"after_s": 1.0, "fraction": 0.5}]}},
            {"append_tokens": 20, "output_tokens": 5, "tool": None},
        ],
    }
    base.update(over)
    return base


def _lines(*objs: object) -> list[str]:
    return [json.dumps(o) for o in objs]


def test_valid_trace_loads_and_derives_prompt_lengths() -> None:
    (s,) = parse_lines(_lines(_session()))
    assert s.prompt_tokens(0) == 150
    assert s.prompt_tokens(1) == 150 + 10 + 20
    assert s.total_output_tokens() == 15
    assert s.turns[0].tool is not None and s.turns[0].tool.progress is not None


def test_round_trip_preserves_sessions(tmp_path: Path) -> None:
    sessions = parse_lines(_lines(_session(), _session(session_id="s2", shared_prefix_id=None)))
    path = tmp_path / "t.jsonl"
    assert write_trace(sessions, path) == 2
    assert load_trace(path) == sessions
    # optional fields are omitted, not written as null
    second = json.loads(path.read_text().splitlines()[1])
    assert "shared_prefix_id" not in second


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda s: s.pop("tenant"), "tenant: Field required"),
        (lambda s: s.update(system_prompt_tokens=-1), "system_prompt_tokens"),
        (lambda s: s.update(system_prompt_tokens=1.5), "system_prompt_tokens"),
        (lambda s: s.update(arrival_s=-3), "arrival_s"),
        (lambda s: s.update(turns=[]), "turns"),
        (lambda s: s["turns"][0].update(tool=None), "turns[0].tool is null"),
        (lambda s: s["turns"][1].update(tool={"name": "x", "command": "", "duration_s": 1}), "last turn"),
        (lambda s: s["turns"][0].update(output_tokens=0), "turns[0].output_tokens"),
        (lambda s: s["turns"][0]["tool"].update(duration_s=-1), "turns[0].tool.duration_s"),
        (lambda s: s["turns"][0]["tool"].update(progress=[{"after_s": 5.0, "fraction": 0.5}]), "after the tool ends"),
        (lambda s: s["turns"][0]["tool"].update(progress=[{"after_s": 1.0}]), "fraction or eta_s"),
        (lambda s: s["turns"][0]["tool"].update(deadline_s=0), "deadline_s"),
        (lambda s: s.update(extra_field=1), "extra_field"),
    ],
)
def test_invalid_sessions_name_the_line_and_field(mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    bad = _session()
    mutate(bad)
    with pytest.raises(TraceError) as err:
        parse_lines(_lines(_session(session_id="ok"), bad), source="x.jsonl")
    msg = str(err.value)
    assert msg.startswith("x.jsonl:2:"), msg
    assert needle in msg, msg


def test_duplicate_ids_bad_json_and_empty_trace() -> None:
    with pytest.raises(TraceError, match=r"t:2: duplicate session_id 's1' \(first on line 1\)"):
        parse_lines(_lines(_session(), _session()), source="t")
    with pytest.raises(TraceError, match=r"t:1: not valid JSON"):
        parse_lines(["{nope"], source="t")
    with pytest.raises(TraceError, match=r"t:1: expected a JSON object"):
        parse_lines(["[1, 2]"], source="t")
    with pytest.raises(TraceError, match="no sessions"):
        parse_lines(["", "  "], source="t")


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "absent.jsonl")


def test_json_schema_describes_required_fields() -> None:
    schema = json_schema()
    assert set(schema["required"]) >= {"session_id", "tenant", "arrival_s", "system_prompt_tokens", "turns"}
