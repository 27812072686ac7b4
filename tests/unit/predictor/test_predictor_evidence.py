"""Evidence hierarchy for the expected duration Ê (docs/algorithms.md#predictor-evidence-hierarchy), event handling, state."""

from __future__ import annotations

import json

import pytest

from services.predictor.core import (
    EventType,
    Evidence,
    InvalidEventError,
    Predictor,
    PredictorConfig,
    ToolEvent,
)

S, P, F = EventType.STARTED, EventType.PROGRESS, EventType.FINISHED


def ev(t: float, typ: EventType, cid: str = "c", sid: str = "s", tool: str = "bash", cmd: str = "",
       **kw: float) -> ToolEvent:  # fmt: skip
    return ToolEvent(t, sid, cid, typ, tool, cmd, **kw)  # type: ignore[arg-type]


def run_call(p: Predictor, t0: float, duration: float, cmd: str, cid: str, sid: str = "s", tool: str = "bash",
             deadline_s: float | None = None) -> None:  # fmt: skip
    p.observe(ToolEvent(t0, sid, cid, S, tool, cmd, deadline_s=deadline_s))
    p.observe(ToolEvent(t0 + duration, sid, cid, F, tool))


def test_default_when_nothing_is_known() -> None:
    pred = Predictor().observe(ev(0, S, cmd="frobnicate"))
    assert pred.evidence is Evidence.DEFAULT and pred.expected_s == 5.0 and pred.remaining_s == 5.0


def test_history_levels_from_most_specific() -> None:
    p = Predictor()
    for i in range(5):  # global history: other tools
        run_call(p, 10.0 * i, 1.0, f"other{i}", f"g{i}", tool="other")
    assert p.observe(ev(100, S, "x1", cmd="ls")).evidence is Evidence.GLOBAL_HISTORY
    for i in range(3):  # tool history: bash, program ls
        run_call(p, 200 + 10.0 * i, 0.2, f"ls dir{i}", f"t{i}")
    pred = p.observe(ev(300, S, "x2", cmd="ls otherdir"))
    assert pred.evidence is Evidence.PROGRAM_HISTORY and pred.expected_s == pytest.approx(0.2)
    run_call(p, 400, 7.0, "python -m pytest tests/a.py", "t9")
    pred = p.observe(ev(500, S, "x3", sid="s2", cmd="python -m pytest tests/a.py"))
    assert pred.evidence is Evidence.COMMAND_HISTORY and pred.expected_s == pytest.approx(7.0)
    run_call(p, 600, 9.0, "python -m pytest tests/a.py", "t10")  # 2nd sample in session s
    pred = p.observe(ev(700, S, "x4", cmd="python -m pytest tests/a.py"))
    assert pred.evidence is Evidence.SESSION_COMMAND_HISTORY


def test_shape_history_masks_numbers() -> None:
    p = Predictor()
    run_call(p, 0, 3.0, "python train.py --steps 100", "a")
    run_call(p, 10, 3.2, "python train.py --steps 200", "b")
    pred = p.observe(ev(20, S, "c", cmd="python train.py --steps 300"))
    assert pred.evidence is Evidence.SHAPE_HISTORY and pred.expected_s == pytest.approx(3.2)


def test_parsed_sleep_beats_history_and_learns_its_residual() -> None:
    p = Predictor()
    for i in range(3):
        run_call(p, 10.0 * i, 0.1, f"sleep {i + 1} && curl -s localhost:80", f"h{i}")
    pred = p.observe(ev(100, S, "x", cmd="sleep 30 && curl -s localhost:80"))
    assert pred.evidence is Evidence.SLEEP
    # residual of this shape: the previous runs took 0.1 s less than their sleep... clamped to 0
    assert pred.expected_s == pytest.approx(30.0)
    q = Predictor()
    run_call(q, 0, 5.3, "sleep 5; make", "a")
    assert q.observe(ev(10, S, "b", cmd="sleep 2; make")).expected_s == pytest.approx(2.3)
    assert Predictor().observe(ev(0, S, cmd="sleep 4")).expected_s == pytest.approx(4.05)


