"""What a shell command tells us about its duration, without running it.

``parse_command`` extracts:

* ``sleep_s`` — seconds the command is certain to spend in ``sleep`` on its blocking path:
  ``sleep 3``, ``sleep 2.5s``, ``sleep 1m``, ``sleep 1m 30s`` (GNU sleep sums its operands;
  suffixes s/m/h/d), chains (``cd x && sleep 4 && make`` counts 4 s), pipelines (the longest
  member), ``bash -c "…"`` recursion, prefixes (``time``, ``nohup``, ``env X=1``, ``nice -n N``,
  ``sudo``, assignments). Sleeps that may not run or do not block are not counted: after
  ``||``, backgrounded with ``&``. A sleep inside a loop (``while …; do sleep 1; done``) or
  ``sleep infinity`` makes the sleep unknown (``None``): the count of iterations is unknown.
* ``timeout_s`` — an upper bound from ``timeout [opts] N cmd`` when that command is the only
  one that takes time (other segments are instant builtins such as ``cd``/``export``).
  A timed sleep counts as ``min(sleep, N)``.
* ``program`` — a family name for history (``pytest`` for ``python -m pytest``, ``make``,
  ``grep``; basename of a path).
* ``exact`` and ``shape`` — normalised command text (tokens joined by one space, leading
  ``cd DIR &&`` dropped); ``shape`` additionally masks numbers so ``sleep 5 && curl :8000``
  and ``sleep 10 && curl :8001`` share a key. These feed the history fingerprints.

Pure: no I/O, no clock. Unparseable input (unbalanced quotes) never raises; it yields a
result with ``sleep_s=None`` and the raw text as fingerprint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUFFIX_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd]?)$")
_NUMBER_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:ms|[smhd])?(?![\w.])")
_CONTROL = {"&&", "||", ";", "&", ";;"}
_LOOP_WORDS = {"for", "while", "until", "select"}
_INSTANT = {"cd", "export", "source", ".", "set", "unset", "echo", "true", ":", "pushd", "popd",
            "alias", "printf", "shopt", "umask", "ulimit", "local", "declare", "{", "}", "then",
            "fi", "if", "else", "elif"}
_PREFIXES = {"time", "nohup", "exec", "command", "builtin", "sudo", "stdbuf", "!", "while", "until", "do"}
_RUNNERS = {"uv", "poetry", "pipenv", "conda", "npx", "pnpm", "yarn", "bundle", "cargo", "go", "npm"}
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
_SHELLS = {"bash", "sh", "zsh", "dash"}


@dataclass(frozen=True, slots=True)
class ParsedCommand:
    """Duration facts and fingerprints of one command (see module docstring)."""

    sleep_s: float | None
    timeout_s: float | None
    program: str
    exact: str
    shape: str


def parse_duration_s(text: str) -> float | None:
    """GNU ``sleep``/``timeout`` operand: ``3``, ``2.5s``, ``1m``, ``.5h``; None when not one."""
    m = _DURATION_RE.match(text)
    if m is None:
        return None
    return float(m.group(1)) * _SUFFIX_S[m.group(2)]


_TOKEN_RE = re.compile(
    r"""[ \t\r\f\v]*(?:(&&|\|\||;;|\|&|\d*(?:>>|>&|<&|&>|[<>])(?:&?\d+|-)?|[;&|()\n])"""
    r"""|((?:[^\s;&|()<>'"\\]|\\.|'[^']*'|"(?:[^"\\]|\\.)*")+))"""
)
_UNQUOTE_RE = re.compile(r"""'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)""")


def _unquote(word: str) -> str:
    if "'" not in word and '"' not in word and "\\" not in word:
        return word
    return _UNQUOTE_RE.sub(lambda m: m.group(1) if m.group(1) is not None else (m.group(2) or m.group(3) or ""), word)


def _tokens(command: str) -> list[str] | None:
    """Shell-ish tokens (operators split out, quotes removed); None when quotes do not balance."""
    out: list[str] = []
    pos, end = 0, len(command)
    match = _TOKEN_RE.match
    while pos < end:
        m = match(command, pos)
        if m is None or m.end() == pos:
            if command[pos:].strip() == "":
                break
            return None
        op, word = m.group(1), m.group(2)
        if op is not None:
            out.append(";" if op == "\n" else op)
        elif word is not None:
            out.append(_unquote(word))
        else:
            break
        pos = m.end()
    return out


_REDIRECT_RE = re.compile(r"^\d*(?:>>|>&|<&|&>|[<>])(&?\d+|-)?$")


def _drop_redirects(words: list[str]) -> list[str]:
    """Remove ``> file``, ``2>&1``, ``<in`` and the like (they do not change the duration)."""
    out: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        m = _REDIRECT_RE.match(w)
        if m is not None:
            skip = m.group(1) is None  # target is the next word
            continue
        out.append(w)
    return out


def _strip_prefixes(words: list[str]) -> list[str]:
    i = 0
    while i < len(words):
        w = words[i]
        if "=" in w and not w.startswith("=") and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w):
            i += 1
        elif w in _PREFIXES:
            i += 1
        elif w == "env":
            i += 1
            while i < len(words) and (words[i].startswith("-") or "=" in words[i]):
                i += 1
        elif w == "nice":
            i += 1
            if i < len(words) and words[i] == "-n":
                i += 2
            elif i < len(words) and words[i].startswith("-"):
                i += 1
        else:
            break
    return words[i:]


@dataclass(slots=True)
class _SegmentInfo:
    sleep_s: float | None  # seconds certainly slept; None = unknown (infinite / bad)
    timeout_s: float | None
    instant: bool
    program: str


def _program_of(words: list[str]) -> str:
    if not words:
        return ""
    head = words[0].rsplit("/", 1)[-1]
    if _PYTHON_RE.match(head):
        for j, w in enumerate(words[1:], start=1):
            if w == "-m":
                return words[j + 1] if j + 1 < len(words) else "python"
            if w == "-c":
                return "python-c"
            if not w.startswith("-"):
                return w.rsplit("/", 1)[-1]
        return "python"
    if head in _RUNNERS and len(words) > 1:
        rest = [w for w in words[1:] if not w.startswith("-")]
        if rest and rest[0] in ("run", "exec", "x") and len(rest) > 1:
            return f"{head} {rest[1].rsplit('/', 1)[-1]}"
        return f"{head} {rest[0]}" if rest else head
    return head


def _segment(words: list[str], depth: int) -> _SegmentInfo:
    """Facts about one simple command (``words`` has no control operators)."""
    words = _strip_prefixes(_drop_redirects([w for w in words if w not in ("(", ")")]))
    if not words:
        return _SegmentInfo(0.0, None, True, "")
    head = words[0].rsplit("/", 1)[-1]
    if head == "sleep":
        total = 0.0
        for arg in words[1:]:
            d = parse_duration_s(arg)
            if d is None:
                if arg.startswith("-"):  # --help etc.: sleep returns at once
                    return _SegmentInfo(0.0, None, False, "sleep")
                return _SegmentInfo(None, None, False, "sleep")  # infinity / unknown
            total += d
        return _SegmentInfo(total, None, False, "sleep")
    if head == "timeout":
        i = 1
        while i < len(words) and words[i].startswith("-"):
            if words[i] in ("-s", "-k", "--signal", "--kill-after"):
                i += 2
            else:
                i += 1
        if i >= len(words):
            return _SegmentInfo(0.0, None, False, "timeout")
        limit = parse_duration_s(words[i])
        inner = _segment(words[i + 1 :], depth)
        if limit is None or limit == 0.0:  # 0 disables the timeout in GNU coreutils
            return inner
        sleep = inner.sleep_s
        capped = limit if sleep is None else min(sleep, limit)
        t = limit if inner.timeout_s is None else min(limit, inner.timeout_s)
        return _SegmentInfo(capped, t, False, inner.program)
    if head in _SHELLS and depth < 3 and "-c" in words[1:]:
        j = words.index("-c", 1)
        if j + 1 < len(words):
            sub = _analyse(words[j + 1], depth + 1)
            return _SegmentInfo(sub.sleep_s, sub.timeout_s, False, sub.program or head)
    if head in _INSTANT:
        return _SegmentInfo(0.0, None, True, "")
    return _SegmentInfo(0.0, None, False, _program_of(words))


def _split(tokens: list[str]) -> list[tuple[str, list[list[str]], str]]:
    """Chain into (operator before, pipeline members, operator after)."""
    out: list[tuple[str, list[list[str]], str]] = []
    before = ";"
    members: list[list[str]] = [[]]
    for tok in tokens:
        if tok in _CONTROL:
            out.append((before, members, tok))
            before, members = tok, [[]]
        elif tok == "|" or tok == "|&":
            members.append([])
        else:
            members[-1].append(tok)
    out.append((before, members, ";"))
    return [seg for seg in out if any(m for m in seg[1])]


@dataclass(slots=True)
class _Analysis:
    sleep_s: float | None
    timeout_s: float | None
    program: str
    text: str


def _analyse(command: str, depth: int) -> _Analysis:
    tokens = _tokens(command)
    if tokens is None:
        return _Analysis(None, None, "", " ".join(command.split()))
    segments = _split(tokens)
    # a loop keyword counts only where a command starts (`echo done` is not a loop)
    loop = any(next((w for w in m if w != "("), "") in _LOOP_WORDS for _, ms, _ in segments for m in ms)
    # Drop leading `cd DIR` segments from the fingerprint text: where the agent stands
    # rarely changes what the command costs, and harnesses prepend it inconsistently.
    start = 0
    while start < len(segments) - 1 and segments[start][1][0][:1] == ["cd"]:
        start += 1
    text_parts: list[str] = []
    for k, (_, members, after) in enumerate(segments[start:]):
        text_parts.append(" | ".join(" ".join(m) for m in members))
        if k < len(segments) - start - 1:
            text_parts.append(after)
    text = " ".join(text_parts)

    sleep_total: float | None = 0.0
    timeouts: list[float] = []
    blocking = 0
    program = ""
    saw_sleep = False
    saw_sleep_program = False
    for before, members, after in segments:
        infos = [_segment(m, depth) for m in members if m]
        saw_sleep_program = saw_sleep_program or any(i.program == "sleep" for i in infos)
        if not program:
            program = next((i.program for i in infos if i.program and i.program != "sleep"), "")
        if all(i.instant for i in infos):
            continue
        blocking += 1
        if after == "&":
            continue  # backgrounded: does not delay the command's return
        if any(i.timeout_s is not None for i in infos):
            timeouts.append(min(i.timeout_s for i in infos if i.timeout_s is not None))
        if before == "||":
            continue  # may not run
        seg_sleeps = [i.sleep_s for i in infos]
        if any(s is None for s in seg_sleeps):
            sleep_total = None
        elif sleep_total is not None:
            longest = max(s for s in seg_sleeps if s is not None)
            if longest > 0 or any(i.program == "sleep" for i in infos):
                saw_sleep = True
            sleep_total += longest
    if not program and saw_sleep_program:
        program = "sleep"
    sleep: float | None = sleep_total if (saw_sleep and not loop) else None
    if sleep_total is None and not loop:
        sleep = None
    timeout = timeouts[0] if (len(timeouts) == 1 and blocking == 1) else None
    return _Analysis(sleep, timeout, program, text)


def mask_numbers(text: str) -> str:
    """Replace standalone numbers (with optional unit suffix) by ``#``."""
    return _NUMBER_RE.sub("#", text)


_SHELL_CHARS = re.compile(r"[;&|()<>'\"\\\n`$]|\bsleep\b|\btimeout\b|\b(?:ba|z|da)?sh\b")


def _simple(command: str) -> ParsedCommand | None:
    """Fast path: one plain command with no shell syntax and nothing about sleeps."""
    if _SHELL_CHARS.search(command):
        return None
    words = command.split()
    core = _strip_prefixes(words)
    if not core or core[0].rsplit("/", 1)[-1] in _INSTANT or core[0] in _LOOP_WORDS:
        return None
    exact = " ".join(words)[:512]
    return ParsedCommand(None, None, _program_of(core)[:64], exact, mask_numbers(exact))


def parse_command(command: str) -> ParsedCommand:
    """Duration facts and fingerprints of ``command`` (never raises)."""
    fast = _simple(command)
    if fast is not None:
        return fast
    a = _analyse(command, 0)
    exact = a.text[:512]
    return ParsedCommand(
        sleep_s=a.sleep_s,
        timeout_s=a.timeout_s,
        program=a.program[:64],
        exact=exact,
        shape=mask_numbers(exact),
    )
