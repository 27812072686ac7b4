"""`tao planner solve`: plan JSON on stdout; bad input -> one line on stderr, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli import main

SNAPSHOT = {
    "now_s": 50.0,
    "replicas": [{"id": "r0", "capacity_tokens": 100, "used_tokens": 20, "healthy": True},
                 {"id": "r1", "capacity_tokens": 100, "used_tokens": 0, "healthy": False}],
    "sessions": [{"id": "a", "tenant": "t", "footprint_tokens": 50, "ready": True,
                  "credits": [{"replica": "r0", "tokens": 40, "observed_at_s": 40.0}]},
                 {"id": "b", "tenant": "t", "footprint_tokens": 60, "ready": False, "credits": []}],
}


def _write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "snap.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_solve_prints_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["planner", "solve", "--snapshot", _write(tmp_path, SNAPSHOT), "--explain", "b"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["assignments"] == [{"session": "a", "replica": "r0"}]
    assert out["objective"] == [20, 1, 50]  # credit 40 · 2^(−10 s / 10 s) = 20
    assert out["solver"] == "exact-dp" and out["policy"] == "tao" and out["solve_ms"] > 0
    assert out["explanations"][0]["reason"].startswith("not admitted") and not out["explanations"][0]["admitted"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{nope", "is not valid JSON"),
        ({"now_s": 1, "replicas": [], "sessions": [{"id": "x"}]}, "sessions[0]: missing required field 'tenant'"),
        ({**SNAPSHOT, "replicas": [{"id": "r0", "capacity_tokens": -1, "used_tokens": 0}]},
         "replicas[0].capacity_tokens: expected a non-negative integer"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: object,
                                          needle: str) -> None:
    assert main(["planner", "solve", "--snapshot", _write(tmp_path, content)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and needle in err.err and err.err.count("\n") == 1


def test_unknown_policy_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["planner", "solve", "--snapshot", _write(tmp_path, SNAPSHOT), "--policy", "nope"]) == 2
    assert "registered: cache_aware" in capsys.readouterr().err
    assert main(["planner", "solve", "--snapshot", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["round_robin", "thunderagent", "tao-bfd"])
def test_every_policy_solves_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str) -> None:
    assert main(["planner", "solve", "--snapshot", _write(tmp_path, SNAPSHOT), "--policy", policy, "--compact"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["policy"] == policy
