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
* ``target`` and ``scope`` — for test runners only (``""`` otherwise, see ``test_target``):
  ``target`` is the runner with what it runs — paths, node ids, packages, names, and the
  options that select tests (``-k``/``-m``, ``--lf``, ``-run``, ``-t``, ``-e``…) — with
  output and reporting options dropped, so ``pytest tests/a.py -x -q`` and
  ``python -m pytest tests/a.py -v 2>&1 | tail -30`` share a key; ``scope`` keeps only the
  kind of each target (``node``, ``file``, ``dir``, dotted ``name1``…``name4``, ``all``),
  their count (1, 2, 3+) and the selection options' names: a single test, a file and the
  whole suite take very different times, whatever the test. ``place`` is the directories
  the path targets are in (``tests/unit`` for ``tests/unit/test_a.py::test_x``; ``""`` when
  none): the same kind of target in the same test package shares start-up and fixtures.
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
    target: str = ""
    scope: str = ""
    place: str = ""


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
    target: tuple[str, str, str] = ("", "", "")  # (target, scope, place) of a test runner (test_target)


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


# ---- test runners: what a test command runs (its target) -------------------------------

@dataclass(frozen=True, slots=True)
class _RunnerSpec:
    """How one family of test runners spells what it runs. Options in ``keep_value`` /
    ``keep_flag`` select tests (kept in the key); options in ``skip_value`` take a value that
    is not a target (dropped with it); every other option is dropped (output, reporting)."""

    keep_value: frozenset[str] = frozenset()
    keep_flag: frozenset[str] = frozenset()
    skip_value: frozenset[str] = frozenset()
    #: one-letter options whose value may be glued on (``-kfoo``, ``-n4``)
    short_value: frozenset[str] = frozenset()
    #: positional arguments are paths (pytest, jest), not dotted labels or name filters
    paths: bool = False


_PYTEST = _RunnerSpec(
    keep_value=frozenset({"-k", "-m", "-n", "--numprocesses", "--deselect", "--ignore", "--ignore-glob",
                          "--count", "--maxfail", "--dist"}),
    keep_flag=frozenset({"--lf", "--last-failed", "--ff", "--failed-first", "--sw", "--stepwise", "--nf",
                         "--new-first", "--co", "--collect-only", "--runxfail", "--pdb"}),
    skip_value=frozenset({"-p", "-c", "-o", "-W", "-r", "--tb", "--durations", "--rootdir", "--basetemp",
                          "--junitxml", "--junit-xml", "--cov", "--cov-report", "--cov-config", "--log-level",
                          "--log-cli-level", "--log-file", "--timeout", "--confcutdir", "--color", "--capture",
                          "--import-mode", "--override-ini", "--verbosity", "--settings", "--parallel",
                          "--show-capture", "--durations-min", "--seed", "--random-order-seed"}),
    short_value=frozenset({"k", "m", "n", "p", "c", "o", "W", "r"}),
    paths=True,
)  # fmt: skip
_GO = _RunnerSpec(
    keep_value=frozenset({"-run", "-skip", "-bench", "-count", "-tags", "-p", "-parallel", "-short", "-race"}),
    keep_flag=frozenset({"-short", "-race", "-cover"}),
    skip_value=frozenset({"-timeout", "-coverprofile", "-o", "-exec", "-json", "-covermode", "-coverpkg",
                          "-benchtime", "-cpu", "-outputdir", "-cpuprofile", "-memprofile"}),
)  # fmt: skip
_CARGO = _RunnerSpec(
    keep_value=frozenset({"-p", "--package", "--test", "--bench", "--bin", "--example", "--features", "-F",
                          "--test-threads", "--skip"}),
    keep_flag=frozenset({"--lib", "--doc", "--bins", "--tests", "--workspace", "--all", "--release",
                         "--all-features", "--no-default-features", "--exact", "--ignored", "--include-ignored"}),
    skip_value=frozenset({"--manifest-path", "--target", "--target-dir", "-j", "--jobs", "--color",
                          "--message-format", "-Z", "--format", "--profile"}),
)  # fmt: skip
_JS = _RunnerSpec(
    keep_value=frozenset({"-t", "--testNamePattern", "--testPathPattern", "--grep", "-g", "--project",
                          "--shard", "-w", "--maxWorkers", "--spec", "--selectProjects"}),
    keep_flag=frozenset({"--runInBand", "-i", "--onlyChanged", "-o", "--changedSince", "--coverage", "--watchAll",
                         "--ci", "--bail", "--onlyFailures", "-f"}),
    skip_value=frozenset({"--reporter", "--reporters", "--config", "-c", "--timeout", "--testTimeout",
                          "--outputFile", "--cacheDirectory", "--rootDir", "--prefix", "--workspace",
                          "--filter", "--env", "--require", "-r"}),
    paths=True,
)  # fmt: skip
_TOX = _RunnerSpec(
    keep_value=frozenset({"-e", "--env", "-s", "--session", "-k", "-m", "--deselect"}),
    keep_flag=frozenset({"-r", "--recreate", "--lf", "--last-failed"}),
    skip_value=frozenset({"-c", "--conf", "--workdir", "-x", "--override", "--installpkg", "-p", "--parallel",
                          "--result-json", "-f", "--noxfile", "--tb"}),
    short_value=frozenset({"e", "s", "k", "m"}),
)  # fmt: skip
_GENERIC = _RunnerSpec(
    keep_value=frozenset({"-k", "-m", "-e", "--tag", "--tags", "--filter", "--example", "-R", "-L",
                          "--tests-regex", "--label-regex", "--group", "--testsuite"}),
    keep_flag=frozenset({"--failfast", "--reverse", "--only-failures", "--next-failure"}),
    skip_value=frozenset({"--settings", "--parallel", "--verbosity", "-v", "--format", "-f", "--out", "-o",
                          "--require", "-r", "--seed", "--configuration", "-c", "--bootstrap", "--log-junit",
                          "-j", "--parallel-level", "--output-on-failure", "-C", "--build-config", "--test-dir",
                          "--timeout", "--noinput", "--buffer", "-p", "--pattern", "-s", "--start-directory",
                          "-t", "--top-level-directory"}),
    short_value=frozenset({"k", "e"}),
)  # fmt: skip

