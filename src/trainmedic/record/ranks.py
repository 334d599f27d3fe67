"""Per-rank statistics of a distributed run: who is who, and each rank's figures.

A run under torchrun holds one training process per rank (and DataLoader
workers that inherit the rank). :func:`rank_table` tells, for every pid, its
rank, local rank and node (from the probes' hellos, recorded as
``process_start`` events, and the ranks step records carry);
:func:`rank_stats` gives each rank's figures over the steady part of the run
(the same warm-up rules as :mod:`trainmedic.record.stats`); and
:func:`aligned_steps` pairs the steps the ranks made in lockstep, so rules
can compare one step of every rank with the same step of the others.

Pure functions of a :class:`~trainmedic.record.types.RunRecord`, like
:mod:`trainmedic.record.stats`, which they build on.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample
from trainmedic.record.payloads import process_starts
from trainmedic.record.stats import StepSplit, readings_in, steady_interval, weighted_quantile
from trainmedic.record.types import RunRecord, StepRecord

PAIR_TOLERANCE_STEPS = 2.0
"""Two ranks' steps with the same number pair up when they end within this many
median step times of each other (and within :data:`PAIR_TOLERANCE_MIN_S`)."""
PAIR_TOLERANCE_MIN_S = 1.0


@dataclass(frozen=True)
class RankInfo:
    """Where a process of a distributed job runs.

    Attributes:
        rank: global rank (``RANK``).
        local_rank: rank on its node (``LOCAL_RANK``), when known.
        node: the node's host name, when known.
        node_rank: torchrun's node rank (``GROUP_RANK``), when known.
        role: ``process`` for a rank's training process, ``worker`` for a DataLoader worker.
    """

    rank: int
    local_rank: int | None = None
    node: str | None = None
    node_rank: int | None = None
    role: str = "process"


@dataclass(frozen=True)
class RankStats:
    """One rank over the steady part of the run (times are means per steady step).

    Attributes:
        pids: its training processes (one per attempt).
        steps: steady train steps.
        step_time_s / step_time_median_s: mean and median step time, seconds.
        data_wait_s / compute_s / gpu_time_s: seconds per step (``None``: not measured).
        other_s: step time outside data wait and compute (logging, host syncs), seconds.
        data_wait_share / compute_share: of its step time, 0..1.
        samples_per_step / samples_per_s: its own batches, when known.
        gpu: its GPU's figures (:class:`RankGpu`), when one can be told.
    """

    rank: int
    local_rank: int | None
    node: str | None
    pids: tuple[int, ...]
    steps: int
    step_time_s: float | None
    step_time_median_s: float | None
    data_wait_s: float | None
    compute_s: float | None
    gpu_time_s: float | None
    other_s: float | None
    data_wait_share: float | None
    compute_share: float | None
    samples_per_step: float | None
    samples_per_s: float | None
    gpu: RankGpu | None = None

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "node": self.node,
            "pids": list(self.pids),
            "steps": self.steps,
            "step_time_s": self.step_time_s,
            "step_time_median_s": self.step_time_median_s,
            "data_wait_s": self.data_wait_s,
            "compute_s": self.compute_s,
            "gpu_time_s": self.gpu_time_s,
            "other_s": self.other_s,
            "data_wait_share": self.data_wait_share,
            "compute_share": self.compute_share,
            "samples_per_step": self.samples_per_step,
            "samples_per_s": self.samples_per_s,
        }
        if self.gpu is not None:
            data["gpu"] = self.gpu.to_dict()
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in data.items()}


@dataclass(frozen=True)
class RankGpu:
    """The GPU a rank runs on, over the steady part.

    Attributes:
        index: its index in the record (``GpuSample.index``).
        how: how the rank was matched to it: ``process list`` (NVML lists the
            rank's pid on it) or ``local rank`` (torchrun's one process per GPU).
        utilization_pct / sm_clock_mhz: means over the readings.
        throttled_share: share of readings with an active slowdown reason
            (:func:`trainmedic.gpu.faults.active_reasons`), 0..1.
        reasons: names of the slowdown reasons seen.
    """

    index: int
    how: str
    utilization_pct: float | None
    sm_clock_mhz: float | None
    throttled_share: float | None
    reasons: tuple[str, ...] = ()
    samples: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "matched_by": self.how,
            "utilization_pct": _r(self.utilization_pct),
            "sm_clock_mhz": _r(self.sm_clock_mhz),
            "throttled_share": _r(self.throttled_share),
            "reasons": list(self.reasons),
            "samples": self.samples,
        }


def rank_table(record: RunRecord) -> dict[int, RankInfo]:
    """pid -> :class:`RankInfo` for every process with a rank (training processes
    and DataLoader workers); the node comes from the hello, else the run's host."""
    host = record.meta.environment.get("host")
    default_node = host.get("hostname") if isinstance(host, Mapping) else None
    node_default = record.meta.environment.get("node")
    if isinstance(node_default, Mapping) and isinstance(node_default.get("hostname"), str):
        default_node = node_default["hostname"]
    table: dict[int, RankInfo] = {}
    for e, p in process_starts(record.events):
        if e.pid is None or p.rank is None:
            continue
        table[e.pid] = RankInfo(
            rank=p.rank,
            local_rank=p.local_rank,
            node=p.node if p.node is not None else default_node,
            node_rank=p.node_rank,
            role=p.role,
        )
    for s in record.steps:
        if s.rank is not None and s.pid not in table:
            table[s.pid] = RankInfo(rank=s.rank, node=default_node)
    return table


