"""Duration history that outliers cannot drag around.

Estimator (documented choice): an **exponentially weighted median** over the last
``window`` observations of a key. Observation i (0 = newest) has weight ``decay**i``; the
estimate is the smallest sample whose cumulative weight (in value order) reaches half of
the total. Why:

* the median minimises the mean *absolute* error — the figure we are judged on (MAE, share
  within 0.5 s) — whereas a mean minimises squared error and follows outliers;
* robustness: a single outlier moves the estimate by at most one rank, whatever its size;
  more than half the (weighted) window must be outliers before the estimate follows them;
* recency: the exponential weights (EWMA-like) let the estimate follow a drifting tool
  (a test suite that grew) within a few observations, and the bounded ring keeps state
  small and serialisable.

The same estimator serves the other learned series (sleep residuals, deadline ratios and
overshoots, progress calibrations). ``estimate_above(e)`` is the same median over samples
longer than ``e`` only: the
conditional estimate once a call has been running for ``e`` seconds (used when a runner
reports that a call is still running). All durations are seconds.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any


class DurationHistory:
    """Ring of the last ``window`` durations of one key; invariant: ``len(samples) <= window``."""

    __slots__ = ("_cache", "count", "samples")

    def __init__(self, samples: list[float] | None = None, count: int = 0) -> None:
        self.samples: list[float] = list(samples or [])  # oldest first
        self.count = max(count, len(self.samples))  # all observations ever made
        self._cache: float | None = None

    def add(self, duration_s: float, window: int) -> None:
        self.samples.append(duration_s)
        if len(self.samples) > window:
            del self.samples[: len(self.samples) - window]
        self.count += 1
        self._cache = None

    def __len__(self) -> int:
        return len(self.samples)

    def estimate(self, decay: float) -> float:
        """Weighted median; requires at least one sample."""
        if self._cache is None:
            self._cache = _weighted_median(self.samples, decay, None)
        return self._cache

    def estimate_above(self, elapsed_s: float, decay: float) -> float | None:
        """Weighted median of the samples longer than ``elapsed_s``; None when there are none."""
        samples = self.samples
        if elapsed_s < min(samples):
            return self.estimate(decay)  # every sample qualifies: the (cached) plain estimate
        if elapsed_s >= max(samples):
            return None
        return _weighted_median(samples, decay, elapsed_s)

    def to_dict(self) -> dict[str, Any]:
        return {"d": list(self.samples), "n": self.count}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DurationHistory:
        samples = [float(x) for x in data.get("d", [])]
        if not all(math.isfinite(s) for s in samples):  # (deadline overshoots may be negative)
            raise ValueError("history samples must be finite numbers")
        return cls(samples, int(data.get("n", len(samples))))


_WEIGHTS: dict[tuple[float, int], list[float]] = {}


def _weights(decay: float, n: int) -> list[float]:
    """decay**(n-1), ..., decay**0: the weight of each sample, oldest first (memoised)."""
    w = _WEIGHTS.get((decay, n))
    if w is None:
        w = _WEIGHTS[(decay, n)] = [decay ** (n - 1 - i) for i in range(n)]
    return w


def _weighted_median(samples: list[float], decay: float, above: float | None) -> float:
    pairs = list(zip(samples, _weights(decay, len(samples)), strict=True))
    if above is not None:
        pairs = [p for p in pairs if p[0] > above]
    pairs.sort()
    half = sum(w for _, w in pairs) / 2.0
    acc = 0.0
    for value, w in pairs:
        acc += w
        if acc >= half:
            return value
    return pairs[-1][0]


class HistoryStore:
    """Histories by key with an LRU bound on the number of keys; tracks what changed.

    Keys are opaque strings built by the predictor (``c:`` exact command, ``s:`` command
    shape, ``tg:`` test target, ``pl:``/``sc:`` test scope in its directories / anywhere,
    ``p:`` program, ``t:`` tool, ``g`` global, ``r:`` sleep residuals, ``d:`` deadline
    ratios). ``drain_dirty`` hands the changed keys to whoever persists them.
    """

    def __init__(self, window: int, decay: float, max_keys: int) -> None:
        if window < 1 or not (0.0 < decay <= 1.0) or max_keys < 1:
            raise ValueError("window >= 1, 0 < decay <= 1 and max_keys >= 1 are required")
        self.window = window
        self.decay = decay
        self.max_keys = max_keys
        self._h: OrderedDict[str, DurationHistory] = OrderedDict()
        self._dirty: set[str] = set()
        self._evicted: set[str] = set()

    def get(self, key: str) -> DurationHistory | None:
        return self._h.get(key)

    def add(self, key: str, duration_s: float) -> None:
        if not math.isfinite(duration_s):  # e.g. a ratio over a denormal deadline: not evidence
            return
        h = self._h.get(key)
        if h is None:
            h = self._h[key] = DurationHistory()
            self._evicted.discard(key)
            if len(self._h) > self.max_keys:
                old, _ = self._h.popitem(last=False)
                self._dirty.discard(old)
                self._evicted.add(old)
        else:
            self._h.move_to_end(key)
        h.add(duration_s, self.window)
        self._dirty.add(key)

    def estimate(self, key: str, min_samples: int) -> float | None:
        h = self._h.get(key)
        if h is None or len(h) < min_samples:
            return None
        return h.estimate(self.decay)

    def __len__(self) -> int:
        return len(self._h)

    def __iter__(self) -> Iterator[str]:
        return iter(self._h)

    def drain_dirty(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """(changed key -> state, evicted keys) since the last drain."""
        changed = {k: self._h[k].to_dict() for k in self._dirty if k in self._h}
        evicted = set(self._evicted)
        self._dirty.clear()
        self._evicted.clear()
        return changed, evicted

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {k: h.to_dict() for k, h in self._h.items()}

    def load(self, data: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace the content with ``data`` (key -> ``DurationHistory.to_dict()``)."""
        self._h.clear()
        for key, state in data.items():
            self._h[key] = DurationHistory.from_dict(state)
        while len(self._h) > self.max_keys:
            self._h.popitem(last=False)
        self._dirty.clear()
        self._evicted.clear()
