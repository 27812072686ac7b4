"""Synthetic tool logs, `tao predictor replay`, and the record/proto conversions."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from services.cli import main as tao_main
from services.common.records import PredictionRecord
from services.predictor.convert import (
    event_from_log,
    event_from_proto,
    event_to_log,
    event_to_proto,
    record_dict,
    record_json,
)
from services.predictor.core import EventType, Predictor, ToolEvent
from services.predictor.replay import accuracy, replay, summary
from services.predictor.synthetic import CLASSES, generate, write_jsonl


@pytest.fixture(scope="module")
def log():  # type: ignore[no-untyped-def]
    return generate(60, seed=3)


def test_generator_is_deterministic_and_well_formed(log) -> None:  # type: ignore[no-untyped-def]
    again = generate(60, seed=3)
    assert again.events == log.events
    assert generate(60, seed=4).events != log.events
    assert [e.t for e in log.events] == sorted(e.t for e in log.events)
    by_call: dict[str, list[ToolEvent]] = defaultdict(list)
    for e in log.events:
        by_call[e.call_id].append(e)
    for call in log.calls:
        evs = sorted(by_call[call.call_id], key=lambda e: e.seq)
        assert [e.seq for e in evs] == list(range(len(evs)))
        assert evs[0].type is EventType.STARTED and evs[-1].type is EventType.FINISHED
        assert all(e.type is EventType.PROGRESS for e in evs[1:-1])
        times = [e.t for e in evs]
        assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= 10.0 + 1e-3  # heartbeats
        assert evs[-1].t - evs[0].t == pytest.approx(call.duration_s, abs=2e-3)
    assert {c.tool_class for c in log.calls} == set(CLASSES)


def test_progress_reports_are_causal(log) -> None:  # type: ignore[no-untyped-def]
    """Fractions never decrease and ETAs are not the truth (they come from a smoothed rate)."""
    exact = total = 0
    for call in log.calls:
        fr = [r.fraction for r in call.progress if r.fraction is not None]
        assert fr == sorted(fr) and all(0 < f < 1 or f == 1.0 for f in fr)
        for r in call.progress:
            if r.eta_s is not None:
                total += 1
                exact += abs(r.at_s + r.eta_s - call.duration_s) < 1e-3
    assert total > 0 and exact / total < 0.05


def test_replay_json_fields_and_recomputable_figures(log, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "events.jsonl"
    write_jsonl(log.events, str(path))
    assert tao_main(["predictor", "replay", "--events", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("events", "tools", "mae_s", "within_0_5s", "mae_at_start_s", "within_0_5s_at_start",
                "ready_precision", "ready_recall", "per_tool", "calls"):  # fmt: skip
        assert key in out
    assert out["events"] == len(log.events) and out["tools"] == len(log.calls) == len(out["calls"])
    calls = out["calls"]
    mae = sum(abs(c["predicted_final_s"] - c["actual_s"]) for c in calls) / len(calls)
    within = sum(abs(c["predicted_final_s"] - c["actual_s"]) <= 0.5 for c in calls) / len(calls)
    assert out["mae_s"] == pytest.approx(mae, abs=1e-5) and out["within_0_5s"] == pytest.approx(within)
    assert set(out["per_tool"]) == {c["tool"] for c in calls}
    assert 0.0 < out["ready_precision"] <= 1.0 and 0.0 < out["ready_recall"] <= 1.0
    assert tao_main(["predictor", "replay", "--events", str(path)]) == 0
    assert "final prediction by evidence" in capsys.readouterr().out


def test_final_prediction_is_the_last_one_before_finish() -> None:
    events = [
        ToolEvent(0.0, "s", "c", EventType.STARTED, "dl", "download"),
        ToolEvent(2.0, "s", "c", EventType.PROGRESS, "dl", eta_s=6.0),
        ToolEvent(5.0, "s", "c", EventType.PROGRESS, "dl", eta_s=2.5),
        ToolEvent(7.4, "s", "c", EventType.FINISHED, "dl"),
    ]
    (c,) = replay(events).calls
    assert c.predicted_at_start_s == 5.0 and c.predicted_final_s == pytest.approx(7.5) and c.actual_s == 7.4


def test_replay_meets_the_seed_targets_on_a_small_mix() -> None:
    """Accuracy guard on a small log (the full figures are in bench/predictor)."""
    small = generate(80, seed=11)
    res = replay(small.events)
    a = accuracy(res.calls)
    assert a["mae_s"] is not None and a["mae_s"] <= 0.41
    assert a["within_0_5s"] is not None and a["within_0_5s"] >= 0.829
    s = summary(res, include_calls=False)
    assert s["by_evidence_final"]  # evidence breakdown is reported


@pytest.mark.parametrize("content", ["not json\n", '{"t": 1, "type": "begun"}\n', '{"t": "x", "type": "started"}\n'])
def test_replay_bad_input_exits_2(tmp_path: Path, content: str, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert tao_main(["predictor", "replay", "--events", str(path)]) == 2
    assert "line 1" in capsys.readouterr().err
    assert tao_main(["predictor", "replay", "--events", str(tmp_path / "missing.jsonl")]) == 2


def test_invalid_events_in_a_log_are_counted_not_applied() -> None:
    events = [
        ToolEvent(0.0, "", "c", EventType.STARTED, "bash", "ls"),  # no session id
        ToolEvent(0.0, "s", "c", EventType.STARTED, "bash", "ls"),
        ToolEvent(1.0, "s", "c", EventType.PROGRESS, "bash", fraction=3.0),
        ToolEvent(2.0, "s", "c", EventType.FINISHED, "bash"),
    ]
    res = replay(events)
    assert res.invalid_events == 2 and len(res.calls) == 1


def test_event_conversions_round_trip() -> None:
    e = ToolEvent(1.7e9, "s", "c", EventType.PROGRESS, "bash", "make", deadline_s=30.0, eta_s=2.0, fraction=0.5, seq=3)
    assert event_from_proto(event_to_proto(e)) == e
    assert event_from_log(event_to_log(event_to_proto(e))) == e
    bare = ToolEvent(1.0, "s", "c", EventType.PROGRESS, seq=1)
    assert event_from_proto(event_to_proto(bare)) == bare


def test_record_dicts_are_valid_prediction_records() -> None:
    p = Predictor()
    sid = 's"\\é\n'  # escaping matters: record_json is written by hand
    p.observe(ToolEvent(100.0, sid, "c", EventType.STARTED, "bash", "sleep 3", deadline_s=10.0))
    for t in (100.0, 102.5, 200.0):
        sp = p.predict(sid, t)
        rec = PredictionRecord.model_validate(record_dict(sp, "e1", 7))
        assert rec.session_id == sid and rec.epoch == "e1" and rec.rev == 7
        assert math.isclose(rec.predicted_return_unix_s, 103.05)
        assert json.loads(record_json(sp, "e1", 7)) == record_dict(sp, "e1", 7)
        assert PredictionRecord.model_validate_json(record_json(sp, "e1", 7)) == rec
    p = Predictor()
    p.observe(ToolEvent(100.0, "s", "c", EventType.STARTED, "bash", "sleep 3", deadline_s=10.0))
    p.observe(ToolEvent(103.1, "s", "c", EventType.FINISHED, "bash"))
    rec = PredictionRecord.model_validate(record_dict(p.predict("s", 103.2), "e1", 8))
    assert rec.completed and rec.ready and rec.evidence == "completed"
