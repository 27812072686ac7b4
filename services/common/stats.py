"""Small numeric helpers shared by the services, the simulator (services/sim/) and the benchmarks (bench/).

Pure Python, no third-party imports: the lowest layer, importable from anywhere. The one place
percentiles are defined: ``percentile`` over samples (numpy's "linear" everywhere a report
prints a percentile; "higher" where a figure must match the router's demand p99) and
``histogram_quantile`` over a Prometheus histogram's buckets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

#: how ``percentile`` picks between the two samples around the percentile's position
Method = Literal["linear", "higher"]


def percentile(values: Iterable[float], q: float, empty: float = 0.0, method: Method = "linear") -> float:
    """The ``q``-th percentile (q in [0, 100]) of ``values`` as numpy computes it
    (``np.percentile(values, q, method=method)``):

    - ``"linear"`` (the default, numpy's): interpolated between the closest ranks;
    - ``"higher"``: the sample at the next rank up, always one of the samples. At q = 99 this is
      ``sorted(values)[min(n - 1, int(0.99 * n))]``, the router's demand p99
      (``services/router/store.py``), which the budget benchmark reproduces.

    ``empty`` is returned for no values (0.0 by default; the benchmarks pass ``nan``)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q!r}")
    xs = sorted(values)
    if not xs:
        return empty
    pos = (len(xs) - 1) * (q / 100.0)  # numpy's virtual index, rounded as numpy does
    if method == "higher":
        return float(xs[math.ceil(pos)])
    if method != "linear":
        raise ValueError(f"percentile method must be 'linear' or 'higher', got {method!r}")
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    a, b = float(xs[lo]), float(xs[hi])
    # numpy's lerp: stable at both ends (exact a at frac 0, exact b at frac 1)
    return b - (b - a) * (1.0 - frac) if frac >= 0.5 else a + (b - a) * frac


def histogram_quantile(buckets: Iterable[tuple[float, float]], q: float, empty: float = math.nan) -> float:
    """The ``q``-th percentile (q in [0, 100]) of the observations in a histogram, as PromQL's
    ``histogram_quantile(q / 100, ...)`` computes it: ``buckets`` are cumulative
    ``(le, count)`` pairs (any order; the last, ``+Inf``, holds the total), linear within the
    bucket the rank falls in, the lower edge when that is the ``+Inf`` bucket.

    ``empty`` is returned for no observations."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"histogram_quantile q must be in [0, 100], got {q!r}")
    edges = sorted(buckets)
    total = edges[-1][1] if edges else 0.0
    if total <= 0:
        return empty
    rank = q / 100.0 * total
    lower, below = 0.0, 0.0
    for le, count in edges:
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower
