"""Whole-run statistics of a :class:`RunRecord`: step times, shares, rates, GPU and host means.

:func:`summarize` is pure and cheap; the live view, the terminal summary, the
HTML report and diagnosis all read the same :class:`RunSummary`.

Definitions (docs/diagnosis.md, "Run statistics"):

* Only ``train``-phase steps count as training steps; evaluation and
  checkpoint steps are counted per phase but kept out of step-time statistics.
* Warm-up and folded steps: :mod:`trainmedic.record.spans`.
* Shares are time-weighted: ``sum(data_wait) / sum(duration)`` over steady steps.
* ``steps_per_s`` is per process (a DDP job's iterations per second):
  ``sum(steps) / sum(durations)``. ``samples_per_s`` is for the whole job:
  samples of all processes over the wall time their steady parts cover.
* GPU and host means cover the steady part's time span (all samples when the
  run has no steady steps, or none fall inside it).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind
from trainmedic.record.payloads import process_starts
from trainmedic.record.spans import (
    TRAIN_PHASE,
    StepSpan,
    StepSplit,
    all_spans,
    known_share,
    merge_intervals,
    split_steps,
    steady_interval,
    warmup_length,
    weighted_quantile,
)
from trainmedic.record.types import RunRecord

T = TypeVar("T")

#: a GPU at most this busy and holding at most this memory runs no CUDA context.
UNUSED_GPU_UTIL_PCT = 1.0
UNUSED_GPU_MEMORY_BYTES = 512 << 20


@dataclass(frozen=True)
class GpuSummary:
    """One GPU over the steady part of the run.

    Attributes:
        used_by_job: a job process appeared in its process list; ``None`` when
            no process list was readable.
        looks_unused: every reading shows no CUDA context (:func:`looks_unused`).
    """

    index: int
    name: str
    samples: int
    utilization_mean_pct: float | None
    utilization_p10_pct: float | None
    memory_used_mean_bytes: float | None
    memory_used_max_bytes: int | None
    memory_total_bytes: int | None
    temperature_max_c: float | None
    power_mean_w: float | None
    sm_clock_mean_mhz: float | None
    used_by_job: bool | None
    looks_unused: bool = False


@dataclass(frozen=True)
class RunSummary:
    """Whole-run statistics; ``None`` means "not measured", never zero.

    Attributes:
        steps_total: steps of every phase, exact plus folded.
        steps_exact / steps_folded: of those, kept exactly / folded into windows.
        steps_by_phase: phase -> steps.
        steps_train / steps_warmup / steps_steady: train steps, the warm-up steps
            dropped from them, and the rest (what statistics below describe).
        processes / ranks: distinct pids with steps; distinct distributed ranks.
        wall_s: whole run, from start to end (or to the last reading), seconds.
        steady_wall_s: wall time the steady steps cover (union over processes), seconds.
        steady_start_t / steady_end_t: Unix seconds bounding the steady part.
        step_time_*_s: steady step durations, seconds.
        steps_per_s: steady steps per second of one process.
        samples_per_step_mean: per process and step, when known.
        samples_per_s: whole job, when samples are known.
        data_wait_share / compute_share / gpu_time_share: shares of steady step
            time, 0..1 (``None`` when not measured).
        gpus: per GPU; gpu_utilization_mean_pct: mean over the GPUs the job used;
            when no process list shows a job pid, over the GPUs that do not sit
            empty (all GPUs when every one does).
        job_cpu_mean_cores / job_cpu_p90_cores: the job's process tree, cores.
        usable_cores: cores the job may use (median of host samples).
        others_cpu_mean_cores: processes outside the job, cores.
    """

    steps_total: int = 0
    steps_exact: int = 0
    steps_folded: int = 0
    steps_by_phase: dict[str, int] = field(default_factory=dict)
    steps_train: int = 0
    steps_warmup: int = 0
    steps_steady: int = 0
    processes: int = 0
    ranks: int = 0
    wall_s: float | None = None
    steady_wall_s: float | None = None
    steady_start_t: float | None = None
    steady_end_t: float | None = None
    step_time_mean_s: float | None = None
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_p99_s: float | None = None
    step_time_max_s: float | None = None
    steps_per_s: float | None = None
    samples_per_step_mean: float | None = None
    samples_per_s: float | None = None
    data_wait_share: float | None = None
    compute_share: float | None = None
    gpu_time_share: float | None = None
    gpus: tuple[GpuSummary, ...] = ()
    gpu_utilization_mean_pct: float | None = None
    job_cpu_mean_cores: float | None = None
    job_cpu_p90_cores: float | None = None
    usable_cores: float | None = None
    others_cpu_mean_cores: float | None = None
    system_cpu_mean_pct: float | None = None
    iowait_mean_pct: float | None = None
    disk_read_mean_bytes_per_s: float | None = None
    net_recv_mean_bytes_per_s: float | None = None
    job_rss_max_bytes: int | None = None
    swap_used_max_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (floats rounded to 6 decimals)."""
        return _round(asdict(self))  # type: ignore[no-any-return]


