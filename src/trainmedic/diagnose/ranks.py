"""Distributed runs: stragglers, GPU load imbalance, collective timeouts.

Ranks of a data-parallel job move in lockstep: every step ends in collectives
(DDP's gradient all-reduce) that no rank leaves before the last one arrives.
A rank that is slower at something of its own — its data, its GPU — makes
every other rank wait for it in those collectives, every step. The others'
step time then equals the straggler's, so pooled figures hide it; comparing
the ranks step by step shows it (docs/diagnosis.md, "Distributed runs").

**How the wait is measured.** The time the others spend waiting in
collectives is *inferred* from the steps the ranks made in lockstep
(:func:`trainmedic.record.ranks.aligned_steps`): in one step, a rank that
waited ``w_s`` for its own batch while another waited ``w_r`` holds that
other back by ``w_s - w_r`` — the other finished its own part that much
earlier and sat in the all-reduce meanwhile. Data wait is the right part to
compare because it is never a wait on peers (it is measured inside the
DataLoader, or as host time outside forward/backward/optimizer). On CPU
(gloo) DDP's all-reduce waits inside ``backward``, so the others' compute
time exceeds the straggler's by about the same amount: reported as
``others_wait_in_backward_s``, a second reading of the same wait. Without a
DataLoader, host time outside forward/backward/optimizer may itself be a wait
on the peers (an ``all_reduce`` of metrics), so the rank's own stacks between
steps must show it preparing data. Python-level collectives and DDP's C++
reducer are not wrapped by the probe: wrapping would cost every job and
still miss the reducer's waits, which run inside the autograd engine.

A GPU that holds its clock down (heat, power) makes its rank the straggler
with no difference in data wait; its rank is named from its clock and
slowdown reasons, and the wait it costs the others is estimated from the
clock ratio. GPUs loaded unevenly without such a cause are reported as load
imbalance (``gpu_capacity``).

Every distributed run also gets the collective timeout and watchdog
settings that fit its observed step and phase times (``timeout``, info).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.input_causes import input_cause
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import BUSY_STATES, RunView, share_of
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.ranks import (
    AlignedStep,
    RankStats,
    aligned_steps,
    rank_stats,
    rank_table,
)
from trainmedic.record.types import RunRecord
from trainmedic.resilience.timeouts import TimeoutConfig


@dataclass(frozen=True)
class RankThresholds:
    """Limits of the distributed rules (reasons in docs/diagnosis.md).

    Attributes:
        min_aligned_steps: fewer lockstep steps than this and no straggler is judged.
        holdback_info_share / holdback_warning_share / holdback_error_share: the
            others' wait for the straggler, as a share of step time, for an info /
            a warning / an error.
        holdback_min_s: nor below this many seconds per step (timer noise).
        slowest_share: the straggler must be the slowest rank in at least this
            share of the lockstep steps (noise makes a different rank slowest
            each step).
        lockstep_tolerance: ranks whose steps differ by more than this share of
            the step time (median over steps) do not wait for each other.
        corroboration: without a DataLoader, the straggler's stacks between steps
            must show it preparing data (reading, receiving, transforming) in at
            least this share of the samples.
        clock_slow_ratio: a GPU clocked at or under this share of the other
            GPUs' median is slow.
        throttled_min_share: ... and held down by a slowdown reason in at least
            this share of its readings.
        imbalance_points: GPUs whose mean utilization differs by this many
            percentage points are unevenly loaded ...
        imbalance_busy_pct: ... when the busiest is at least this busy.
        uneven_samples_share: ranks whose mean samples per step differ by more than
            this share get uneven batches.
        timeout_factor / timeout_min_s: the recommended collective timeout is
            this many times the longest legitimate gap between collectives, and
            at least this many seconds.
    """

    min_aligned_steps: int = 20
    holdback_info_share: float = 0.10
    holdback_warning_share: float = 0.20
    holdback_error_share: float = 0.50
    holdback_min_s: float = 0.0005
    slowest_share: float = 0.75
    lockstep_tolerance: float = 0.25
    corroboration: float = 0.5
    clock_slow_ratio: float = 0.90
    throttled_min_share: float = 0.20
    imbalance_points: float = 25.0
    imbalance_busy_pct: float = 50.0
    uneven_samples_share: float = 0.10
    timeout_factor: float = 3.0
    timeout_min_s: float = 300.0


DEFAULT_RANK_THRESHOLDS = RankThresholds()
NCCL_DEFAULT_TIMEOUT_S = 600.0
GLOO_DEFAULT_TIMEOUT_S = 1800.0


def distributed(view: RunView, th: Thresholds) -> list[Finding]:
    """Every finding about the ranks of a distributed run (none for one rank)."""
    return distributed_findings(view, th, DEFAULT_RANK_THRESHOLDS)


def distributed_findings(view: RunView, th: Thresholds, rt: RankThresholds) -> list[Finding]:
    stats = rank_stats(view.record, view.split)
    if len(stats) < 2:
        return []
    findings: list[Finding] = []
    straggler = data_straggler(view, th, rt, stats) or gpu_straggler(view, rt, stats)
    if straggler is not None:
        findings.append(straggler)
    else:
        findings.extend(gpu_imbalance(view, rt, stats))
    findings.extend(uneven_batches(rt, stats))
    findings.extend(collective_timeout(view, rt, stats))
    return findings


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


# --- the data straggler ----------------------------------------------------------------------


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
                    statistics.median(v) <= rt.lockstep_tolerance * step_s
                    for v in drift.values()
                ),
                step_s=step_s,
                steps=len(aligned),
            )
        )
    return out


def data_straggler(
    view: RunView, th: Thresholds, rt: RankThresholds, stats: Sequence[RankStats]
) -> Finding | None:
    """A rank whose own data wait holds the others back in lockstep (module docstring)."""
    aligned = aligned_steps(view.record, view.split)
    if len(aligned) < rt.min_aligned_steps:
        return None
    compared = compare_ranks(aligned, rt)
    best = max(compared, key=lambda h: h.excess_s)
    step = best.step_s
    if (
        step <= 0
        or not best.lockstep
        or best.slowest_share < rt.slowest_share
        or best.holdback_s < max(rt.holdback_min_s, rt.holdback_info_share * step)
    ):
        return None
    own = {s.rank: s for s in stats}[best.rank]
    pids = _pids_of_rank(view.record, best.rank)
    if not any(lo.pid in pids for lo in view.record.loaders) and not _prepares_data(
        view, th, rt, pids
    ):
        # Without a DataLoader, "data wait" is host time outside forward/backward/
        # optimizer, which may itself be a wait on the others (an all_reduce of
        # metrics, a barrier): the others' longer compute then means they compute
        # more, not that they wait. Only stacks showing the rank preparing data
        # (reading, receiving, transforming) make the difference its own.
        return None
    share = min(1.0, best.holdback_s / step)
    cause = _data_cause(view, th, pids, best.rank)
    others = [s for s in stats if s.rank != best.rank]
    severity = Severity.INFO
    if share >= rt.holdback_error_share:
        severity = Severity.ERROR
    elif share >= rt.holdback_warning_share:
        severity = Severity.WARNING
    n_others = len(others)
    ev: dict[str, Any] = {
        "rank": best.rank,
        "local_rank": own.local_rank,
        "node": own.node,
        "pids": list(own.pids),
        "straggler_data_wait_s": own.data_wait_s,
        "others_data_wait_s": _mean(s.data_wait_s for s in others),
        "others_wait_in_collectives_s": best.holdback_s,
        "others_wait_share": share,
        "others_wait_measured_by": "lockstep steps: the straggler's data wait minus each "
        "other rank's, step by step (median), averaged over the others",
        "step_time_s": step,
        "lockstep_steps": best.steps,
        "slowest_in_share_of_steps": best.slowest_share,
        "cause_category": cause[0].value,
    }
    if best.backward_wait_s is not None:
        ev["others_wait_in_backward_s"] = best.backward_wait_s
    ev.update(cause[3])
    ev = {k: v for k, v in ev.items() if v is not None}
    where = f" on {own.node}" if own.node and _nodes(stats) > 1 else ""
    title = (
        f"Rank {best.rank}{where} is a straggler: its data is slower ({cause[1]}); the other "
        f"{_ranks_word(n_others)} {'waits' if n_others == 1 else 'wait'} "
        f"{_ms(best.holdback_s)} per step for it in collectives "
        f"({share:.0%} of the {_ms(step)} step)"
    )
    fix = (
        f"Make rank {best.rank}'s data as fast as the others': {cause[2]} Every rank waits "
        "for the slowest one at each all-reduce, so the whole job runs at its pace."
    )
    return Finding(
        id="distributed.straggler.data",
        category=cause[0],
        severity=severity,
        title=title,
        evidence=ev,
        fix=fix,
        impact=share,
        subject=f"rank{best.rank}",
    )


def _data_cause(
    view: RunView, th: Thresholds, pids: frozenset[int], rank: int
) -> tuple[Category, str, str, dict[str, Any]]:
    """Why the rank's data is slower: its loader's stacks first (files, sockets,
    transforms), then its node's load, then the input rule on its processes alone."""
    mine = _activity(view, pids)
    busy = sum(mine[k] for k in BUSY_STATES)
    shares = {k: share_of(mine, k, BUSY_STATES) for k in BUSY_STATES}
    ev: dict[str, Any] = {}
    if busy:
        ev.update({f"loader_{k}_share": round(v, 4) for k, v in shares.items()})
        ev["loader_stack_samples"] = busy
    dominant = None
    if busy >= th.activity_min_samples:
        top = max(BUSY_STATES, key=lambda k: shares[k])
        if shares[top] >= th.activity_dominant_share:
            dominant = top
    if dominant == "file_read":
        return (
            Category.IO,
            "its loader spends its time reading files",
            "copy its data to local SSD or /dev/shm, or check its node's storage "
            "(trainmedic doctor on that node measures it); more DataLoader workers overlap "
            "the reads.",
            ev,
        )
    if dominant == "socket_wait":
        return (
            Category.NETWORK,
            "its loader spends its time waiting on network sockets",
            "cache its shard locally before training, or move it next to the node; "
            "prefetch more batches (prefetch_factor=4+) with more workers.",
            ev,
        )
    node = _node_load(view, rank)
    if node is not None:
        ev.update(node)
        return (
            Category.CONTENTION,
            f"its node {node['node']} is busier: other processes use "
            f"{node['node_others_cpu_cores']:.1f} cores there",
            "give its node's CPUs to the job (stop or move the other processes), or "
            "exclude the node.",
            ev,
        )
    if dominant == "transform":
        return (
            Category.CPU,
            "its samples take more CPU to prepare (its loader runs transforms)",
            "make its samples cheaper (pre-process its shard once, decode on the GPU), "
            "balance the expensive samples across ranks, or give its loader more "
            "workers.",
            ev,
        )
    sub = _sub_view(view, pids)
    cause = input_cause(sub, th)
    ev.update({k: v for k, v in cause.evidence.items() if k not in ev})
    return (cause.category, cause.title, cause.fix, ev)


