"""The statistics of a comparison's throughput: each run's steady steps cut into
blocks, the two-level block bootstrap of the after/before ratio, and the floor that
run-to-run noise puts under its interval (docs/compare.md, "Throughput and its
interval"). Pure; rates are units (samples or steps, times the processes stepping side
by side) per second.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from trainmedic.record.spans import StepSpan

BLOCKS = 20
"""Blocks a run's steady steps are cut into (fewer for runs under 100 steps)."""

Blocks = Sequence[tuple[float, float]]
"""(units, seconds) of each block of one run."""


def halves(blocks: Blocks) -> tuple[float, float] | None:
    """The rate of the first and the second half of a run's blocks (``None``: too few)."""
    if len(blocks) < 4:
        return None
    mid = len(blocks) // 2

    def rate(part: Sequence[tuple[float, float]]) -> float:
        seconds = sum(t for _, t in part)
        return sum(u for u, _ in part) / seconds if seconds > 0 else 0.0

    return rate(blocks[:mid]), rate(blocks[mid:])


def blocks_of(
    spans: Sequence[StepSpan], samples: bool, processes: int
) -> list[tuple[float, float]]:
    """(units, seconds) per block of consecutive spans; units are samples (or steps) times
    the processes stepping side by side, so units/seconds is the job's rate."""
    if not spans:
        return []
    steps = sum(s.count for s in spans)
    n_blocks = max(1, min(BLOCKS, steps // 5))
    per_block = steps / n_blocks
    blocks: list[list[float]] = [[0.0, 0.0] for _ in range(n_blocks)]
    seen = 0
    for s in spans:
        i = min(n_blocks - 1, int(seen / per_block))
        units = (s.samples if samples and s.samples is not None else s.count) * processes
        blocks[i][0] += units
        blocks[i][1] += s.duration_s
        seen += s.count
    return [(u, t) for u, t in blocks if t > 0]


def bootstrap_ratio(
    b: Sequence[Blocks], a: Sequence[Blocks], resamples: int, confidence: float,
    rng: random.Random,
) -> tuple[float, float]:  # fmt: skip
    """The ``confidence`` interval of the after/before rate ratio by a two-level
    bootstrap: each side's runs (their blocks) drawn with replacement, then each drawn
    run's blocks; a side's rate is the mean of its drawn runs' rates."""

    def side(runs: Sequence[Blocks]) -> float:
        drawn = [runs[rng.randrange(len(runs))] for _ in runs]
        return statistics.fmean(resampled_rate(blocks, rng) for blocks in drawn)

    ratios = []
    for _ in range(resamples):
        rb = side(b)
        ra = side(a)
        if rb > 0:
            ratios.append(ra / rb)
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    lo = ratios[max(0, math.floor(tail * len(ratios)))]
    hi = ratios[min(len(ratios) - 1, math.ceil((1.0 - tail) * len(ratios)) - 1)]
    return lo, hi


def widened(
    interval: tuple[float, float], speedup: float, runs_b: int, runs_a: int,
    run_noise: float, confidence: float,
) -> tuple[float, float]:  # fmt: skip
    """``interval`` made at least as wide, around ``speedup``, as run-to-run noise of
    ``run_noise`` (log standard deviation a run) allows for this many runs a side."""
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    half = z * run_noise * math.sqrt(1.0 / runs_b + 1.0 / runs_a)
    centre = math.log(speedup)
    return min(interval[0], math.exp(centre - half)), max(interval[1], math.exp(centre + half))


def resampled_rate(blocks: Blocks, rng: random.Random) -> float:
    """The rate of ``blocks`` drawn with replacement, as many as there are."""
    units = seconds = 0.0
    for _ in range(len(blocks)):
        u, t = blocks[rng.randrange(len(blocks))]
        units += u
        seconds += t
    return units / seconds if seconds > 0 else 0.0
