"""Small numeric helpers shared by the services, the simulator (sim/) and the benchmarks (bench/).

Pure Python, no third-party imports: the lowest layer, importable from anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float, empty: float = 0.0) -> float:
    """The ``q``-th percentile (q in [0, 100]) of ``values`` by linear interpolation between
    the closest ranks — numpy's default (``np.percentile(values, q)``, method "linear").

    ``empty`` is returned for no values (0.0 by default; the benchmarks pass ``nan``)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q!r}")
    xs = sorted(values)
    if not xs:
        return empty
    pos = (len(xs) - 1) * (q / 100.0)  # numpy's virtual index for "linear", rounded as numpy does
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    a, b = float(xs[lo]), float(xs[hi])
    # numpy's lerp: stable at both ends (exact a at frac 0, exact b at frac 1)
    return b - (b - a) * (1.0 - frac) if frac >= 0.5 else a + (b - a) * frac