def _prepares_data(
    view: RunView, th: Thresholds, rt: RankThresholds, pids: frozenset[int]
) -> bool:
    """The rank's stacks between steps were mostly preparing data."""
    mine = _activity(view, pids)
    total = sum(mine.values())
    busy = sum(mine[k] for k in ("transform", "file_read", "socket_wait"))
    return total >= th.activity_min_samples and busy >= rt.corroboration * total


def _activity(view: RunView, pids: frozenset[int]) -> Counter[str]:
    total: Counter[str] = Counter()
    for a in view.record.loader_activity:
        if a.pid in pids:
            total.update({k: v for k, v in a.counts.items() if v > 0})
    return total


def _sub_view(view: RunView, pids: frozenset[int]) -> RunView:
    """The run as one rank's processes saw it (host and GPU readings kept whole)."""
    r = view.record
    record = RunRecord(
        meta=r.meta,
        steps=[s for s in r.steps if s.pid in pids],
        windows=[w for w in r.windows if w.pid in pids],
        loaders=[lo for lo in r.loaders if lo.pid in pids],
        loader_activity=[a for a in r.loader_activity if a.pid in pids],
        gpu=r.gpu,
        host=r.host,
        events=r.events,
    )
    return RunView.of(record, view.machine)


def _pids_of_rank(record: RunRecord, rank: int) -> frozenset[int]:
    """The rank's training processes and its DataLoader workers."""
    table = rank_table(record)
    pids = {pid for pid, info in table.items() if info.rank == rank}
    pids |= {s.pid for s in record.steps if s.rank == rank}
    return frozenset(pids)