def ranks_of(record: RunRecord) -> dict[int, list[int]]:
    """rank -> its training pids (those that made steps), in pid order."""
    table = rank_table(record)
    stepping = {s.pid for s in record.steps} | {w.pid for w in record.windows}
    out: dict[int, list[int]] = {}
    for pid in sorted(stepping):
        info = table.get(pid)
        if info is not None:
            out.setdefault(info.rank, []).append(pid)
    return out


def rank_stats(record: RunRecord, split: StepSplit) -> list[RankStats]:
    """Each rank's figures over the steady steps of ``split``, by rank; empty for a
    run with fewer than two ranks."""
    table = rank_table(record)
    by_rank = ranks_of(record)
    if len(by_rank) < 2:
        return []
    gpus = rank_gpus(record, split, table)
    out = []
    for rank in sorted(by_rank):
        pids = set(by_rank[rank])
        spans = [s for s in split.steady if s.pid in pids]
        n = sum(s.count for s in spans)
        total = sum(s.duration_s for s in spans)
        infos = [table[p] for p in sorted(pids) if p in table]
        info = infos[-1] if infos else RankInfo(rank)

        def per_step(values: Iterable[float | None], count: int) -> float | None:
            known = [v for v in values if v is not None]
            return sum(known) / count if known and count else None

        wait = per_step((s.data_wait_s for s in spans), n)
        compute_n = sum(s.compute_count for s in spans if s.compute_s is not None)
        compute = per_step((s.compute_s for s in spans), compute_n)
        gpu_n = sum(s.gpu_count for s in spans if s.gpu_time_s is not None)
        gpu_time = per_step((s.gpu_time_s for s in spans), gpu_n)
        step_time = total / n if n else None
        samples_n = sum(s.count for s in spans if s.samples is not None)
        samples = per_step((s.samples for s in spans), samples_n)
        other = None
        if step_time is not None and wait is not None and compute is not None:
            other = max(0.0, step_time - wait - compute)
        out.append(
            RankStats(
                rank=rank,
                local_rank=info.local_rank,
                node=info.node,
                pids=tuple(sorted(pids)),
                steps=n,
                step_time_s=step_time,
                step_time_median_s=weighted_quantile(
                    [(s.mean_duration_s, s.count) for s in spans], 0.5
                ),
                data_wait_s=wait,
                compute_s=compute,
                gpu_time_s=gpu_time,
                other_s=other,
                data_wait_share=wait / step_time if wait is not None and step_time else None,
                compute_share=compute / step_time
                if compute is not None and step_time
                else None,
                samples_per_step=samples,
                samples_per_s=samples / step_time if samples is not None and step_time else None,
                gpu=gpus.get(rank),
            )
        )
    return out


