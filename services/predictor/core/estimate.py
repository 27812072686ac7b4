"""Expected duration Ê of a running call from the strongest evidence
(docs/algorithms.md#predictor-evidence-hierarchy).

Order, strongest first:

1. **Direct timing** from the tool: the latest report wins — ``eta_s`` gives
   Ê = elapsed_at_report + eta; ``fraction`` f at elapsed e gives Ê = e / f, or, once two
   reports are ≥ 5 points apart, the rate between the first and the latest report
   extrapolated to 1 (this ignores start-up time spent before the first report). The
   remaining time a report implies is multiplied by a learned calibration (see
   ``Estimator._calibration``; 1 until the command, program or tool has finished with
   progress reports before).
2. **Exposed return deadline** D (event ``deadline_s`` or a parsed ``timeout N``). A deadline
   is an upper bound on the return, so it *caps* every estimate below it. It is the estimate
   itself when the tool is known to run to its deadline (median duration/D ratio of the
   tool name ≥ ``deadline_bound_ratio``, e.g. terminal harnesses that wait a fixed ``duration``:
   Ê = D + the tool's median overshoot, an additive overhead — a ratio would scale a 40 ms
   capture delay seen on 0.1 s waits up to seconds on 60 s waits), and when a running call
   has outlived every history estimate (the
   deadline is then the only bound still informative). Otherwise (e.g. a harness timeout
   of 25 s on a ``grep``) the estimates below, capped by D, are used. Until a tool's ratio
   is learned (``min_samples_deadline_ratio`` calls) its deadline is treated as a bound.
3. **Parsed sleep** S: Ê = S + the learned residual (what the rest of the command adds) of
   the command's shape, else of all sleep commands, else ``sleep_residual_default_s``.
4. **History** (robust, see history.py), most specific level with enough samples: the same
   command earlier in the same session, the exact command (any session), the command
   shape (numbers masked), for test runners the **target** (what runs: paths, node ids,
   ``-k``/``-m`` selections, packages — output flags and pipes ignored, so
   ``pytest tests/a.py -x -q`` and ``python -m pytest tests/a.py -v | tail`` share it) and the
   **scope** (the kind of target: one test, a file, a directory, the whole suite, a ``-k``
   selection) first in the target's directories (**place**), then anywhere, the program,
   the tool name; then **global**. The program level alone mixes a 0.5 s single-test run
   with a 60 s suite run of the same runner; the test levels sit between the shape and the
   program and need ``min_samples_target`` / ``_place`` / ``_scope`` samples, so a new
   target backs off to its place, its scope, then to the program, as before. The session level
   comes first because the same command in another session may run in another repository
   or machine (``pytest tests/test_io.py -q`` means different work in different repos),
   while a session re-running a command is the most common agent pattern (reproduce, fix,
   re-run). (A "same program earlier in this session" level was tried and dropped: a
   session's targeted test runs say little about its first whole-file run.)
5. **Default** ``default_duration_s`` (5 s).

When a call is re-predicted while running (a progress event, including a bare heartbeat),
history estimates are conditioned on the elapsed time e: the weighted median of the
samples longer than e (the call is known to last at least e). When the chosen level has
no sample longer than e (the call is an outlier for it), the next weaker levels are
tried in order — the global history knows how long calls that outlive e usually run;
with no support anywhere the estimate stays and the call is overdue.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from services.predictor.core.command import ParsedCommand, parse_command
from services.predictor.core.config import PredictorConfig
from services.predictor.core.history import HistoryStore
from services.predictor.core.model import Evidence

GLOBAL_KEY = "g"
GLOBAL_RESIDUAL_KEY = "r:g"


def _h(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class CommandInfo:
    """A (tool, command) pair parsed once, with its history keys."""

    parsed: ParsedCommand
    key_command: str
    key_shape: str
    #: the shape differs from the exact command (it has numbers): the shape level adds something
    shape_differs: bool
    key_program: str
    #: test runners only ("" otherwise): the target and the scope levels
    key_target: str
    key_place: str
    key_scope: str
    key_tool: str
    key_residual: str
    key_deadline: str
    key_deadline_slack: str


@dataclass(slots=True)
class CallState:
    """Mutable state of one call inside the core (not an output)."""

    call_id: str
    tool: str
    command: str
    #: the call's start; provisional (first event seen) until ``start_known``
    started_at_s: float
    start_known: bool
    made_at_s: float
    deadline_s: float | None = None
    eta: tuple[float, float] | None = None  # (t, eta_s) of the latest ETA report
    frac_first: tuple[float, float] | None = None  # (t, fraction) first report with f > 0
    frac_last: tuple[float, float] | None = None
    expected_s: float = 0.0
    evidence: Evidence = Evidence.DEFAULT
    #: parsed (tool, command), cached; not state (recomputed after a restore)
    info: CommandInfo | None = field(default=None, repr=False, compare=False)

    def effective_deadline_s(self, info: CommandInfo) -> float | None:
        a, b = self.deadline_s, info.parsed.timeout_s
        if a is None:
            return b
        return a if b is None else min(a, b)


def direct_naive(call: CallState, start: float, min_fraction: float) -> tuple[float, float, Evidence] | None:
    """(elapsed at the latest direct report, remaining it implies, ETA or FRACTION), or None.

    ETA: remaining = eta. Fraction f at elapsed e: remaining = e (1 − f) / f, or, once two
    reports are ≥ 5 points apart, (1 − f) × the rate between the first and latest report
    (which leaves out start-up time spent before the first report).
    """
    eta, last = call.eta, call.frac_last
    if eta is not None and (last is None or eta[0] >= last[0]):
        return max(0.0, eta[0] - start), eta[1], Evidence.ETA
    if last is not None and last[1] >= min_fraction:
        t_last, f_last = last
        e_last = max(0.0, t_last - start)
        first = call.frac_first
        if first is not None and f_last - first[1] >= 0.05 and t_last > first[0]:
            rate_s = (t_last - first[0]) / (f_last - first[1])
            return e_last, (1.0 - f_last) * rate_s, Evidence.FRACTION
        return e_last, e_last * (1.0 - f_last) / f_last, Evidence.FRACTION
    return None


class Estimator:
    """Evidence hierarchy over a shared ``HistoryStore``; caches parsed commands (LRU)."""

    def __init__(self, config: PredictorConfig, history: HistoryStore) -> None:
        self.cfg = config
        self.history = history
        self._cache: OrderedDict[tuple[str, str], CommandInfo] = OrderedDict()
        c = config
        self._levels = (
            (Evidence.SESSION_COMMAND_HISTORY, c.min_samples_session_command),
            (Evidence.COMMAND_HISTORY, c.min_samples_command),
            (Evidence.SHAPE_HISTORY, c.min_samples_shape),
            (Evidence.TARGET_HISTORY, c.min_samples_target),
            (Evidence.PLACE_HISTORY, c.min_samples_place),
            (Evidence.SCOPE_HISTORY, c.min_samples_scope),
            (Evidence.PROGRAM_HISTORY, c.min_samples_program),
            (Evidence.TOOL_HISTORY, c.min_samples_tool),
            (Evidence.GLOBAL_HISTORY, c.min_samples_global),
        )

    def info_of(self, call: CallState) -> CommandInfo:
        info = call.info
        if info is None:
            info = call.info = self.info(call.tool, call.command)
        return info

    def info(self, tool: str, command: str) -> CommandInfo:
        key = (tool, command)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        p = parse_command(command)
        shape_h = _h(tool, p.shape)
        info = CommandInfo(
            parsed=p,
            key_command="c:" + _h(tool, p.exact),
            key_shape="s:" + shape_h,
            shape_differs=p.shape != p.exact,
            key_program=f"p:{tool}\x1f{p.program}",
            key_target="tg:" + _h(tool, p.target) if p.target else "",
            key_place="pl:" + _h(tool, p.scope, p.place) if p.place else "",
            key_scope="sc:" + _h(tool, p.scope) if p.scope else "",
            key_tool="t:" + tool,
            key_residual="r:" + shape_h,
            key_deadline="d:" + tool,
            key_deadline_slack="ds:" + tool,
        )
        self._cache[key] = info
        if len(self._cache) > self.cfg.parse_cache_size:
            self._cache.popitem(last=False)
        return info

    def _level_key(self, info: CommandInfo, level: Evidence, session_id: str) -> str:
        if level is Evidence.SESSION_COMMAND_HISTORY:
            return "x:" + session_id + "\x1f" + info.key_command
        if level is Evidence.COMMAND_HISTORY:
            return info.key_command
        if level is Evidence.SHAPE_HISTORY:
            return info.key_shape
        if level is Evidence.TARGET_HISTORY:
            return info.key_target
        if level is Evidence.PLACE_HISTORY:
            return info.key_place
        if level is Evidence.SCOPE_HISTORY:
            return info.key_scope
        if level is Evidence.PROGRAM_HISTORY:
            return info.key_program
        if level is Evidence.TOOL_HISTORY:
            return info.key_tool
        return GLOBAL_KEY

    def estimate(
        self, session_id: str, call: CallState, info: CommandInfo, now_s: float, refresh: bool
    ) -> tuple[float, Evidence]:
        """(Ê seconds, evidence) for ``call`` at ``now_s`` (module docstring gives the order)."""
        cfg = self.cfg
        start = call.started_at_s
        deadline = call.effective_deadline_s(info)
        direct = self._direct(info, call, start)
        if direct is not None:
            exp, ev = direct
            if deadline is not None and deadline < exp:
                return deadline, Evidence.DEADLINE
            return exp, ev

        elapsed = (now_s - start) if refresh else 0.0
        base, ev = self._base(session_id, info, elapsed)
        if deadline is None:
            return base, ev
        h = self.history
        m = cfg.min_samples_deadline_ratio
        ratio = h.estimate(info.key_deadline, m)
        if ratio is not None and ratio >= cfg.deadline_bound_ratio:
            # returns at its deadline plus a fixed overhead (capture, process exit)
            slack = h.estimate(info.key_deadline_slack, m) or 0.0
            return max(0.0, deadline + slack), Evidence.DEADLINE
        if deadline < base or elapsed > base:
            # a bound below the estimate, or the only thing still known about an overdue call
            return deadline, Evidence.DEADLINE
        return base, ev

    def _direct(self, info: CommandInfo, call: CallState, start: float) -> tuple[float, Evidence] | None:
        naive = direct_naive(call, start, self.cfg.min_fraction)
        if naive is None:
            return None
        e_report, remaining, ev = naive
        return e_report + self._calibration(info, ev) * remaining, ev

    def _calibration(self, info: CommandInfo, ev: Evidence) -> float:
        """Learned ratio (actual remaining / reported remaining) for this command, program or
        tool; 1 until learned. Corrects tools whose progress is not linear in time (pytest -v
        with a few tests: start-up dominates, so "1 of 3 done" overstates what remains)."""
        kind = "ke:" if ev is Evidence.ETA else "kf:"
        h = self.history
        for key, m in ((info.key_command, 1), (info.key_program, 3), (info.key_tool, 3)):
            k = h.estimate(kind + key, m)
            if k is not None:
                return k
        return 1.0

    def _base(self, session_id: str, info: CommandInfo, elapsed_s: float) -> tuple[float, Evidence]:
        h = self.history
        sleep = info.parsed.sleep_s
        if sleep is not None:
            resid = h.estimate(info.key_residual, 1)
            if resid is None:
                resid = h.estimate(GLOBAL_RESIDUAL_KEY, 3)
            if resid is None:
                resid = self.cfg.sleep_residual_default_s
            return sleep + max(0.0, resid), Evidence.SLEEP
        first: tuple[float, Evidence] | None = None
        for level, min_samples in self._levels:
            if level is Evidence.SHAPE_HISTORY and not info.shape_differs:
                continue  # same samples as the command level
            key = self._level_key(info, level, session_id)
            if not key:
                continue  # not a test run: no target / scope level
            hist = h.get(key)
            if hist is None or len(hist) < min_samples:
                continue
            if elapsed_s <= 0.0:
                return hist.estimate(h.decay), level
            if first is None:
                first = (hist.estimate(h.decay), level)
                if first[0] > elapsed_s:
                    return first
            cond = hist.estimate_above(elapsed_s, h.decay)
            if cond is not None:
                return cond, level
        if first is not None:
            return first  # overdue everywhere: keep the strongest estimate
        return self.cfg.default_duration_s, Evidence.DEFAULT

    def learn(self, session_id: str, call: CallState, info: CommandInfo, duration_s: float) -> None:
        """Fold a finished call's measured duration into every history level it belongs to."""
        h = self.history
        sleep = info.parsed.sleep_s
        if sleep is not None:
            resid = max(0.0, duration_s - sleep)
            h.add(info.key_residual, resid)
            h.add(GLOBAL_RESIDUAL_KEY, resid)
        else:
            h.add(self._level_key(info, Evidence.SESSION_COMMAND_HISTORY, session_id), duration_s)
            h.add(info.key_command, duration_s)
            if info.shape_differs:
                h.add(info.key_shape, duration_s)
            if info.key_target:
                h.add(info.key_target, duration_s)
                if info.key_place:
                    h.add(info.key_place, duration_s)
                h.add(info.key_scope, duration_s)
            h.add(info.key_program, duration_s)
        h.add(info.key_tool, duration_s)
        h.add(GLOBAL_KEY, duration_s)
        naive = direct_naive(call, call.started_at_s, self.cfg.min_fraction)
        if naive is not None and naive[1] >= 0.05:
            e_report, remaining, ev = naive
            k = min(10.0, max(0.0, (duration_s - e_report) / remaining))
            kind = "ke:" if ev is Evidence.ETA else "kf:"
            for key in (info.key_command, info.key_program, info.key_tool):
                h.add(kind + key, k)
        deadline = call.effective_deadline_s(info)
        if deadline is not None and deadline > 0:
            ratio = duration_s / deadline
            h.add(info.key_deadline, ratio)
            h.add(info.key_deadline_slack, duration_s - deadline)
