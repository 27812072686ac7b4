"""Test-runner history keys: target / place / scope parsing (services.predictor.core.command)
and their back-off in the evidence hierarchy (services.predictor.core.estimate)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.predictor.core import EventType, Evidence, Predictor, ToolEvent, parse_command

S, F = EventType.STARTED, EventType.FINISHED


@pytest.mark.parametrize(
    ("command", "target", "scope"),
    [
        ("pytest -x tests/", "pytest tests", "pytest dir n1"),
        ("pytest tests/unit/test_a.py::test_x", "pytest tests/unit/test_a.py::test_x", "pytest node n1"),
        ("python -m pytest -k foo", "pytest -k=foo", "pytest all n0 -k"),
        ("pytest -kfoo -n4 tests", "pytest tests -k=foo -n=4", "pytest dir n1 -k -n"),
        ("python -m pytest tests/b.py tests/a.py -q -p no:cacheprovider --tb short", "pytest tests/a.py tests/b.py",
         "pytest file n2"),
        ("python -m pytest --lf tests/a.py", "pytest tests/a.py --lf", "pytest file n1 --lf"),
        ("uv run pytest tests/a.py", "pytest tests/a.py", "pytest file n1"),
        ("conda run -n env pytest tests/a.py", "pytest tests/a.py", "pytest file n1"),
        ("go test ./pkg/... -run TestFoo -count=1 -timeout 30s", "go test pkg/... -run=TestFoo -count=1",
         "go test dir n1 -count -run"),
        ("cargo test parser::tests -- --nocapture", "cargo test parser::tests", "cargo test node n1"),
        ("npm test -- src/a.test.ts", "npm test src/a.test.ts", "npm test file n1"),
        ("npm run test", "npm test", "npm test all n0"),
        ("npx jest src/a.test.ts -t adds --reporter dot", "jest src/a.test.ts -t=adds", "jest file n1 -t"),
        ("tox -e py311 -- tests/a.py", "tox tests/a.py -e=py311", "tox file n1 -e"),
        ("python tests/runtests.py admin_views.tests --verbosity 2 --parallel 1", "runtests.py admin_views.tests",
         "runtests.py name2 n1"),
        ("python -m unittest tests.test_x.TestY.test_z", "unittest tests.test_x.TestY.test_z", "unittest name4 n1"),
        ("python manage.py test polls", "manage.py test polls", "manage.py test name1 n1"),
    ],
)  # fmt: skip
def test_target_and_scope(command: str, target: str, scope: str) -> None:
    p = parse_command(command)
    assert (p.target, p.scope) == (target, scope)


@pytest.mark.parametrize(
    "command",
    ["ls -la", "python reproduce.py", "make test", "sleep 5", "grep -rn pytest .", "python -c 'import pytest'", ""],
)
def test_not_a_test_run_has_no_target(command: str) -> None:
    p = parse_command(command)
    assert (p.target, p.scope, p.place) == ("", "", "")


def test_flags_pipes_and_wrappers_do_not_change_the_target() -> None:
    spellings = [
        "python -m pytest tests/test_io.py -x -q",
        "cd /testbed && python -m pytest tests/test_io.py -v 2>&1 | tail -n 30",
        "timeout 120 pytest ./tests/test_io.py -xvs --tb=short",
        "bash -c 'pytest tests/test_io.py -rA'",
    ]
    parsed = [parse_command(c) for c in spellings]
    assert {p.target for p in parsed} == {"pytest tests/test_io.py"}
    assert {p.place for p in parsed} == {"tests"}
    assert len({p.exact for p in parsed}) == len(spellings)  # the command level still tells them apart


def test_what_runs_does_change_the_target() -> None:
    keys = {parse_command(c).target for c in [
        "pytest tests/test_io.py", "pytest tests/test_io.py::test_read", "pytest tests/test_io.py -k read",
        "pytest tests/test_io.py -m slow", "pytest tests", "pytest", "pytest tests/test_io.py --lf",
    ]}  # fmt: skip
    assert len(keys) == 7
    # a single test, a file and the suite are different scopes; two single tests are one
    scopes = {parse_command(c).scope for c in ["pytest a/t.py::x", "pytest b/u.py::y"]}
    assert scopes == {"pytest node n1"}
    assert parse_command("pytest a/t.py::x").place == "a" and parse_command("pytest b/u.py::y").place == "b"


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./=:,", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["pytest", "python -m pytest", "go test", "cargo test", "npx jest", "tox"]),
       st.lists(_WORD, max_size=8))  # fmt: skip
def test_fast_path_and_full_parser_agree_on_targets(runner: str, words: list[str]) -> None:
    from services.predictor.core.command import _analyse, _simple

    command = " ".join([runner, *words])
    fast = _simple(command)
    full = _analyse(command, 0)
    if fast is not None:
        assert (fast.target, fast.scope, fast.place) == full.target
    assert parse_command(command + " 2>&1 | tail -5").target == full.target[0]


def _run(p: Predictor, t0: float, duration: float, cmd: str, cid: str, sid: str = "s") -> None:
    p.observe(ToolEvent(t0, sid, cid, S, "bash", cmd))
    p.observe(ToolEvent(t0 + duration, sid, cid, F, "bash"))


def test_target_level_beats_the_program_mix() -> None:
    p = Predictor()
    for i in range(4):  # the program's history: quick single-test runs elsewhere
        _run(p, 10.0 * i, 0.8, f"python -m pytest other/test_m.py::test_{i} -q", f"a{i}", sid="o")
    _run(p, 100, 30.0, "python -m pytest tests/ -x -q", "b0", sid="o")  # the suite, once
    pred = p.observe(ToolEvent(200, "s", "c", S, "bash", "pytest tests -v 2>&1 | tail -40"))
    assert pred.evidence is Evidence.TARGET_HISTORY and pred.expected_s == pytest.approx(30.0)


def test_new_target_backs_off_to_place_then_scope_then_program() -> None:
    p = Predictor()
    t = 0.0
    for i in range(2):  # single tests in tests/unit: ~1 s
        _run(p, t, 1.0, f"pytest tests/unit/test_a.py::test_{i}", f"u{i}", sid=f"x{i}")
        t += 10
    for i in range(3):  # whole files elsewhere: 20 s
        _run(p, t, 20.0, f"pytest lib/tests/test_{i}.py", f"f{i}", sid=f"y{i}")
        t += 30
    # a new single test in tests/unit: two samples of that scope there (min_samples_place = 2)
    pred = p.observe(ToolEvent(t, "z", "n1", S, "bash", "pytest tests/unit/test_b.py::test_9 -q"))
    assert pred.evidence is Evidence.PLACE_HISTORY and pred.expected_s == pytest.approx(1.0)
    # a new file in a new directory: three whole-file runs anywhere (min_samples_scope = 3)
    pred = p.observe(ToolEvent(t, "z2", "n2", S, "bash", "pytest other/test_z.py"))
    assert pred.evidence is Evidence.SCOPE_HISTORY and pred.expected_s == pytest.approx(20.0)
    # a -k selection was never seen: no scope history, the program's (5 runs) it is
    pred = p.observe(ToolEvent(t, "z3", "n3", S, "bash", "pytest -k slow"))
    assert pred.evidence is Evidence.PROGRAM_HISTORY


def test_cold_start_is_unchanged() -> None:
    """With no history of the target, its place or its scope, the estimate is the program's
    (or weaker), exactly as before the test levels existed."""
    p = Predictor()
    for i in range(3):
        _run(p, 10.0 * i, 2.0, f"pytest tests/test_{i}.py::t", f"a{i}")
    pred = p.observe(ToolEvent(100, "s", "c", S, "bash", "pytest tests"))
    assert pred.evidence is Evidence.PROGRAM_HISTORY and pred.expected_s == pytest.approx(2.0)
    q = Predictor()
    assert q.observe(ToolEvent(0, "s", "c", S, "bash", "pytest tests")).evidence is Evidence.DEFAULT


def test_non_test_commands_do_not_use_the_test_levels() -> None:
    p = Predictor()
    for i in range(3):
        _run(p, 10.0 * i, 0.3, f"grep -rn foo{i} .", f"g{i}")
    assert p.observe(ToolEvent(50, "s", "c", S, "bash", "grep -rn bar .")).evidence is Evidence.PROGRAM_HISTORY
    assert not any(k.startswith(("tg:", "pl:", "sc:")) for k in p.history)