def rank_gpus(
    record: RunRecord, split: StepSplit, table: Mapping[int, RankInfo] | None = None
) -> dict[int, RankGpu]:
    """rank -> the GPU it runs on, with its figures over the steady part.

    Matched by NVML's process lists (the rank's pid on a GPU); else, when every
    GPU's list is unreadable or empty, by local rank = GPU index (torchrun's one
    process per GPU), only when there are at least as many GPUs as local ranks
    and the run has one node (a merged record's GPUs are numbered per node).
    """
    table = rank_table(record) if table is None else table
    if not record.gpu:
        return {}
    window = steady_interval(split)
    by_index: dict[int, list[GpuSample]] = {}
    for g in readings_in(record.gpu, window, lambda g: g.timestamp):
        by_index.setdefault(g.index, []).append(g)
    matched: dict[int, tuple[int, str]] = {}
    for index, samples in by_index.items():
        for g in samples:
            for p in g.processes:
                info = table.get(p.pid)
                if info is not None and info.role != "worker":
                    matched.setdefault(info.rank, (index, "process list"))
    if not matched:
        mains = {i.rank: i for i in table.values() if i.role != "worker"}
        nodes = {i.node for i in mains.values()}
        local = {r: i.local_rank for r, i in mains.items() if i.local_rank is not None}
        if local and len(nodes) <= 1 and max(local.values()) < len(by_index):
            indices = sorted(by_index)
            matched = {r: (indices[lr], "local rank") for r, lr in local.items()}
    out = {}
    for rank, (index, how) in matched.items():
        samples = by_index.get(index, [])
        util = [g.utilization_gpu_pct for g in samples if g.utilization_gpu_pct is not None]
        clocks = [g.sm_clock_mhz for g in samples if g.sm_clock_mhz is not None]
        known = [g for g in samples if g.clock_event_reasons is not None]
        active = [faults.active_reasons(g) for g in known]
        throttled = sum(1 for a in active if a)
        names: set[str] = set()
        for a in active:
            names.update(faults.rule_keys(a))
        out[rank] = RankGpu(
            index=index,
            how=how,
            utilization_pct=statistics.fmean(util) if util else None,
            sm_clock_mhz=statistics.fmean(clocks) if clocks else None,
            throttled_share=throttled / len(known) if known else None,
            reasons=tuple(sorted(names)),
            samples=len(samples),
        )
    return out


@dataclass(frozen=True)
class AlignedStep:
    """One step of every rank, made in lockstep (steps with the same number that
    ended at about the same time): rank -> its step record."""

    step: int
    by_rank: Mapping[int, StepRecord]


def aligned_steps(record: RunRecord, split: StepSplit) -> list[AlignedStep]:
    """Steady exact train steps of every rank, paired by step number and end time.

    The lowest rank is the reference; another rank's step with the same number
    pairs with it when their ends are within ``PAIR_TOLERANCE_STEPS`` median
    step times (at least :data:`PAIR_TOLERANCE_MIN_S`): the same iteration
    of the same attempt. Only steps every rank has are returned.
    """
    table = rank_table(record)
    steady = [s.step for s in split.steady if s.step is not None]
    by_rank: dict[int, dict[int, list[StepRecord]]] = {}
    for s in steady:
        info = table.get(s.pid)
        rank = s.rank if s.rank is not None else (info.rank if info is not None else None)
        if rank is None:
            continue
        by_rank.setdefault(rank, {}).setdefault(s.step, []).append(s)
    if len(by_rank) < 2:
        return []
    durations = sorted(s.duration_s for s in steady)
    median = durations[len(durations) // 2] if durations else 0.0
    tolerance = max(PAIR_TOLERANCE_MIN_S, PAIR_TOLERANCE_STEPS * median)
    reference = min(by_rank)
    others = sorted(r for r in by_rank if r != reference)
    ends = {
        r: {k: (sorted(v, key=lambda s: s.t), [s.t for s in sorted(v, key=lambda s: s.t)])
            for k, v in steps.items()}
        for r, steps in by_rank.items()
    }  # fmt: skip
    out = []
    for number, refs in sorted(by_rank[reference].items()):
        for ref in refs:
            row = {reference: ref}
            for r in others:
                found = ends[r].get(number)
                match = _nearest(found, ref.t) if found is not None else None
                if match is None or abs(match.t - ref.t) > tolerance:
                    break
                row[r] = match
            else:
                out.append(AlignedStep(number, row))
    out.sort(key=lambda a: a.by_rank[reference].t)
    return out


def _nearest(
    found: tuple[list[StepRecord], list[float]], t: float
) -> StepRecord | None:
    steps, times = found
    if not steps:
        return None
    i = bisect.bisect_left(times, t)
    candidates = [steps[j] for j in (i - 1, i) if 0 <= j < len(steps)]
    return min(candidates, key=lambda s: abs(s.t - t))


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


__all__ = [
    "AlignedStep",
    "RankGpu",
    "RankInfo",
    "RankStats",
    "aligned_steps",
    "median_or_none",
    "rank_gpus",
    "rank_stats",
    "rank_table",
    "ranks_of",
]