def test_direct_timing_beats_everything_and_is_capped_by_the_deadline() -> None:
    p = Predictor()
    p.observe(ev(0, S, cmd="sleep 100", deadline_s=60))
    pred = p.observe(ev(10, P, eta_s=5.0))
    assert pred.evidence is Evidence.ETA and pred.expected_s == pytest.approx(15.0)
    pred = p.observe(ev(20, P, eta_s=80.0))
    assert pred.evidence is Evidence.DEADLINE and pred.expected_s == 60.0


def test_fraction_extrapolation_single_and_rate() -> None:
    p = Predictor()
    p.observe(ev(0, S, cmd="make -j4"))
    assert p.observe(ev(4, P, fraction=0.25)).expected_s == pytest.approx(16.0)
    # two reports ≥ 5 points apart: rate between them, start-up excluded
    pred = p.observe(ev(8, P, fraction=0.75))
    assert pred.evidence is Evidence.FRACTION and pred.expected_s == pytest.approx(8 + 0.25 * 8.0)


def test_fraction_calibration_is_learned_per_command() -> None:
    p = Predictor()
    # a tool whose first "1 of 3 done" arrives after a long start-up: remaining is overstated 4x
    for i in range(2):
        p.observe(ev(100.0 * i, S, f"c{i}", cmd="pytest t.py -v"))
        p.observe(ev(100.0 * i + 2.0, P, f"c{i}", fraction=1 / 3))  # naive remaining 4 s
        p.observe(ev(100.0 * i + 3.0, F, f"c{i}"))  # actual remaining 1 s
    p.observe(ev(500, S, "n", cmd="pytest t.py -v"))
    pred = p.observe(ev(502, P, "n", fraction=1 / 3))
    assert pred.expected_s == pytest.approx(3.0)


def test_deadline_is_a_bound_until_the_tool_is_known_to_run_to_it() -> None:
    p = Predictor()
    for i in range(5):  # a harness timeout of 25 s on quick commands: a bound, not a return time
        run_call(p, 10.0 * i, 0.2, "git status", f"q{i}", deadline_s=25)
    pred = p.observe(ev(100, S, "x", cmd="git status", deadline_s=25))
    assert pred.evidence is not Evidence.DEADLINE and pred.expected_s == pytest.approx(0.2)
    # a terminal tool that waits its `duration` before returning: learned ratio ~1, and a
    # fixed 50 ms overshoot that does not scale with the deadline
    t = Predictor()
    for i in range(3):
        run_call(t, 100.0 * i, 0.15, "ls\n", f"k{i}", tool="send_keys", deadline_s=0.1)
    pred = t.observe(ev(500, S, "z", tool="send_keys", cmd="make\n", deadline_s=30))
    assert pred.evidence is Evidence.DEADLINE and pred.expected_s == pytest.approx(30.05)


def test_deadline_caps_longer_estimates_and_parsed_timeout_counts() -> None:
    p = Predictor()
    assert p.observe(ev(0, S, "a", cmd="sleep 60", deadline_s=25)).expected_s == 25.0
    pred = p.observe(ev(0, S, "b", cmd="timeout 3 sleep 10"))
    assert pred.evidence is Evidence.DEADLINE and pred.expected_s == 3.0 and pred.deadline_at_s == 3.0


def test_heartbeat_conditions_history_on_elapsed_time() -> None:
    p = Predictor()
    for i, d in enumerate([2.0, 2.1, 2.2, 30.0, 31.0]):
        run_call(p, 100.0 * i, d, "./run.sh", f"h{i}", sid=f"o{i}")
    start = p.observe(ev(1000, S, "x", cmd="./run.sh"))
    assert start.expected_s == pytest.approx(2.2)
    beat = p.observe(ev(1010, P, "x"))  # still running after 10 s: it is one of the long ones
    assert beat.expected_s in (30.0, 31.0) and beat.evidence is Evidence.COMMAND_HISTORY