# program (after ``python -m`` / ``npx`` / ``uv run`` …) -> its family
_TEST_PROGRAMS: dict[str, _RunnerSpec] = {
    "pytest": _PYTEST, "py.test": _PYTEST,
    "jest": _JS, "vitest": _JS, "mocha": _JS, "ava": _JS, "jasmine": _JS, "karma": _JS, "playwright": _JS,
    "tox": _TOX, "nox": _TOX,
    "unittest": _GENERIC, "nose2": _GENERIC, "nosetests": _GENERIC, "trial": _GENERIC, "green": _GENERIC,
    "rspec": _GENERIC, "phpunit": _GENERIC, "ctest": _GENERIC, "runtests.py": _GENERIC,
}  # fmt: skip
# wrappers that run another program: `uv run pytest`, `npx jest`, `poetry run tox`, `bundle exec rspec`
_WRAPPERS = {"uv", "uvx", "poetry", "pipenv", "hatch", "pdm", "conda", "mamba", "pixi", "rye", "npx", "pnpx", "bunx",
             "pnpm", "yarn", "npm", "bun", "bundle"}  # fmt: skip
_WRAPPER_VERBS = {"run", "exec", "x", "dlx"}
_SCRIPT_TEST = {"test", "tests", "unit", "test:unit", "t"}  # `npm test`, `yarn test`, `npm run test:unit`
_PY_PATH_RE = re.compile(r"\.(py|js|jsx|ts|tsx|mjs|cjs|rb|go|rs|php|java|kt|c|cc|cpp)$")
_NON_TARGET = re.compile(r"^-?\d+(\.\d+)?$")  # a bare number is an option's value, never a target


def _test_runner(words: list[str], depth: int = 0) -> tuple[str, list[str], _RunnerSpec] | None:
    """(runner name, its arguments, its family) when ``words`` run a test runner, else None."""
    if not words or depth > 3:
        return None
    head = words[0].rsplit("/", 1)[-1]
    if _PYTHON_RE.match(head):
        j = 1
        while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-c"):
            j += 2 if words[j] in ("-W", "-X") else 1
        if j >= len(words) or words[j] == "-c":
            return None
        if words[j] == "-m":
            return _test_runner(words[j + 1 :], depth + 1)
        return _test_runner(words[j:], depth + 1)  # a script: `python tests/runtests.py …`
    spec = _TEST_PROGRAMS.get(head)
    if spec is not None:
        return head, words[1:], spec
    if head == "manage.py" and words[1:2] == ["test"]:
        return "manage.py test", words[2:], _GENERIC
    if head in ("go", "cargo") and len(words) > 1:
        k = next((i for i in range(1, len(words)) if not words[i].startswith("-")), None)
        if k is not None and words[k] == "test":
            return f"{head} test", words[k + 1 :], _GO if head == "go" else _CARGO
        if k is not None and head == "cargo" and words[k] == "nextest" and words[k + 1 : k + 2] == ["run"]:
            return "cargo nextest", words[k + 2 :], _CARGO
        return None
    if head in _WRAPPERS and len(words) > 1:
        k = 1
        while k < len(words) and words[k].startswith("-"):
            k += 1
        if k >= len(words):
            return None
        verb = words[k]
        if head in ("npm", "yarn", "pnpm", "bun") and verb in _SCRIPT_TEST:
            return f"{head} test", words[k + 1 :], _JS
        if verb in _WRAPPER_VERBS and k + 1 < len(words):
            nxt = words[k + 1]
            if head in ("npm", "yarn", "pnpm", "bun") and nxt in _SCRIPT_TEST:
                return f"{head} test", words[k + 2 :], _JS
            inner = words[k + 1 :]
            while inner and inner[0].startswith("-"):  # `conda run -n env pytest`: options (and a value)
                inner = inner[2:] if inner[0] in ("-n", "--name", "-p", "--prefix", "--with") else inner[1:]
            return _test_runner(inner, depth + 1)
        if head in ("npx", "pnpx", "bunx", "uvx", "yarn", "pnpm", "bun"):
            return _test_runner(words[k:], depth + 1)
    return None


