"""The Wilson score interval of a share, for counts of stack samples.

Small and dependency-free: the probe (in the job, at start-up cost) and the
diagnosis both use it.
"""

from __future__ import annotations

import math


def _half(p: float, n: float, z: float) -> float:
    z2 = z * z
    return z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)


def wilson_interval(hits: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of ``hits`` successes in ``n`` trials, 0..1."""
    if n <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, hits / n))
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _half(p, n, z)
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_half_width(hits: float, n: float, z: float = 1.96) -> float:
    """Half the width of the Wilson score interval of ``hits`` in ``n`` (1 when ``n`` is 0)."""
    if n <= 0:
        return 1.0
    return _half(min(1.0, max(0.0, hits / n)), n, z)
