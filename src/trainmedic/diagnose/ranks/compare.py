"""Rank statistics compared: how long each rank holds the others back, step by step
(:func:`compare_ranks`), and ranks given uneven batches."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainmedic.diagnose.ranks.thresholds import RankThresholds
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.ranks import (
    AlignedStep,
    RankStats,
)


@dataclass(frozen=True)
class Holdback:
    """One rank compared with the others over the lockstep steps.

    Attributes:
        rank: the rank.
        excess_s: median over steps of its data wait minus the others' median, seconds.
        slowest_share: share of steps in which its data wait was the largest.
        holdback_s: mean over the other ranks of the median per-step difference
            of data wait (the others' wait in collectives), seconds per step.
        backward_wait_s: mean over the other ranks of the median per-step
            difference of compute time (their wait inside backward), or ``None``.
        lockstep: every other rank's steps last as long as its (within tolerance).
        step_s: median step time over the lockstep steps, seconds.
    """

    rank: int
    excess_s: float
    slowest_share: float
    holdback_s: float
    backward_wait_s: float | None
    lockstep: bool
    step_s: float
    steps: int


def compare_ranks(aligned: Sequence[AlignedStep], rt: RankThresholds) -> list[Holdback]:
    """Each rank's data wait against the others, step by step (pure)."""
    if not aligned:
        return []
    ranks = sorted(aligned[0].by_rank)
    step_s = statistics.median(
        statistics.median(s.duration_s for s in a.by_rank.values()) for a in aligned
    )
    out = []
    for r in ranks:
        excess, slowest = [], 0
        per_other: dict[int, list[float]] = {q: [] for q in ranks if q != r}
        compute: dict[int, list[float]] = {q: [] for q in ranks if q != r}
        drift: dict[int, list[float]] = {q: [] for q in ranks if q != r}
        for a in aligned:
            mine = a.by_rank[r]
            others = [a.by_rank[q].data_wait_s for q in ranks if q != r]
            excess.append(mine.data_wait_s - statistics.median(others))
            slowest += mine.data_wait_s > max(others)
            for q in per_other:
                theirs = a.by_rank[q]
                per_other[q].append(mine.data_wait_s - theirs.data_wait_s)
                drift[q].append(abs(mine.duration_s - theirs.duration_s))
                if mine.compute_s is not None and theirs.compute_s is not None:
                    compute[q].append(theirs.compute_s - mine.compute_s)
        held = [max(0.0, statistics.median(v)) for v in per_other.values()]
        waits = [statistics.median(v) for v in compute.values() if v]
        out.append(
            Holdback(
                rank=r,
                excess_s=statistics.median(excess),
                slowest_share=slowest / len(aligned),
                holdback_s=min(step_s, statistics.fmean(held)) if held else 0.0,
                backward_wait_s=max(0.0, statistics.fmean(waits)) if waits else None,
                lockstep=all(
                    statistics.median(v) <= rt.lockstep_tolerance * step_s for v in drift.values()
                ),
                step_s=step_s,
                steps=len(aligned),
            )
        )
    return out


def uneven_batches(rt: RankThresholds, stats: Sequence[RankStats]) -> list[Finding]:
    """Ranks given different amounts of data per step: the rank with the most
    computes longest while the others wait for it in every all-reduce."""
    known = [s for s in stats if s.samples_per_step]
    if len(known) < 2:
        return []
    most = max(known, key=lambda s: s.samples_per_step or 0.0)
    fewest = min(known, key=lambda s: s.samples_per_step or 0.0)
    ratio = (most.samples_per_step or 0.0) / (fewest.samples_per_step or 1.0)
    if ratio < 1.0 + rt.uneven_samples_share:
        return []
    per_rank = {str(s.rank): round(s.samples_per_step or 0.0, 2) for s in known}
    return [
        Finding(
            id="distributed.uneven_batches",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title=(
                f"Ranks get uneven batches: rank {most.rank} {most.samples_per_step:.1f} samples "
                f"per step, rank {fewest.rank} {fewest.samples_per_step:.1f}"
            ),
            evidence={
                "rank": most.rank,
                "samples_per_step": per_rank,
                "ratio": ratio,
                "uneven_samples_share": rt.uneven_samples_share,
            },
            fix=(
                "Give every rank the same batch: DistributedSampler(dataset, drop_last=True) "
                "with the same batch_size on every rank; with variable-length samples, "
                "bucket by length so that every rank's batch costs the same."
            ),
            impact=None,
            subject=f"rank{most.rank}",
        )
    ]
