"""Sleep / timeout parsing and command fingerprints (services.predictor.core.command)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.predictor.core import parse_command, parse_duration_s


@pytest.mark.parametrize(
    ("command", "sleep_s", "timeout_s"),
    [
        ("sleep 3", 3.0, None),
        ("sleep 2.5s", 2.5, None),
        ("sleep .5", 0.5, None),
        ("sleep 1m", 60.0, None),
        ("sleep 1h", 3600.0, None),
        ("sleep 1d", 86400.0, None),
        ("sleep 1m 30s", 90.0, None),  # GNU sleep sums its operands
        ("cd x && sleep 4 && make", 4.0, None),
        ("sleep 2; sleep 3", 5.0, None),
        ("sleep 1\nsleep 2", 3.0, None),
        ("sleep 2 | cat", 2.0, None),  # a pipeline lasts as long as its longest member
        ("sleep 5 2>&1 > /dev/null && echo ok", 5.0, None),  # redirections are not operands
        ("env A=1 nice -n 5 sleep 0.5", 0.5, None),
        ("time nohup sleep 7", 7.0, None),
        ('bash -c "sleep 3 && echo hi"', 3.0, None),
        ("(sleep 2; echo done)", 2.0, None),
        ("timeout 30 make test", None, 30.0),
        ("timeout 5 sleep 60", 5.0, 5.0),
        ("timeout 4 sleep infinity", 4.0, 4.0),
        ("timeout -s KILL 2m python -m pytest tests/a.py", None, 120.0),
        ("timeout --kill-after=5 10s make", None, 10.0),
        ("cd /repo && timeout 9 make", None, 9.0),  # cd is instant: the timeout bounds the command
        ("make && timeout 9 make test", None, None),  # something else takes time too
        ("sleep 10 &", None, None),  # backgrounded: does not delay the return
        ("ls || sleep 3", None, None),  # may not run
        ("while ! curl -s localhost:8000; do sleep 1; done", None, None),  # iterations unknown
        ("for i in 1 2 3; do sleep 1; done", None, None),
        ("sleep infinity", None, None),
        ("grep -rn foo .", None, None),
        ('echo "unbalanced', None, None),  # never raises
        ("", None, None),
    ],
)
def test_sleep_and_timeout_table(command: str, sleep_s: float | None, timeout_s: float | None) -> None:
    p = parse_command(command)
    assert p.sleep_s == pytest.approx(sleep_s) if sleep_s is not None else p.sleep_s is None
    assert p.timeout_s == pytest.approx(timeout_s) if timeout_s is not None else p.timeout_s is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3", 3.0), ("2.5s", 2.5), ("1m", 60.0), (".5h", 1800.0), ("2d", 172800.0), ("x", None), ("-1", None),
     ("1ms", None), ("", None)],
)  # fmt: skip
def test_duration_operands(text: str, seconds: float | None) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ("python -m pytest tests/x.py -q", "pytest"),
        ("python3 reproduce.py", "reproduce.py"),
        ("cd /repo && make -j4", "make"),
        ("/usr/bin/grep -rn foo", "grep"),
        ("uv run pytest -x", "uv pytest"),
        ("sleep 5 && curl -s localhost:8000", "curl"),
        ("sleep 5", "sleep"),
        ("timeout 10 cargo build", "cargo build"),
    ],
)
def test_program_family(command: str, program: str) -> None:
    assert parse_command(command).program == program


def test_fingerprints_normalise_whitespace_cd_and_numbers() -> None:
    a = parse_command("cd /repo &&   python -m pytest   tests/test_x.py -q")
    b = parse_command("python -m pytest tests/test_x.py -q")
    assert a.exact == b.exact
    s5 = parse_command("sleep 5 && curl -s localhost:8000/health")
    s10 = parse_command("sleep 10 && curl -s localhost:8001/health")
    assert s5.exact != s10.exact and s5.shape == s10.shape
    # digits inside identifiers are part of the name, not numbers
    assert parse_command("pytest tests/test_1.py").shape == "pytest tests/test_1.py"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_parse_never_raises_and_sleep_is_non_negative(text: str) -> None:
    p = parse_command(text)
    assert p.sleep_s is None or p.sleep_s >= 0
    assert p.timeout_s is None or p.timeout_s > 0
    assert len(p.exact) <= 512


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./=:,", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(_WORD, min_size=1, max_size=8))
def test_fast_path_agrees_with_the_full_parser(words: list[str]) -> None:
    from services.predictor.core.command import _analyse, _simple

    command = " ".join(words)
    fast = _simple(command)
    if fast is None:
        return
    full = _analyse(command, 0)
    assert (fast.sleep_s, fast.timeout_s, fast.program, fast.exact) == (
        full.sleep_s, full.timeout_s, full.program[:64], full.text[:512]
    )  # fmt: skip