def summarize(record: RunRecord) -> RunSummary:
    """Whole-run statistics of ``record`` (pure; an empty record gives zeros and ``None``)."""
    spans = all_spans(record)
    split = split_steps(spans)
    steady = split.steady
    exact = sum(1 for s in spans if s.step is not None)
    by_phase: dict[str, int] = {}
    for s in spans:
        by_phase[s.phase] = by_phase.get(s.phase, 0) + s.count
    train = sum(s.count for s in spans if s.phase == TRAIN_PHASE)
    warm = sum(s.count for s in split.warmup)
    n_steady = sum(s.count for s in steady)
    window = steady_interval(split)
    intervals = merge_intervals((s.t_start, s.t_end) for s in steady)
    steady_wall = sum(b - a for a, b in intervals) if intervals else None

    total_duration = sum(s.duration_s for s in steady)
    durations = [(s.mean_duration_s, s.count) for s in steady]
    pids = job_pids(record)
    gpus = _summarize_gpus(readings_in(record.gpu, window, lambda g: g.timestamp), pids)
    host = readings_in(record.host, window, lambda h: h.t)
    samples_per_step = _samples_per_step(steady)
    samples_per_s = None
    if samples_per_step is not None and steady_wall:
        samples_per_s = samples_per_step * n_steady / steady_wall

    return RunSummary(
        steps_total=sum(s.count for s in spans),
        steps_exact=exact,
        steps_folded=sum(s.count for s in spans if s.step is None),
        steps_by_phase=by_phase,
        steps_train=train,
        steps_warmup=warm,
        steps_steady=n_steady,
        processes=len({s.pid for s in spans}),
        ranks=len({s.step.rank for s in spans if s.step is not None and s.step.rank is not None}),
        wall_s=_wall_s(record),
        steady_wall_s=steady_wall,
        steady_start_t=window[0] if window else None,
        steady_end_t=window[1] if window else None,
        step_time_mean_s=total_duration / n_steady if n_steady else None,
        step_time_median_s=weighted_quantile(durations, 0.5),
        step_time_p90_s=weighted_quantile(durations, 0.9),
        step_time_p99_s=weighted_quantile(durations, 0.99),
        step_time_max_s=_max_duration(steady),
        steps_per_s=n_steady / total_duration if total_duration > 0 else None,
        samples_per_step_mean=samples_per_step,
        samples_per_s=samples_per_s,
        data_wait_share=_share(steady, lambda s: s.data_wait_s),
        compute_share=known_share(steady, "compute"),
        gpu_time_share=known_share(steady, "gpu"),
        gpus=gpus,
        gpu_utilization_mean_pct=_job_gpu_util(gpus),
        job_cpu_mean_cores=_mean(h.job_cpu_pct / 100.0 for h in host),
        job_cpu_p90_cores=_quantile([h.job_cpu_pct / 100.0 for h in host], 0.9),
        usable_cores=_median(h.usable_cores for h in host if h.usable_cores > 0),
        others_cpu_mean_cores=_mean(
            h.others_cpu_pct / 100.0 for h in host if h.others_cpu_pct is not None
        ),
        system_cpu_mean_pct=_mean(h.system_cpu_pct for h in host),
        iowait_mean_pct=_mean(h.iowait_pct for h in host if h.iowait_pct is not None),
        disk_read_mean_bytes_per_s=_mean(
            h.disk_read_bytes_per_s for h in host if h.disk_read_bytes_per_s is not None
        ),
        net_recv_mean_bytes_per_s=_mean(
            h.net_recv_bytes_per_s for h in host if h.net_recv_bytes_per_s is not None
        ),
        job_rss_max_bytes=max((h.job_rss_bytes for h in host), default=None),
        swap_used_max_bytes=max((h.swap_used_bytes for h in host), default=None),
    )


# --- building blocks shared with diagnosis -----------------------------------------------


def job_pids(record: RunRecord) -> frozenset[int]:
    """Process ids known to belong to the job: steps, loaders, activity, process starts."""
    pids = {s.pid for s in record.steps} | {w.pid for w in record.windows}
    pids |= {lo.pid for lo in record.loaders} | {a.pid for a in record.loader_activity}
    for e, p in process_starts(record.events):
        if e.kind == EventKind.PROCESS_START:
            pids |= {pid for pid in (e.pid, p.pid, p.ppid) if pid is not None}
    pids.discard(0)
    return frozenset(pids)


# --- helpers ------------------------------------------------------------------------------


def _share(spans: Sequence[StepSpan], part: Any) -> float | None:
    """sum(part) / sum(duration) over the spans where ``part`` is known."""
    num = den = 0.0
    for s in spans:
        value = part(s)
        if value is not None:
            num += value
            den += s.duration_s
    if den <= 0:
        return None
    return min(1.0, max(0.0, num / den))


def _samples_per_step(spans: Sequence[StepSpan]) -> float | None:
    known = [(s.samples, s.count) for s in spans if s.samples is not None]
    steps = sum(c for _, c in known)
    return sum(n for n, _ in known) / steps if steps else None