def _node_load(view: RunView, rank: int) -> dict[str, Any] | None:
    """The rank's node, when a merged record shows it much busier than the others."""
    nodes = view.record.meta.environment.get("nodes")
    if not isinstance(nodes, list) or len(nodes) < 2:
        return None
    info = next((i for i in rank_table(view.record).values() if i.rank == rank), None)
    if info is None or info.node is None:
        return None
    load: dict[object, float] = {
        n.get("hostname"): float(n["others_cpu_mean_cores"])
        for n in nodes
        if isinstance(n, Mapping) and isinstance(n.get("others_cpu_mean_cores"), (int, float))
    }
    mine = load.get(info.node)
    rest = [v for k, v in load.items() if k != info.node]
    if mine is None or not rest or mine < 1.0 or mine < 2.0 * max(rest):
        return None
    return {"node": info.node, "node_others_cpu_cores": mine, "other_nodes_cpu_cores": max(rest)}


# --- the GPU straggler and GPU load imbalance --------------------------------------------------


def gpu_straggler(
    view: RunView, rt: RankThresholds, stats: Sequence[RankStats]
) -> Finding | None:
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
            + (f"; the others wait about {_ms(holdback)} per step for it" if holdback else "")
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


def gpu_imbalance(
    view: RunView, rt: RankThresholds, stats: Sequence[RankStats]
) -> list[Finding]:
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


