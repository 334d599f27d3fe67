"""A run's steps as spans, split into warm-up, steady training steps and other phases.

Exact steps and folded windows become one shape (:class:`StepSpan`); the
statistics of :mod:`trainmedic.record.stats` and the diagnosis read the
steady part this module finds (docs/diagnosis.md, "Run statistics"):

* Only ``train``-phase steps count as training steps; evaluation and
  checkpoint steps are kept apart.
* Warm-up: per process, leading train steps are dropped while their durations
  have not settled (compilation, cuDNN benchmarking, first batches). A step is
  *settled* when its duration is at most ``SETTLE_FACTOR`` times the process's
  median; warm-up ends at the first step that starts a run of ``SETTLE_RUN``
  settled steps. At most ``max(WARMUP_MIN_CAP, WARMUP_MAX_SHARE * n)`` steps
  (and never half or more of a process's steps) are dropped.
* Folded steps (:class:`StepWindow`) count as ``count`` steps at their mean
  duration in percentiles; they are ordinary by construction, never warm-up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainmedic.record.types import RunRecord, StepRecord, StepWindow

TRAIN_PHASE = "train"

#: a step is settled when its duration is at most this many times the median.
SETTLE_FACTOR = 1.5
#: warm-up ends at the first step that starts this many settled steps in a row.
SETTLE_RUN = 3
#: warm-up may drop at most this share of a process's train steps ...
WARMUP_MAX_SHARE = 0.10
#: ... but at least this many (short runs still drop a compile step).
WARMUP_MIN_CAP = 3


@dataclass(frozen=True)
class StepSpan:
    """One exact step or one folded window, in the shape statistics need.

    Attributes:
        t_start / t_end: Unix seconds.
        count: steps it stands for (1 for an exact step).
        duration_s / data_wait_s: sums over its steps, seconds.
        compute_s / gpu_time_s / samples: sums, ``None`` when unknown.
        duration_max_s: longest single step in it, seconds.
        step: the step itself for an exact step, ``None`` for a window.
        compute_count / compute_duration_s: how many of its steps had a compute
            time, and their durations' sum, seconds (shares of compute divide by it).
        gpu_count / gpu_duration_s: the same for GPU time.
    """

    pid: int
    phase: str
    first_step: int
    t_start: float
    t_end: float
    count: int
    duration_s: float
    data_wait_s: float
    compute_s: float | None
    gpu_time_s: float | None
    samples: int | None
    duration_max_s: float = 0.0
    step: StepRecord | None = None
    compute_count: int = 0
    compute_duration_s: float = 0.0
    gpu_count: int = 0
    gpu_duration_s: float = 0.0

    @property
    def mean_duration_s(self) -> float:
        return self.duration_s / self.count if self.count else 0.0

    @classmethod
    def of_step(cls, s: StepRecord) -> StepSpan:
        return cls(
            pid=s.pid,
            phase=s.phase,
            first_step=s.step,
            t_start=s.t - s.duration_s,
            t_end=s.t,
            count=1,
            duration_s=s.duration_s,
            data_wait_s=s.data_wait_s,
            compute_s=s.compute_s,
            gpu_time_s=s.gpu_time_s,
            samples=s.samples,
            duration_max_s=s.duration_s,
            step=s,
            compute_count=0 if s.compute_s is None else 1,
            compute_duration_s=0.0 if s.compute_s is None else s.duration_s,
            gpu_count=0 if s.gpu_time_s is None else 1,
            gpu_duration_s=0.0 if s.gpu_time_s is None else s.duration_s,
        )

    @classmethod
    def of_window(cls, w: StepWindow) -> StepSpan:
        compute = _known(w, w.compute_sum_s, w.compute_count, w.compute_duration_sum_s)
        gpu = _known(w, w.gpu_time_sum_s, w.gpu_time_count, w.gpu_time_duration_sum_s)
        return cls(
            pid=w.pid,
            phase=w.phase,
            first_step=w.first_step,
            t_start=w.t_start,
            t_end=w.t,
            count=w.count,
            duration_s=w.duration_sum_s,
            data_wait_s=w.data_wait_sum_s,
            compute_s=w.compute_sum_s,
            gpu_time_s=w.gpu_time_sum_s,
            samples=w.samples_sum,
            duration_max_s=w.duration_max_s,
            compute_count=compute[0],
            compute_duration_s=compute[1],
            gpu_count=gpu[0],
            gpu_duration_s=gpu[1],
        )

    @property
    def gpu_share(self) -> float | None:
        """GPU time over the duration of the steps that had one, or ``None``."""
        if self.gpu_time_s is None or self.gpu_duration_s <= 0:
            return None
        return self.gpu_time_s / self.gpu_duration_s


def _known(
    w: StepWindow, total: float | None, count: int | None, duration: float | None
) -> tuple[int, float]:
    """How many of a window's steps had a value, and their summed durations: counted
    in newer records; in older ones, all of them when it has a sum."""
    if total is None:
        return 0, 0.0
    if count is None or duration is None:
        return w.count, w.duration_sum_s
    return count, duration


def known_share(spans: Iterable[StepSpan], part: str) -> float | None:
    """sum(part) / sum(duration) over the steps that had ``part`` (``"compute"`` or
    ``"gpu"``), clamped to [0, 1]; ``None`` when none had it.

    A window's share divides by the durations of its steps that had the value:
    short steps are timed without the compute hooks between the probe's
    windows of them (docs/run.md), and a step's CUDA events may not be ready.
    """
    num = den = 0.0
    for s in spans:
        value, known = (
            (s.compute_s, s.compute_duration_s)
            if part == "compute"
            else (s.gpu_time_s, s.gpu_duration_s)
        )
        if value is not None:
            num += value
            den += known
    if den <= 0:
        return None
    return min(1.0, max(0.0, num / den))


@dataclass(frozen=True)
class StepSplit:
    """The record's steps, split into warm-up, steady train steps and other phases.

    All lists are in (pid, step) order.
    """

    warmup: tuple[StepSpan, ...]
    steady: tuple[StepSpan, ...]
    other_phases: tuple[StepSpan, ...]


def all_spans(record: RunRecord) -> list[StepSpan]:
    """Exact steps and windows of every process as spans, in (pid, first step) order."""
    spans = [StepSpan.of_step(s) for s in record.steps]
    spans += [StepSpan.of_window(w) for w in record.windows if w.count > 0]
    spans.sort(key=lambda s: (s.pid, s.first_step, s.t_end))
    return spans


def split_steps(spans: Sequence[StepSpan]) -> StepSplit:
    """Split spans into warm-up, steady train steps and other phases (module docstring)."""
    warmup: list[StepSpan] = []
    steady: list[StepSpan] = []
    other: list[StepSpan] = []
    by_pid: dict[int, list[StepSpan]] = {}
    for s in spans:
        if s.phase == TRAIN_PHASE:
            by_pid.setdefault(s.pid, []).append(s)
        else:
            other.append(s)
    for pid in sorted(by_pid):
        train = by_pid[pid]
        n = warmup_length(train)
        warmup += train[:n]
        steady += train[n:]
    return StepSplit(tuple(warmup), tuple(steady), tuple(other))


def warmup_length(train: Sequence[StepSpan]) -> int:
    """How many leading spans of one process's train steps are warm-up (module docstring)."""
    n_steps = sum(s.count for s in train)
    cap = min(max(WARMUP_MIN_CAP, math.ceil(WARMUP_MAX_SHARE * n_steps)), n_steps // 2)
    if cap <= 0:
        return 0
    reference = weighted_quantile([(s.mean_duration_s, s.count) for s in train], 0.5)
    assert reference is not None
    limit = SETTLE_FACTOR * reference

    def settled(i: int) -> bool:
        span = train[i]
        return span.step is None or span.duration_s <= limit

    first_settled: int | None = None
    for i in range(min(cap, len(train)) + 1):
        if i >= len(train) or train[i].step is None:
            return i
        if not settled(i):
            continue
        if first_settled is None:
            first_settled = i
        run = train[i : i + SETTLE_RUN]
        if all(settled(i + k) for k in range(len(run))):
            return i
    return first_settled if first_settled is not None else min(cap, len(train))


def steady_interval(split: StepSplit) -> tuple[float, float] | None:
    """(start, end) in Unix seconds of the steady steps, or ``None`` without any."""
    if not split.steady:
        return None
    return min(s.t_start for s in split.steady), max(s.t_end for s in split.steady)


def weighted_quantile(values: Sequence[tuple[float, int]], q: float) -> float | None:
    """Quantile ``q`` of values with integer weights, as if each were repeated ``weight``
    times (linear interpolation, numpy's default); ``None`` when empty."""
    items = sorted((v, w) for v, w in values if w > 0)
    total = sum(w for _, w in items)
    if total == 0:
        return None
    pos = q * (total - 1)
    lo_i, hi_i = math.floor(pos), math.ceil(pos)
    lo_v = hi_v = items[-1][0]
    seen = 0
    found_lo = False
    for v, w in items:
        seen += w
        if not found_lo and lo_i < seen:
            lo_v, found_lo = v, True
        if hi_i < seen:
            hi_v = v
            break
    return lo_v + (hi_v - lo_v) * (pos - lo_i)


def sample_intervals(times: Sequence[float]) -> list[tuple[float, float]]:
    """The period each reading describes: from the previous reading to this one.

    NVML utilization, host rates and CPU counters are averages over the time
    since the last reading; the first reading gets the median period.
    ``times`` in order, seconds.
    """
    if not times:
        return []
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    first = sorted(gaps)[len(gaps) // 2] if gaps else 1.0
    return [(times[0] - first, times[0]), *itertools.pairwise(times)]


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching intervals joined; the result sorted and disjoint."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
