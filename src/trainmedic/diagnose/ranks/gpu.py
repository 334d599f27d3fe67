"""The GPU straggler (a GPU that holds its clock down) and GPU load imbalance."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from trainmedic.diagnose.ranks.thresholds import RankThresholds
from trainmedic.diagnose.ranks.units import ms
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.ranks import (
    RankStats,
)


def gpu_straggler(view: RunView, rt: RankThresholds, stats: Sequence[RankStats]) -> Finding | None:
    """A rank whose GPU holds its clock down (heat, power) while the others' do not."""
    with_gpu = [s for s in stats if s.gpu is not None and s.gpu.sm_clock_mhz]
    if len(with_gpu) < 2:
        return None
    slow = min(with_gpu, key=lambda s: s.gpu.sm_clock_mhz or 0.0)  # type: ignore[union-attr]
    gpu = slow.gpu
    assert gpu is not None and gpu.sm_clock_mhz is not None
    others = [s.gpu.sm_clock_mhz for s in with_gpu if s is not slow and s.gpu is not None]
    reference = statistics.median(c for c in others if c is not None)
    ratio = gpu.sm_clock_mhz / reference if reference else 1.0
    if ratio > rt.clock_slow_ratio or (gpu.throttled_share or 0.0) < rt.throttled_min_share:
        return None
    work = slow.gpu_time_s if slow.gpu_time_s is not None else slow.compute_s
    step = slow.step_time_s or 0.0
    holdback = work * (1.0 - ratio) if work is not None else None
    share = min(1.0, holdback / step) if holdback is not None and step > 0 else None
    severity = Severity.WARNING
    if share is not None and share < rt.holdback_info_share:
        severity = Severity.INFO
    reasons = ", ".join(gpu.reasons) or "clock held down"
    ev: dict[str, Any] = {
        "rank": slow.rank,
        "local_rank": slow.local_rank,
        "node": slow.node,
        "gpu": gpu.index,
        "gpu_matched_by": gpu.how,
        "sm_clock_mhz": gpu.sm_clock_mhz,
        "others_sm_clock_mhz": reference,
        "clock_ratio": ratio,
        "throttled_share": gpu.throttled_share,
        "reasons": list(gpu.reasons),
        "others_wait_in_collectives_s": holdback,
        "others_wait_share": share,
        "others_wait_measured_by": "estimated: its GPU time per step × (1 − its clock / the "
        "others' median clock)",
    }
    return Finding(
        id="distributed.straggler.gpu",
        category=Category.THERMAL,
        severity=severity,
        title=(
            f"Rank {slow.rank} is a straggler: its GPU {gpu.index} runs at {ratio:.0%} of the "
            f"others' clock ({reasons})"
            + (f"; the others wait about {ms(holdback)} per step for it" if holdback else "")
        ),
        evidence={k: v for k, v in ev.items() if v is not None},
        fix=(
            f"Fix GPU {gpu.index}'s cooling or power limit (nvidia-smi -q -d "
            "TEMPERATURE,POWER,PERFORMANCE) or exclude it; every rank waits for the slowest "
            "at each all-reduce."
        ),
        impact=share,
        subject=f"rank{slow.rank}",
    )


def gpu_imbalance(view: RunView, rt: RankThresholds, stats: Sequence[RankStats]) -> list[Finding]:
    """The job's GPUs loaded unevenly (``gpu_capacity``)."""
    summary = {g.index: g for g in view.summary.gpus if g.utilization_mean_pct is not None}
    used = [i for i in view.job_gpu_indices if i in summary]
    if len(used) < 2:
        return []
    util = {i: summary[i].utilization_mean_pct or 0.0 for i in used}
    busiest = max(util, key=lambda i: util[i])
    idlest = min(util, key=lambda i: util[i])
    gap = util[busiest] - util[idlest]
    if gap < rt.imbalance_points or util[busiest] < rt.imbalance_busy_pct:
        return []
    by_gpu = {s.gpu.index: s.rank for s in stats if s.gpu is not None}
    ev: dict[str, Any] = {
        "utilization_pct": {str(i): round(u, 1) for i, u in sorted(util.items())},
        "busiest_gpu": busiest,
        "idlest_gpu": idlest,
        "gap_points": gap,
        "imbalance_points": rt.imbalance_points,
    }
    if busiest in by_gpu:
        ev["busiest_rank"] = by_gpu[busiest]
    if idlest in by_gpu:
        ev["idlest_rank"] = by_gpu[idlest]
    return [
        Finding(
            id="distributed.gpu_imbalance",
            category=Category.GPU_CAPACITY,
            severity=Severity.WARNING if gap >= 2 * rt.imbalance_points else Severity.INFO,
            title=(
                f"GPUs loaded unevenly: GPU {busiest} is {util[busiest]:.0f}% busy, GPU "
                f"{idlest} {util[idlest]:.0f}%"
            ),
            evidence=ev,
            fix=(
                "Give every rank the same work: equal batch sizes and sequence lengths per "
                "rank (DistributedSampler with drop_last=True, length-grouped batches), the "
                "same model shard sizes, and no extra work on rank 0 (logging, evaluation) "
                "inside the training loop."
            ),
            impact=None,
            subject=f"gpu{idlest}",
        )
    ]
