"""GPU memory pressure (``gpu_memory``): OOMs, allocator retries, memory near full.

One finding per run, the most serious: an out-of-memory error, else cache
flushes by the allocator (``num_alloc_retries`` growing), else reserved or
used memory at ``memory_near_full_share`` of the GPU.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.thresholds import GIB, Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.fixes import CUDA_OOM_FIX
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.faults import is_cuda_oom
from trainmedic.record.events import EventKind
from trainmedic.record.stats import weighted_quantile

FIX = CUDA_OOM_FIX

TF_FIX = (
    "Need less memory per step: a smaller batch (dataset.batch(N)), the mixed_bfloat16 "
    "policy (keras.mixed_precision.set_global_policy('mixed_bfloat16'), mixed_float16 "
    "before Ampere), recomputed activations (tf.recompute_grad on the largest blocks). "
    "After an out-of-memory restart trainmedic sets TRAINMEDIC_MICRO_BATCH_DIVISOR: read "
    "it with trainmedic.micro_batch_plan(batch_size) to build the smaller batch."
)
"""The same advice in TensorFlow's words."""


def _fix(view: RunView) -> str:
    return TF_FIX if view.framework == "tensorflow" else FIX


def memory_pressure(view: RunView, th: Thresholds) -> list[Finding]:
    ev = _capacity_evidence(view)
    oom = _oom(view, ev)
    if oom is not None:
        return [oom]
    retries = _retries(view, ev)
    if retries is not None:
        return [retries]
    share = ev.get("memory_peak_share")
    if isinstance(share, float) and share >= th.memory_near_full_share:
        ev["memory_near_full_share"] = th.memory_near_full_share
        return [
            Finding(
                id="memory.near_capacity",
                category=Category.GPU_MEMORY,
                severity=Severity.WARNING,
                title=f"GPU memory {share:.0%} full: one larger batch or sequence from an OOM",
                evidence=ev,
                fix=_fix(view),
                impact=None,
                subject=ev.get("gpu"),
            )
        ]
    return []


def _oom(view: RunView, ev: dict[str, Any]) -> Finding | None:
    by_pid: dict[int, int] = {}
    first_step: int | None = None
    for s in sorted(view.record.steps, key=lambda s: s.t):
        if s.ooms:
            by_pid[s.pid] = max(by_pid.get(s.pid, 0), s.ooms)
            if first_step is None:
                first_step = s.step
    events = [
        e
        for e in view.record.events
        if e.kind == EventKind.OOM or (e.kind == EventKind.EXCEPTION and is_cuda_oom(e.message))
    ]
    count = max(sum(by_pid.values()), len(events))
    if count == 0:
        return None
    ev = dict(ev, ooms=count, oom_events=len(events))
    if first_step is not None:
        ev["first_oom_step"] = first_step
    return Finding(
        id="memory.oom",
        category=Category.GPU_MEMORY,
        severity=Severity.ERROR,
        title=f"The job ran out of GPU memory ({count} time{'s' if count > 1 else ''})",
        evidence=ev,
        fix=_fix(view),
        impact=None,
        subject=ev.get("gpu"),
    )


def _retries(view: RunView, ev: dict[str, Any]) -> Finding | None:
    """Steps in which ``num_alloc_retries`` grew: each paid a cache flush and a sync."""
    last: dict[int, int] = {}
    hit_steps: list[int] = []
    hit_durations: list[float] = []
    growth = 0
    steady_ids = {id(s) for s in view.steady_steps}
    for s in sorted(view.record.steps, key=lambda s: (s.pid, s.step)):
        if s.alloc_retries is None or s.phase != "train":
            continue
        before = last.get(s.pid)
        last[s.pid] = s.alloc_retries
        if before is not None and s.alloc_retries > before and id(s) in steady_ids:
            growth += s.alloc_retries - before
            hit_steps.append(s.step)
            hit_durations.append(s.duration_s)
    if growth == 0:
        return None
    median = weighted_quantile([(s.mean_duration_s, s.count) for s in view.steady], 0.5) or 0.0
    extra = sum(max(0.0, d - median) for d in hit_durations)
    impact = min(1.0, extra / view.steady_time_s) if view.steady_time_s > 0 else None
    ev = dict(
        ev,
        alloc_retries_added=growth,
        steps_with_retries=len(hit_steps),
        steps_with_retries_first=hit_steps[:10],
        retry_time_lost_s=extra,
    )
    return Finding(
        id="memory.alloc_retries",
        category=Category.GPU_MEMORY,
        severity=Severity.WARNING,
        title=(
            f"The CUDA allocator flushed its cache in {len(hit_steps)} steps: GPU memory "
            "is too tight"
        ),
        evidence=ev,
        fix=_fix(view),
        impact=impact,
        subject=ev.get("gpu"),
    )


def _capacity_evidence(view: RunView) -> dict[str, Any]:
    """Reserved and used memory against the GPU's total, on the fullest job GPU."""
    best: dict[str, Any] = {}
    for index in view.job_gpu_indices:
        series = view.gpu_series(index, steady_only=False)
        totals = [g.memory_total_bytes for g in series if g.memory_total_bytes]
        if not totals:
            continue
        total = max(totals)
        pids = {p.pid for g in series for p in g.processes} & view.pids
        if not pids and len(view.job_gpu_indices) == 1:
            pids = set(view.pids) | {s.pid for s in view.record.steps}
        reserved = max(
            (
                s.reserved_peak_bytes
                for s in view.record.steps
                if s.pid in pids and s.reserved_peak_bytes is not None
            ),
            default=None,
        )
        used = max(
            (g.memory_used_bytes for g in series if g.memory_used_bytes is not None), default=None
        )
        pool = view.tf_pool_peak_bytes if view.tf_preallocates else None
        if pool is not None:
            # The GPU shows TensorFlow's pool, taken whole at start: what the job uses
            # is what the pool handed out at its peak.
            used = pool
        peak = max(x for x in (reserved, used, 0) if x is not None)
        share = peak / total
        if not best or share > best["memory_peak_share"]:
            best = {
                "gpu": f"gpu{index}",
                "memory_total_gib": total / GIB,
                "memory_peak_share": share,
            }
            if reserved is not None:
                best["reserved_peak_gib"] = reserved / GIB
            if pool is not None:
                best["tf_pool_peak_gib"] = pool / GIB
            elif used is not None:
                best["memory_used_max_gib"] = used / GIB
    if not best:
        reserved_all = [s.reserved_peak_bytes for s in view.record.steps if s.reserved_peak_bytes]
        if reserved_all:
            best["reserved_peak_gib"] = max(reserved_all) / GIB
    return best
