"""Small helpers the rank rules share: means, durations and counts as people read them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from trainmedic.record.ranks import (
    RankStats,
)


def nice(seconds: float) -> float:
    """Round up to a number a person would write: 60, 120, 300, 600, 900, 1200, ..."""
    for value in (60, 120, 180, 300, 600, 900, 1200, 1800, 2700, 3600):
        if seconds <= value:
            return float(value)
    return float(math.ceil(seconds / 1800.0) * 1800)


def mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def ranks_word(n: int) -> str:
    return "rank" if n == 1 else f"{n} ranks"


def nodes(stats: Sequence[RankStats]) -> int:
    return len({s.node for s in stats})
