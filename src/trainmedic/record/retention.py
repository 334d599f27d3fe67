"""How the run record stays bounded: the policy and the state that applies it.

:class:`RetentionPolicy` says what the writer keeps exactly (each process's
head, anomalous steps, phase changes) and how it folds the rest into
windows and thins long sample streams; the classes below hold the running
state it needs per process and per stream (docs/run-record.md, "Bounding").
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import StepRecord, StepWindow


@dataclass(frozen=True)
class RetentionPolicy:
    """How the writer bounds a run record (docs/run-record.md, "Bounding").

    Kept exactly: each process's head, every step outside the ``train`` phase
    or at a phase change, every step where ``alloc_retries`` or ``ooms`` grew,
    and every step that stands out against the running medians below.

    Attributes:
        head_steps: steps of each process (pid) kept exactly from its start.
        window_max_steps / window_max_s: an open window of ordinary steps is
            closed when it holds this many steps or spans this many seconds.
        baseline_steps: recent steps per (pid, phase) the running medians use.
        baseline_refresh_steps: medians are recomputed every this many steps
            (amortises the sort; a median moves slowly anyway).
        min_baseline_steps: below this many baseline steps every step of that
            (pid, phase) is kept (no baseline to compare against yet).
        slow_factor: a step whose duration (or GPU time) exceeds this multiple of
            the running median is anomalous.
        data_wait_factor / data_wait_min_share: a step whose data wait exceeds
            both ``data_wait_factor`` × the median data wait and the median data
            wait + ``data_wait_min_share`` × the median step is anomalous.
        max_exact_steps: cap on steps kept exactly over the whole run (head and
            anomalies); beyond it anomalies are folded and counted as dropped.
        full_rate_s: GPU and host samples are kept at full rate for this long
            from the first sample of each stream, seconds.
        decimated_interval_s: after that, at most one sample per stream per this
            many seconds, except GPU samples whose discrete state changed
            (clock event reasons, ECC, remapped rows, PCIe link, processes).
        max_forced_gpu_samples: cap per GPU on samples kept for a state change
            while decimating (a clock reason flapping every second stays bounded).
        max_events / max_loaders / max_loader_activity: caps on those records.
        max_event_bytes / max_loader_activity_bytes: caps on the bytes of those
            files (tracebacks and stack frames can be long).
        max_event_text_chars: longer strings in an event's message or data are
            cut to their first and last characters around a ``…`` marker.
    """

    head_steps: int = 2000
    window_max_steps: int = 1000
    window_max_s: float = 10.0
    baseline_steps: int = 256
    baseline_refresh_steps: int = 64
    min_baseline_steps: int = 16
    slow_factor: float = 3.0
    data_wait_factor: float = 3.0
    data_wait_min_share: float = 0.5
    max_exact_steps: int = 200_000
    full_rate_s: float = 3600.0
    decimated_interval_s: float = 5.0
    max_forced_gpu_samples: int = 2_000
    max_events: int = 10_000
    max_event_bytes: int = 8 * 1024 * 1024
    max_event_text_chars: int = 4096
    max_loaders: int = 1_000
    max_loader_activity: int = 10_000
    max_loader_activity_bytes: int = 8 * 1024 * 1024


@dataclass
class RecordCounts:
    """What the writer has seen, kept and dropped so far (all counts)."""

    steps_seen: int = 0
    steps_exact: int = 0
    steps_windowed: int = 0
    windows: int = 0
    anomalies_dropped: int = 0
    gpu_seen: int = 0
    gpu_kept: int = 0
    host_seen: int = 0
    host_kept: int = 0
    events_dropped: int = 0
    loaders_dropped: int = 0
    loader_activity_dropped: int = 0


class Baseline:
    """Running medians of one (pid, phase): duration, data wait, GPU time."""

    def __init__(self, size: int) -> None:
        self.durations: deque[float] = deque(maxlen=size)
        self.waits: deque[float] = deque(maxlen=size)
        self.gpu_times: deque[float] = deque(maxlen=size)
        self.since_refresh = 0
        self.duration = 0.0
        self.wait = 0.0
        self.gpu_time: float | None = None

    def add(self, step: StepRecord, refresh_every: int) -> None:
        self.durations.append(step.duration_s)
        self.waits.append(step.data_wait_s)
        if step.gpu_time_s is not None:
            self.gpu_times.append(step.gpu_time_s)
        self.since_refresh += 1
        if self.since_refresh >= refresh_every or len(self.durations) <= refresh_every:
            self.since_refresh = 0
            self.duration = statistics.median(self.durations)
            self.wait = statistics.median(self.waits)
            self.gpu_time = statistics.median(self.gpu_times) if self.gpu_times else None


class WindowBuilder:
    """Sums of the ordinary steps of one process since its window opened."""

    def __init__(self, step: StepRecord) -> None:
        self.pid = step.pid
        self.phase = step.phase
        self.t_start = step.t - step.duration_s
        self.t = step.t
        self.count = 0
        self.first_step = step.step
        self.last_step = step.step
        self.duration_sum = 0.0
        self.duration_min = step.duration_s
        self.duration_max = step.duration_s
        self.wait_sum = 0.0
        self.compute_sum: float | None = None
        self.compute_count = 0
        self.compute_duration = 0.0
        self.gpu_sum: float | None = None
        self.gpu_count = 0
        self.gpu_duration = 0.0
        self.samples_sum: int | None = None

    def add(self, step: StepRecord) -> None:
        self.count += 1
        self.t = max(self.t, step.t)
        self.first_step = min(self.first_step, step.step)
        self.last_step = max(self.last_step, step.step)
        self.duration_sum += step.duration_s
        self.duration_min = min(self.duration_min, step.duration_s)
        self.duration_max = max(self.duration_max, step.duration_s)
        self.wait_sum += step.data_wait_s
        # Sums over the steps that had the value: GPU time in particular
        # arrives late and is missing on some steps.
        if step.compute_s is not None:
            self.compute_sum = (self.compute_sum or 0.0) + step.compute_s
            self.compute_count += 1
            self.compute_duration += step.duration_s
        if step.gpu_time_s is not None:
            self.gpu_sum = (self.gpu_sum or 0.0) + step.gpu_time_s
            self.gpu_count += 1
            self.gpu_duration += step.duration_s
        if step.samples is not None:
            self.samples_sum = (self.samples_sum or 0) + step.samples

    def build(self) -> StepWindow:
        return StepWindow(
            t_start=self.t_start,
            t=self.t,
            count=self.count,
            first_step=self.first_step,
            last_step=self.last_step,
            duration_sum_s=self.duration_sum,
            duration_min_s=self.duration_min,
            duration_max_s=self.duration_max,
            data_wait_sum_s=self.wait_sum,
            compute_sum_s=self.compute_sum,
            compute_count=self.compute_count,
            compute_duration_sum_s=self.compute_duration,
            gpu_time_sum_s=self.gpu_sum,
            gpu_time_count=self.gpu_count,
            gpu_time_duration_sum_s=self.gpu_duration,
            samples_sum=self.samples_sum,
            pid=self.pid,
            phase=self.phase,
        )


class ProcessSteps:
    """Per-process state: how many steps seen, baselines, the open window."""

    def __init__(self) -> None:
        self.seen = 0
        self.phase: str | None = None
        self.alloc_retries: int | None = None
        self.ooms: int | None = None
        self.baselines: dict[str, Baseline] = {}
        self.window: WindowBuilder | None = None


class Decimator:
    """Full rate for ``full_rate_s``, then one sample per ``interval_s``."""

    def __init__(self, full_rate_s: float, interval_s: float, max_forced: int = 0) -> None:
        self._full_rate_s = full_rate_s
        self._interval_s = interval_s
        self._forced_left = max_forced
        self._first: float | None = None
        self._last_kept = 0.0

    def keep(self, t: float, forced: bool = False) -> bool:
        """Whether to keep a sample taken at ``t``; ``forced`` asks to keep it anyway."""
        if self._first is None:
            self._first = t
        # A sampler's period jitters; 1 % slack keeps "every 5 s" from
        # becoming "every 6 s" when a reading comes a little early.
        if t - self._first < self._full_rate_s or t - self._last_kept >= self._interval_s * 0.99:
            self._last_kept = t
            return True
        if forced and self._forced_left > 0:
            self._forced_left -= 1
            self._last_kept = t
            return True
        return False


def discrete_state(s: GpuSample) -> tuple[Any, ...]:
    """The GPU state whose every change is kept, even when decimating."""
    return (
        s.clock_event_reasons,
        s.ecc,
        s.remapped_rows,
        s.retired_pages_pending,
        s.pcie.gen_current,
        s.pcie.width_current,
        tuple(p.pid for p in s.processes),
        s.persistence_mode,
    )