def test_overdue_everywhere_falls_back_to_the_deadline() -> None:
    p = Predictor()
    for i in range(3):
        run_call(p, 100.0 * i, 1.0, "pytest x", f"h{i}", deadline_s=120)
    p.observe(ev(1000, S, "x", cmd="pytest x", deadline_s=120))
    assert p.observe(ev(1050, P, "x")).expected_s == 120.0


# ---------------------------------------------------------------- event handling
def test_duplicates_and_events_after_finish_change_nothing() -> None:
    p = Predictor()
    first = p.observe(ev(0, S, cmd="sleep 3"))
    again = p.observe(ev(0.5, S, cmd="sleep 9"))
    assert again.duplicate and again.expected_s == first.expected_s
    p.observe(ev(3.1, F))
    late = p.observe(ev(3.2, P, eta_s=50))
    assert late.duplicate and late.completed
    assert p.observe(ev(3.3, F)).duplicate


def test_out_of_order_progress_before_started() -> None:
    p = Predictor()
    p.observe(ev(5, P, eta_s=2.0))
    pred = p.observe(ev(1, S, cmd="make"))
    assert pred.started_at_s == 1 and pred.evidence is Evidence.ETA and pred.expected_s == pytest.approx(6.0)


def test_started_after_finished_still_teaches_the_duration() -> None:
    p = Predictor()
    p.observe(ev(10, F, "a"))
    done = p.observe(ev(7, S, "a", cmd="./build.sh"))
    assert done.completed and done.expected_s == pytest.approx(3.0)
    assert p.observe(ev(20, S, "b", cmd="./build.sh", sid="t")).expected_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([ev(5, S), ev(4, F)], "negative duration"),
        ([ev(5, S), ev(4, P)], "before the call started"),
        ([ev(5, F), ev(6, S)], "negative duration"),
        ([ev(-1, S)], "non-negative"),
        ([ev(0, S, tool="")], "without a tool"),
        ([ev(0, S, deadline_s=-3)], "deadline_s"),
        ([ev(0, S), ev(1, P, fraction=1.5)], "fraction"),
        ([ev(0, S, cmd="x" * 20_000)], "command longer"),
    ],
)
def test_invalid_events_are_rejected_and_change_nothing(events: list[ToolEvent], reason: str) -> None:
    p = Predictor()
    for e in events[:-1]:
        p.observe(e)
    before = json.dumps(p.to_state(), sort_keys=True)
    with pytest.raises(InvalidEventError, match=reason):
        p.observe(events[-1])
    assert json.dumps(p.to_state(), sort_keys=True) == before


def test_state_round_trip_gives_identical_predictions() -> None:
    p = Predictor()
    for i in range(6):
        run_call(p, 10.0 * i, 1.0 + 0.1 * i, f"pytest t{i % 2}.py", f"c{i}")
    p.observe(ev(100, S, "run", cmd="pytest t1.py", deadline_s=30))
    p.observe(ev(101, P, "run", fraction=0.2))
    state = json.loads(json.dumps(p.to_state()))
    q = Predictor.from_state(PredictorConfig(), state)
    for t in (101.0, 104.0, 130.0, 140.0):
        assert q.predict("s", t) == p.predict("s", t)
    assert q.observe(ev(102, S, "new", cmd="pytest t0.py")) == p.observe(ev(102, S, "new", cmd="pytest t0.py"))


def test_drain_dirty_lists_changed_sessions_and_history() -> None:
    p = Predictor()
    run_call(p, 0, 1.0, "ls", "a", sid="x")
    d = p.drain_dirty()
    assert set(d.sessions) == {"x"} and "g" in d.history and "t:bash" in d.history
    assert p.drain_dirty().sessions == {}
    p.end_session("x")
    assert p.drain_dirty().sessions == {"x": None}