def _norm_path(t: str) -> str:
    while t.startswith("./") and len(t) > 2:
        t = t[2:]
    return t.rstrip("/") if len(t) > 1 else t


def _target_kind(t: str, paths: bool) -> str:
    if "::" in t:
        return "node"
    if _PY_PATH_RE.search(t):
        return "file"
    if paths or "/" in t or t in (".", "..") or t.endswith("..."):
        return "dir"
    return f"name{min(4, t.count('.') + 1)}"  # dotted labels: app, module, class, test


def test_target(words: list[str]) -> tuple[str, str, str]:
    """(target, scope, place) of a simple command that runs a test runner; ("", "", "")
    otherwise (module docstring). ``words``: one command's words, prefixes and redirections
    removed."""
    found = _test_runner(words)
    if found is None:
        return "", "", ""
    runner, args, spec = found
    targets: list[str] = []
    kinds: set[str] = set()
    selects: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--" or a == "":
            continue
        if not a.startswith("-") or a == "-":
            if not _NON_TARGET.match(a):
                targets.append(_norm_path(a))
                kinds.add(_target_kind(a, spec.paths))
            continue
        name, eq, value = a.partition("=")
        if not eq and not a.startswith("--") and len(a) > 2 and a[1] in spec.short_value:
            name, eq, value = a[:2], "=", a[2:]  # -kfoo, -n4
        if name in spec.keep_value:
            if not eq and i < len(args):
                value, i = args[i], i + 1
            selects.append(f"{name}={value}")
        elif name in spec.keep_flag:
            selects.append(name)
        elif name in spec.skip_value and not eq and i < len(args) and not args[i].startswith("-"):
            i += 1
    uniq = sorted(set(targets))
    target = " ".join([runner, *uniq, *selects])[:512]
    names = sorted({s.split("=", 1)[0] for s in selects})
    scope = " ".join([runner, "+".join(sorted(kinds)) or "all", f"n{min(3, len(uniq))}", *names])[:256]
    dirs = sorted({t.split("::", 1)[0].rsplit("/", 1)[0] for t in uniq if "/" in t})
    return target, scope, " ".join(dirs)[:256]


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
        return _SegmentInfo(capped, t, False, inner.program, inner.target)
    if head in _SHELLS and depth < 3 and "-c" in words[1:]:
        j = words.index("-c", 1)
        if j + 1 < len(words):
            sub = _analyse(words[j + 1], depth + 1)
            return _SegmentInfo(sub.sleep_s, sub.timeout_s, False, sub.program or head, sub.target)
    if head in _INSTANT:
        return _SegmentInfo(0.0, None, True, "")
    return _SegmentInfo(0.0, None, False, _program_of(words), test_target(words))


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
    target: tuple[str, str, str] = ("", "", "")


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
    target: tuple[str, str, str] = ("", "", "")
    saw_sleep = False
    saw_sleep_program = False
    for before, members, after in segments:
        infos = [_segment(m, depth) for m in members if m]
        saw_sleep_program = saw_sleep_program or any(i.program == "sleep" for i in infos)
        if not program:
            first = next((i for i in infos if i.program and i.program != "sleep"), None)
            if first is not None:
                program, target = first.program, first.target
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
    return _Analysis(sleep, timeout, program, text, target)


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
    target, scope, place = test_target(core)
    return ParsedCommand(None, None, _program_of(core)[:64], exact, mask_numbers(exact), target, scope, place)


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
        target=a.target[0],
        scope=a.target[1],
        place=a.target[2],
    )