def _max_duration(spans: Sequence[StepSpan]) -> float | None:
    """Longest steady step (a window keeps its longest step's duration)."""
    return max((s.duration_max_s for s in spans), default=None)


def _wall_s(record: RunRecord) -> float | None:
    ends = [s.t for s in record.steps] + [w.t for w in record.windows]
    ends += [g.timestamp for g in record.gpu] + [h.t for h in record.host]
    ends += [e.t for e in record.events]
    end = record.meta.ended_at if record.meta.ended_at is not None else max(ends, default=None)
    if end is None:
        return None
    return max(0.0, end - record.meta.started_at)


def readings_in(
    items: Iterable[T], window: tuple[float, float] | None, when: Callable[[T], float]
) -> list[T]:
    """Readings describing time inside ``window``; all of them when none do (or no window).

    A reading at ``t`` averages the period since the one before, so it belongs
    to the window when ``start <= t < end + period``, ``period`` being the
    median gap between distinct reading times (one sampler's period).
    """
    items = sorted(items, key=when)
    if window is None:
        return items
    times = [when(x) for x in items]
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    period = gaps[len(gaps) // 2] if gaps else 0.0
    start, end = window
    inside = [x for x, t in zip(items, times, strict=True) if start <= t < end + period]
    return inside if inside else items


def _summarize_gpus(samples: Sequence[GpuSample], pids: frozenset[int]) -> tuple[GpuSummary, ...]:
    by_index: dict[int, list[GpuSample]] = {}
    for g in samples:
        by_index.setdefault(g.index, []).append(g)
    out = []
    for index in sorted(by_index):
        gs = by_index[index]
        util = [g.utilization_gpu_pct for g in gs if g.utilization_gpu_pct is not None]
        used = [g.memory_used_bytes for g in gs if g.memory_used_bytes is not None]
        totals = [g.memory_total_bytes for g in gs if g.memory_total_bytes is not None]
        listed = [g for g in gs if g.processes]
        used_by_job = any(p.pid in pids for g in listed for p in g.processes) if listed else None
        out.append(
            GpuSummary(
                index=index,
                name=gs[-1].name,
                samples=len(gs),
                utilization_mean_pct=_mean(util),
                utilization_p10_pct=_quantile(util, 0.1),
                memory_used_mean_bytes=_mean(used),
                memory_used_max_bytes=max(used, default=None),
                memory_total_bytes=max(totals, default=None),
                temperature_max_c=max(
                    (g.temperature_c for g in gs if g.temperature_c is not None), default=None
                ),
                power_mean_w=_mean(g.power_draw_w for g in gs if g.power_draw_w is not None),
                sm_clock_mean_mhz=_mean(g.sm_clock_mhz for g in gs if g.sm_clock_mhz is not None),
                used_by_job=used_by_job,
                looks_unused=all(looks_unused(g) for g in gs),
            )
        )
    return tuple(out)


def _job_gpu_util(gpus: Sequence[GpuSummary]) -> float | None:
    used = [g for g in gpus if g.used_by_job]
    if not used:
        # No process list matches (none readable, or pids of another namespace):
        # judge the GPUs that do not sit empty, else all of them.
        used = [g for g in gpus if not g.looks_unused] or list(gpus)
    return _mean(g.utilization_mean_pct for g in used if g.utilization_mean_pct is not None)


def looks_unused(g: GpuSample) -> bool:
    """A reading of a GPU that runs no CUDA context: at most ``UNUSED_GPU_UTIL_PCT`` busy,
    and no process listed or at most ``UNUSED_GPU_MEMORY_BYTES`` used (a context alone
    takes more; an idle GPU may report some memory reserved by the driver)."""
    if (g.utilization_gpu_pct or 0.0) > UNUSED_GPU_UTIL_PCT:
        return False
    if g.known_processes is None:
        # An unreadable process list (MIG, no permission) is no sign of an empty GPU.
        return (g.memory_used_bytes or 0) <= UNUSED_GPU_MEMORY_BYTES
    return not g.processes or (g.memory_used_bytes or 0) <= UNUSED_GPU_MEMORY_BYTES


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return statistics.fmean(vals) if vals else None


def _median(values: Iterable[float]) -> float | None:
    vals = list(values)
    return statistics.median(vals) if vals else None


def _quantile(values: Sequence[float], q: float) -> float | None:
    return weighted_quantile([(v, 1) for v in values], q)


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


__all__ = [
    "GpuSummary",
    "RunSummary",
    "StepSpan",
    "StepSplit",
    "all_spans",
    "job_pids",
    "looks_unused",
    "readings_in",
    "split_steps",
    "steady_interval",
    "summarize",
    "warmup_length",
    "weighted_quantile",
]
# TRAIN_PHASE, StepSpan, StepSplit, all_spans, split_steps, steady_interval,
# warmup_length and weighted_quantile live in trainmedic.record.spans.