# --- collective timeouts ------------------------------------------------------------------------


def collective_timeout(
    view: RunView, rt: RankThresholds, stats: Sequence[RankStats]
) -> list[Finding]:
    """The collective timeout and watchdog settings that fit this run's step and
    phase times (info)."""
    spans = list(view.split.steady) + list(view.split.warmup) + list(view.split.other_phases)
    if not spans:
        return []
    longest_step = max((s.duration_max_s for s in view.split.steady), default=0.0)
    warmup = max((s.duration_max_s for s in view.split.warmup), default=0.0)
    phases = [s for s in view.split.other_phases if s.step is not None]
    longest_phase = max(phases, key=lambda s: s.duration_s, default=None)
    phase_s = longest_phase.duration_s if longest_phase is not None else 0.0
    longest = max(longest_step, warmup, phase_s)
    recommended = max(rt.timeout_min_s, _nice(rt.timeout_factor * longest))
    p99 = view.summary.step_time_p99_s or longest_step
    config = TimeoutConfig()
    bound = max(config.floor_s, config.safety_factor * p99)
    ev: dict[str, Any] = {
        "ranks": len(stats),
        "longest_step_s": longest_step,
        "longest_warmup_step_s": warmup,
        "longest_phase_s": phase_s,
        "longest_phase": longest_phase.phase if longest_phase is not None else None,
        "step_time_p99_s": p99,
        "recommended_collective_timeout_s": recommended,
        "nccl_default_timeout_s": NCCL_DEFAULT_TIMEOUT_S,
        "gloo_default_timeout_s": GLOO_DEFAULT_TIMEOUT_S,
        "trainmedic_hang_bound_s": bound,
    }
    seconds = int(recommended)
    return [
        Finding(
            id="distributed.collective_timeout",
            category=Category.TIMEOUT,
            severity=Severity.INFO,
            title=(
                f"Collective timeout to fit this run: {seconds} s (the longest gap between "
                f"collectives was {_ms(longest)}; NCCL waits {NCCL_DEFAULT_TIMEOUT_S:.0f} s and "
                f"gloo {GLOO_DEFAULT_TIMEOUT_S:.0f} s by default)"
            ),
            evidence={k: v for k, v in ev.items() if v is not None},
            fix=(
                f"dist.init_process_group(backend, timeout=datetime.timedelta(seconds={seconds}))"
                f" — {rt.timeout_factor:g}× the longest step or phase seen, so a slow checkpoint "
                "or evaluation never times out, while a real hang ends the processes instead of "
                f"waiting the default; with NCCL also TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (a timed-"
                "out collective ends the process; never 0), TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="
                f"{seconds + 60} (above the collective timeout) and TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                "(the flight recorder's trace of the last collectives). trainmedic's watchdog "
                f"stops a hung group after about {bound:.0f} s here (--timeout-floor sets its "
                "minimum), with every rank's stacks, and restarts it."
            ),
            impact=None,
            subject="process_group",
        )
    ]


# --- helpers ------------------------------------------------------------------------------------


def _nice(seconds: float) -> float:
    """Round up to a number a person would write: 60, 120, 300, 600, 900, 1200, ..."""
    for value in (60, 120, 180, 300, 600, 900, 1200, 1800, 2700, 3600):
        if seconds <= value:
            return float(value)
    return float(math.ceil(seconds / 1800.0) * 1800)


def _mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _ranks_word(n: int) -> str:
    return "rank" if n == 1 else f"{n} ranks"


def _nodes(stats: Sequence[RankStats]) -> int:
    return len({s.node for s in stats})


__all__ = [
    "DEFAULT_RANK_THRESHOLDS",
    "Holdback",
    "RankThresholds",
    "collective_timeout",
    "compare_ranks",
    "data_straggler",
    "distributed",
    "distributed_findings",
    "gpu_imbalance",
    "gpu_straggler",
    "uneven_batches",
]
