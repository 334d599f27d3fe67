"""Means and ratios of repeated measurements with their confidence intervals.

Throughput is measured in segments (each a rate, samples/s); the tuner's
verdicts use the mean of the segments and a percentile bootstrap of the
ratio of two means, seeded so the same measurements give the same interval.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

BOOTSTRAP_RESAMPLES = 2000


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def bootstrap_ratio_ci(
    after: Sequence[float],
    before: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``mean(after) / mean(before)``; ``None``
    when either side has fewer than 2 values."""
    if len(after) < 2 or len(before) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        a = mean([after[rng.randrange(len(after))] for _ in after])
        b = mean([before[rng.randrange(len(before))] for _ in before])
        if b > 0:
            ratios.append(a / b)
    if not ratios:
        return None
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    lo = ratios[int(tail * (len(ratios) - 1))]
    hi = ratios[int((1.0 - tail) * (len(ratios) - 1))]
    return lo, hi


def mean_ci(
    values: Sequence[float], *, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean; ``None`` with fewer than 2 values."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(
        mean([values[rng.randrange(len(values))] for _ in values])
        for _ in range(BOOTSTRAP_RESAMPLES)
    )
    tail = (1.0 - confidence) / 2.0
    return means[int(tail * (len(means) - 1))], means[int((1.0 - tail) * (len(means) - 1))]
