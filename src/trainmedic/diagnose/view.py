"""One derived view over a run record, computed once and shared by every rule.

The view answers the questions many rules ask (which processes and GPUs are
the job's, how many cores it may use, how busy its GPUs were, which loader is
the training loader) so each rule stays a short function of the view and the
thresholds. It does no I/O and never changes the record.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from trainmedic.diagnose.cpu_time import CpuTime, measure
from trainmedic.doctor.facts import MachineFacts
from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind
from trainmedic.record.payloads import process_starts
from trainmedic.record.spans import merge_intervals as merge_intervals
from trainmedic.record.spans import sample_intervals as sample_intervals
from trainmedic.record.stats import (
    RunSummary,
    StepSpan,
    StepSplit,
    all_spans,
    job_pids,
    looks_unused,
    readings_in,
    split_steps,
    summarize,
    weighted_quantile,
)
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunRecord,
    StepRecord,
)

Interval = tuple[float, float]
V = TypeVar("V")

#: loader states that do work; ``idle`` and ``ipc_wait`` only say someone else is slow.
BUSY_STATES = ("transform", "file_read", "socket_wait", "other")


@dataclass
class RunView:
    """A run record with the facts rules share (build with :meth:`of`)."""

    record: RunRecord
    machine: MachineFacts | None
    summary: RunSummary
    split: StepSplit
    pids: frozenset[int]
    _memo: dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key: Hashable, compute: Callable[[], V]) -> V:
        """``compute()``, once per key: a measure several rules share (with their thresholds)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[no-any-return]

    @classmethod
    def of(cls, record: RunRecord, machine: MachineFacts | None = None) -> RunView:
        split = split_steps(all_spans(record))
        return cls(record, machine, summarize(record), split, job_pids(record))

    # --- steps ----------------------------------------------------------------------------

    @property
    def steady(self) -> tuple[StepSpan, ...]:
        return self.split.steady

    @property
    def steady_steps(self) -> list[StepRecord]:
        """The exact (not folded) steady train steps."""
        return [s.step for s in self.split.steady if s.step is not None]

    @cached_property
    def steady_time_s(self) -> float:
        """Sum of steady step durations over all processes, seconds."""
        return sum(s.duration_s for s in self.steady)

    @cached_property
    def concurrent_processes(self) -> int:
        """Most training processes stepping at the same time (ranks on this host), >= 1."""
        bounds: dict[int, list[float]] = {}
        for s in self.steady:
            b = bounds.setdefault(s.pid, [s.t_start, s.t_end])
            b[0], b[1] = min(b[0], s.t_start), max(b[1], s.t_end)
        edges = sorted([(a, 1) for a, _ in bounds.values()] + [(b, -1) for _, b in bounds.values()])
        best = running = 0
        for _, delta in edges:
            running += delta
            best = max(best, running)
        return max(1, best)

    # --- host -----------------------------------------------------------------------------

    @cached_property
    def usable_cores(self) -> float | None:
        """Cores the job may use: host samples, else doctor's facts."""
        if self.summary.usable_cores:
            return self.summary.usable_cores
        if self.machine is not None:
            return self.machine.host.cpu.usable_cores
        return None

    @cached_property
    def job_user(self) -> str | None:
        """The user running the job: doctor's facts, else the run's recorded environment."""
        if self.machine is not None:
            return self.machine.host.user
        env = self.record.meta.environment
        host = env.get("host")
        for user in (host.get("user") if isinstance(host, dict) else None, env.get("user")):
            if isinstance(user, str):
                return user
        return None

    @cached_property
    def steady_host(self) -> list[HostSample]:
        """Host samples inside the steady part (all of them when none fall inside)."""
        return readings_in(self.record.host, self.window, lambda h: h.t)

    @cached_property
    def cpu(self) -> CpuTime:
        """The job's CPU and its threads' waits for a CPU over the steady part."""
        return measure(self.steady_host)

    @property
    def window(self) -> Interval | None:
        s = self.summary
        if s.steady_start_t is None or s.steady_end_t is None:
            return None
        return (s.steady_start_t, s.steady_end_t)

    # --- loaders --------------------------------------------------------------------------

    @cached_property
    def train_loaders(self) -> list[LoaderInfo]:
        """One loader per process: the one over the largest dataset, else the first made.

        Evaluation sets are smaller than training sets, and a script builds its
        training loader first far more often than not.
        """
        by_pid: dict[int, list[LoaderInfo]] = {}
        for lo in sorted(self.record.loaders, key=lambda lo: lo.t):
            by_pid.setdefault(lo.pid, []).append(lo)
        chosen = []
        for pid in sorted(by_pid):
            loaders = by_pid[pid]
            sized = [lo for lo in loaders if lo.dataset_len]
            chosen.append(max(sized, key=lambda lo: lo.dataset_len or 0) if sized else loaders[0])
        return chosen

    @cached_property
    def num_workers(self) -> int | None:
        """Fewest workers of any process's training loader, or ``None`` without loaders."""
        return min((lo.num_workers for lo in self.train_loaders), default=None)

    def activity(
        self, window: Interval | None = None, pids: frozenset[int] | None = None
    ) -> Counter[str]:
        """Loader stack samples per state, over the run or from the records whose samples
        may have been taken inside ``window`` (seconds, Unix time), of every process or
        of ``pids``."""
        total: Counter[str] = Counter()
        for start, end, a in self._activity_periods:
            if pids is not None and a.pid not in pids:
                continue
            if window is None or (start < window[1] and end >= window[0]):
                total.update({k: v for k, v in a.counts.items() if v > 0})
        return total

    @cached_property
    def _activity_periods(self) -> list[tuple[float, float, LoaderActivity]]:
        """Each stack-sample record with the period its samples were taken in.

        A record sums what its process sampled since that process's previous record
        (every 2 s while there are samples), so a stall between two sends shows in the
        send after it. The period is per process: several processes send at nearly the
        same moments, and the gaps between all their records say nothing of the period.
        """
        by_pid: dict[int, list[LoaderActivity]] = {}
        for a in self.record.loader_activity:
            by_pid.setdefault(a.pid, []).append(a)
        out: list[tuple[float, float, LoaderActivity]] = []
        for records in by_pid.values():
            records.sort(key=lambda a: a.t)
            periods = sample_intervals([a.t for a in records])
            out.extend((start, end, a) for a, (start, end) in zip(records, periods, strict=True))
        return out

    @cached_property
    def roles(self) -> dict[int, str]:
        """What each probed process said it was: ``process``, ``forked`` or ``worker``."""
        out: dict[int, str] = {}
        for e, p in process_starts(sorted(self.record.events, key=lambda e: e.t)):
            if e.pid is not None and isinstance(e.data.get("role"), str):
                out[e.pid] = p.role
        return out

    @cached_property
    def worker_pids(self) -> frozenset[int]:
        """DataLoader worker processes."""
        return frozenset(p for p, role in self.roles.items() if role == "worker")

    @cached_property
    def loader_pids(self) -> frozenset[int]:
        """Processes that iterate a DataLoader, and their workers."""
        return frozenset(lo.pid for lo in self.record.loaders) | self.worker_pids

    def outside_activity(self) -> Counter[str]:
        """Stack samples of training threads between steps in processes without a
        DataLoader: what the time outside forward/backward/optimizer went to."""
        pids = frozenset(a.pid for a in self.record.loader_activity) - self.loader_pids
        return self.activity(pids=pids)

    # --- GPUs -----------------------------------------------------------------------------

    @cached_property
    def uses_gpu(self) -> bool | None:
        """Whether the job runs on a GPU.

        ``True`` with CUDA readings in its steps or a job pid in a GPU's process
        list; ``False`` without GPU readings, or when every GPU sat empty (no job
        process, :func:`~trainmedic.record.stats.looks_unused` readings);
        ``None`` when it cannot be told (a simulated GPU, or pids from another
        namespace), and rules then judge the GPUs.
        """
        steps = self.record.steps
        if any(
            s.gpu_time_s is not None or s.reserved_peak_bytes is not None or s.alloc_peak_bytes
            for s in steps
        ) or any(w.gpu_time_sum_s is not None for w in self.record.windows):
            return True
        if any(p.pid in self.pids for g in self.record.gpu for p in g.processes):
            return True
        if self.tf_gpu:
            return True
        if all(looks_unused(g) for g in self.record.gpu):
            return False
        return None

    @cached_property
    def tf_gpu(self) -> dict[int, dict[str, Any]]:
        """TensorFlow's GPU settings and pool of each process that has them: the last
        ``tf_gpu`` event's data by pid (:mod:`trainmedic.probe.tf_facts`)."""
        found: dict[int, dict[str, Any]] = {}
        for e in self.record.events:
            gpus = e.data.get("gpus")
            if e.kind == EventKind.TF_GPU and e.pid is not None and isinstance(gpus, list):
                found[e.pid] = dict(e.data)
        return found

    @cached_property
    def tf_preallocates(self) -> bool:
        """Whether a TensorFlow process took its GPUs' memory whole at start (memory
        growth off and not forced on by ``TF_FORCE_GPU_ALLOW_GROWTH``): then the GPU's
        memory in use is TensorFlow's pool, not what the job needs."""
        return any(
            not d.get("growth_env") and any(g.get("memory_growth") is False for g in d["gpus"])
            for d in self.tf_gpu.values()
        )

    @cached_property
    def tf_pool_peak_bytes(self) -> int | None:
        """The most bytes TensorFlow's pool held at once on one GPU, over the job's
        processes (``None``: not read)."""
        peaks = [
            int(g["peak_bytes"])
            for d in self.tf_gpu.values()
            for g in d["gpus"]
            if isinstance(g.get("peak_bytes"), int)
        ]
        return max(peaks, default=None)

    @cached_property
    def job_gpu_memory_total_bytes(self) -> int | None:
        """The largest memory of the job's GPUs (bytes), from their readings."""
        totals = [
            g.memory_total_bytes
            for i in self.job_gpu_indices
            for g in self.gpu_series(i, steady_only=False)
            if g.memory_total_bytes
        ]
        return max(totals, default=None)

    @cached_property
    def framework(self) -> str:
        """``tensorflow`` for a job the probe saw train with TensorFlow or Keras (a
        ``tf.data`` pipeline, TensorFlow's GPU settings), else ``torch``: the words
        of the fixes."""
        tf_kinds = {"tf_gpu", "tfdata_pipeline", "tfdata_epochs"}
        if self.tf_gpu or any(e.kind in tf_kinds for e in self.record.events):
            return "tensorflow"
        if any(lo.dataset_type == "tf.data" for lo in self.record.loaders):
            return "tensorflow"
        return "torch"

    @cached_property
    def job_gpu_indices(self) -> tuple[int, ...]:
        """GPUs a job process appears on; when none can be matched, every GPU that
        does not sit empty (see :attr:`uses_gpu`), else all GPUs."""
        if self.uses_gpu is False:
            return ()
        matched = {g.index for g in self.record.gpu if any(p.pid in self.pids for p in g.processes)}
        if matched:
            return tuple(sorted(matched))
        busy = {g.index for g in self.record.gpu if not looks_unused(g)}
        return tuple(sorted(busy or {g.index for g in self.record.gpu}))

    def gpu_series(self, index: int, *, steady_only: bool = True) -> list[GpuSample]:
        """Readings of one GPU in time order (within the steady part when asked and possible)."""
        series = sorted((g for g in self.record.gpu if g.index == index), key=lambda g: g.timestamp)
        if steady_only:
            return readings_in(series, self.window, lambda g: g.timestamp)
        return series

    @cached_property
    def gpu_util_pct(self) -> float | None:
        """Mean utilization of the job's GPUs over the steady part, percent."""
        values = [
            g.utilization_gpu_pct
            for i in self.job_gpu_indices
            for g in self.gpu_series(i)
            if g.utilization_gpu_pct is not None
        ]
        return sum(values) / len(values) if values else None

    @cached_property
    def gpu_busy_share(self) -> float | None:
        """Share of time the job's GPUs were busy: NVML utilization, else CUDA-event time."""
        if self.gpu_util_pct is not None:
            return self.gpu_util_pct / 100.0
        if self.uses_gpu is not False:
            return self.summary.gpu_time_share
        return None

    @cached_property
    def gpu_memory_used_share(self) -> float | None:
        """Peak over the job's GPUs of mean memory used / total, 0..1; for TensorFlow
        holding its GPUs whole (:attr:`tf_preallocates`), its pool's peak / total."""
        total = self.job_gpu_memory_total_bytes
        if self.tf_preallocates and self.tf_pool_peak_bytes is not None and total:
            return self.tf_pool_peak_bytes / total
        shares = []
        for i in self.job_gpu_indices:
            vals = [
                g.memory_used_bytes / g.memory_total_bytes
                for g in self.gpu_series(i)
                if g.memory_used_bytes is not None and g.memory_total_bytes
            ]
            if vals:
                shares.append(sum(vals) / len(vals))
        return max(shares, default=None)

    @cached_property
    def compute_capability(self) -> tuple[int, int] | None:
        """Lowest compute capability among the job's GPUs (readings, else doctor's facts)."""
        caps = [
            g.compute_capability
            for g in self.record.gpu
            if g.index in self.job_gpu_indices and g.compute_capability is not None
        ]
        if not caps and self.machine is not None:
            caps = [g.compute_capability for g in self.machine.gpu.samples if g.compute_capability]
        return min(caps) if caps else None

    # --- time ----------------------------------------------------------------------------

    def slowdown_share(self, intervals: Sequence[Interval]) -> float | None:
        """Share of steady time lost in steps overlapping ``intervals``.

        Steps overlapping an interval are compared with the median of the
        others: their excess over it, summed, over all steady time. ``None``
        when fewer than three steps fall on either side (nothing to compare).
        """
        if not intervals or self.steady_time_s <= 0:
            return None
        hit, clear = self.steps_during(intervals)
        if sum(s.count for s in hit) < 3 or sum(s.count for s in clear) < 3:
            return None
        base = weighted_quantile([(s.mean_duration_s, s.count) for s in clear], 0.5)
        assert base is not None
        extra = sum(s.count * max(0.0, s.mean_duration_s - base) for s in hit)
        return min(1.0, extra / self.steady_time_s)

    def steps_during(
        self, intervals: Sequence[Interval]
    ) -> tuple[list[StepSpan], list[StepSpan]]:
        """The steady steps that overlap ``intervals``, and the others."""
        merged = merge_intervals(intervals)
        starts = [a for a, _ in merged]
        hit: list[StepSpan] = []
        clear: list[StepSpan] = []
        for s in self.steady:
            (hit if overlaps(merged, starts, s.t_start, s.t_end) else clear).append(s)
        return hit, clear

    def steps_slower_during(self, intervals: Sequence[Interval]) -> tuple[float, float] | None:
        """(share of the steady steps that overlap ``intervals``, how much longer their
        median step is than the others', as a share of it); ``None`` when fewer than
        three steps fall on either side."""
        hit, clear = self.steps_during(intervals)
        n_hit, n_clear = sum(s.count for s in hit), sum(s.count for s in clear)
        if n_hit < 3 or n_clear < 3:
            return None
        during = weighted_quantile([(s.mean_duration_s, s.count) for s in hit], 0.5)
        base = weighted_quantile([(s.mean_duration_s, s.count) for s in clear], 0.5)
        if during is None or not base:
            return None
        return n_hit / (n_hit + n_clear), during / base - 1.0


def overlaps(merged: Sequence[Interval], starts: Sequence[float], a: float, b: float) -> bool:
    """Whether [a, b] meets any of ``merged`` (sorted, disjoint; ``starts`` their starts)."""
    i = bisect.bisect_right(starts, b) - 1
    return i >= 0 and merged[i][1] >= a


def share_of(values: Counter[str], key: str, among: Iterable[str]) -> float:
    total = sum(values[k] for k in among)
    return values[key] / total if total else 0.0
