"""The live view's data: what the run is doing now.

:class:`LiveAggregate` receives the same records as the run record (it is a
record sink) and keeps only what the view needs: the last steps of each
process, the latest GPU and host readings, and the warnings that are already
certain, as a :class:`LiveStatus`. :mod:`trainmedic.supervise.live.view`
shows it on the terminal.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind
from trainmedic.record.types import HostSample, RunEvent, StepRecord
from trainmedic.supervise.loop.attempt_state import AttemptNow
from trainmedic.supervise.observe.processes import IgnoringSink

WINDOW_STEPS = 50
"""Recent steps per process the rates and shares are taken over."""
MIN_CERTAIN_STEPS = 20
"""Steps in the window before a share-based warning is certain."""
DATA_WAIT_WARN_SHARE = 0.5
STRAGGLER_GAP_SHARE = 0.3
"""A rank whose data wait exceeds the others' median by this share of step time."""
GPU_WINDOW_S = 30.0
GPU_LOW_UTIL_PCT = Thresholds().gpu_util_low_pct
"""The report's bar for a GPU left idle: the live view warns of what the report will say."""
GPU_MIN_SAMPLES = 10
GPU_MEMORY_FULL = 0.95
TEMP_MARGIN_C = faults.NEAR_SLOWDOWN_MARGIN_C
MAX_WARNINGS = 4
GIB = 1024**3
_THERMAL = faults.HARD_MASK
"""Heat and power slowdowns: the clock reasons that count whenever the GPU works."""


@dataclass(frozen=True)
class GpuNow:
    """One GPU's latest reading, and its mean utilization over the recent window."""

    index: int
    utilization_pct: float | None
    utilization_mean_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None


@dataclass(frozen=True)
class LiveStatus:
    """What the live view shows at one moment.

    Attributes:
        steps: train steps of the lead process (rank 0, else the busiest).
        steps_per_s / data_wait_share: over the lead's last :data:`WINDOW_STEPS` steps.
        samples_per_s: all processes together, over their recent steps.
        job_cpu_cores: the job's process tree, cores.
        attempt / attempt_state: the restart loop's attempt and its state
            (:mod:`trainmedic.supervise.loop.attempt_state`; 0 and ``None`` before it starts).
    """

    elapsed_s: float
    steps: int
    phase: str | None
    steps_per_s: float | None
    samples_per_s: float | None
    data_wait_share: float | None
    processes: int
    gpus: tuple[GpuNow, ...]
    job_cpu_cores: float | None
    warnings: tuple[str, ...]
    ranks: tuple[RankNow, ...] = ()
    attempt: int = 0
    attempt_state: str | None = None


@dataclass(frozen=True)
class RankNow:
    """One rank over its last :data:`WINDOW_STEPS` steps (distributed runs)."""

    rank: int
    steps: int
    step_time_s: float | None
    data_wait_share: float | None


class LiveAggregate(IgnoringSink):
    """A record sink keeping the recent state of the run; thread-safe."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._lock = threading.Lock()
        self._steps: dict[int, deque[StepRecord]] = {}
        self._counts: dict[int, int] = {}
        self._ranks: dict[int, int] = {}
        self._last_phase: dict[int, str] = {}
        self._gpu: dict[int, GpuSample] = {}
        self._gpu_util: dict[int, deque[tuple[float, float]]] = {}
        self._host: HostSample | None = None
        self._event_warnings: list[str] = []
        self._ooms = 0
        self._attempt: AttemptNow | None = None

    # --- the sink -----------------------------------------------------------------------------

    def add_step(self, step: StepRecord) -> None:
        with self._lock:
            self._last_phase[step.pid] = step.phase
            if step.rank is not None:
                self._ranks[step.pid] = step.rank
            if step.ooms:
                self._ooms = max(self._ooms, step.ooms)
            if step.phase != "train":
                return
            window = self._steps.get(step.pid)
            if window is None:
                window = self._steps[step.pid] = deque(maxlen=WINDOW_STEPS)
            window.append(step)
            self._counts[step.pid] = self._counts.get(step.pid, 0) + 1

    def add_gpu(self, sample: GpuSample) -> None:
        with self._lock:
            self._gpu[sample.index] = sample
            if sample.utilization_gpu_pct is not None:
                history = self._gpu_util.setdefault(sample.index, deque())
                history.append((sample.timestamp, sample.utilization_gpu_pct))
                while history and history[0][0] < sample.timestamp - GPU_WINDOW_S:
                    history.popleft()

    def add_host(self, sample: HostSample) -> None:
        with self._lock:
            self._host = sample

    def add_event(self, event: RunEvent) -> None:
        text = None
        if event.kind == EventKind.PROBE_ERROR:
            text = f"probe: {event.message}"
        elif event.kind in (EventKind.EXCEPTION, EventKind.THREAD_EXCEPTION):
            text = f"pid {event.pid}: {event.message}"
        elif event.kind in (EventKind.SAMPLER_ERROR, EventKind.CHANNEL_ERROR):
            text = event.message
        if text is None:
            return
        with self._lock:
            if len(self._event_warnings) < MAX_WARNINGS:
                self._event_warnings.append(text)

    def attempt_changed(self, now: AttemptNow) -> None:
        """Listens to the restart loop (:class:`~.attempt_state.AttemptTracker`)."""
        with self._lock:
            self._attempt = now

    # --- the view's question -------------------------------------------------------------------

    def _lead(self) -> int | None:
        if not self._steps:
            return None
        ranked = [pid for pid in self._steps if self._ranks.get(pid) == 0]
        if ranked:
            return ranked[0]
        return max(self._steps, key=lambda pid: self._counts.get(pid, 0))

    def status(self, now: float) -> LiveStatus:
        with self._lock:
            lead = self._lead()
            window = list(self._steps[lead]) if lead is not None else []
            steps = self._counts.get(lead, 0) if lead is not None else 0
            phase = self._last_phase.get(lead) if lead is not None else None
            duration = sum(s.duration_s for s in window)
            steps_per_s = len(window) / duration if duration > 0 else None
            wait_share = (sum(s.data_wait_s for s in window) / duration) if duration > 0 else None
            samples_per_s = _samples_per_s(self._steps.values())
            gpus = tuple(self._gpu_now(i) for i in sorted(self._gpu))
            host = self._host
            ranks = self._ranks_now()
            warnings = self._warnings(window, wait_share, gpus, ranks)
            attempt = self._attempt
            return LiveStatus(
                elapsed_s=max(0.0, now - self.started_at),
                steps=steps,
                phase=phase,
                steps_per_s=steps_per_s,
                samples_per_s=samples_per_s,
                data_wait_share=wait_share,
                processes=len(self._steps),
                gpus=gpus,
                job_cpu_cores=None if host is None else host.job_cpu_pct / 100.0,
                warnings=warnings,
                ranks=ranks,
                attempt=attempt.number if attempt is not None else 0,
                attempt_state=str(attempt.state) if attempt and attempt.state else None,
            )

    def _ranks_now(self) -> tuple[RankNow, ...]:
        """Each rank's newest process (a restarted rank has a new pid)."""
        latest: dict[int, int] = {}
        for pid, rank in self._ranks.items():
            steps = self._steps.get(pid)
            if not steps:
                continue
            known = latest.get(rank)
            if known is None or steps[-1].t > self._steps[known][-1].t:
                latest[rank] = pid
        if len(latest) < 2:
            return ()
        out = []
        for rank in sorted(latest):
            recent = list(self._steps[latest[rank]])
            duration = sum(s.duration_s for s in recent)
            out.append(
                RankNow(
                    rank=rank,
                    steps=len(recent),
                    step_time_s=sorted(s.duration_s for s in recent)[len(recent) // 2],
                    data_wait_share=sum(s.data_wait_s for s in recent) / duration
                    if duration > 0
                    else None,
                )
            )
        return tuple(out)

    def _gpu_now(self, index: int) -> GpuNow:
        s = self._gpu[index]
        history = self._gpu_util.get(index) or ()
        mean = (
            sum(u for _, u in history) / len(history) if len(history) >= GPU_MIN_SAMPLES else None
        )
        return GpuNow(
            index=index,
            utilization_pct=s.utilization_gpu_pct,
            utilization_mean_pct=mean,
            memory_used_bytes=s.memory_used_bytes,
            memory_total_bytes=s.memory_total_bytes,
            temperature_c=s.temperature_c,
        )

    def _warnings(
        self,
        window: Sequence[StepRecord],
        wait_share: float | None,
        gpus: Sequence[GpuNow],
        ranks: Sequence[RankNow] = (),
    ) -> tuple[str, ...]:
        out: list[str] = []
        straggler = _straggler(ranks)
        if straggler is not None:
            out.append(straggler)
        if (
            wait_share is not None
            and len(window) >= MIN_CERTAIN_STEPS
            and wait_share >= DATA_WAIT_WARN_SHARE
        ):
            out.append(
                f"input-bound: {wait_share:.0%} of step time waiting for data "
                f"(last {len(window)} steps)"
            )
        stepping = len(window) >= MIN_CERTAIN_STEPS
        for g in gpus:
            if (
                stepping
                and g.utilization_mean_pct is not None
                and g.utilization_mean_pct < GPU_LOW_UTIL_PCT
            ):
                out.append(
                    f"GPU {g.index} mostly idle: {g.utilization_mean_pct:.0f}% busy "
                    f"over {GPU_WINDOW_S:.0f} s"
                )
            if (
                g.memory_used_bytes is not None
                and g.memory_total_bytes
                and g.memory_used_bytes >= GPU_MEMORY_FULL * g.memory_total_bytes
            ):
                out.append(
                    f"GPU {g.index} memory nearly full: "
                    f"{g.memory_used_bytes / GIB:.1f} of {g.memory_total_bytes / GIB:.1f} GiB"
                )
            sample = self._gpu[g.index]
            if sample.clock_event_reasons is not None and sample.reasons & _THERMAL:
                out.append(
                    f"GPU {g.index} slowed by heat or power: clock reasons {sample.reasons!s}"
                )
            elif (
                sample.temperature_c is not None
                and sample.temperature_slowdown_c is not None
                and sample.temperature_c >= sample.temperature_slowdown_c - TEMP_MARGIN_C
            ):
                out.append(
                    f"GPU {g.index} at {sample.temperature_c:.0f}°C, near its slowdown "
                    f"temperature ({sample.temperature_slowdown_c:.0f}°C)"
                )
        if self._ooms:
            out.append(f"CUDA out-of-memory errors: {self._ooms}")
        out.extend(self._event_warnings)
        return tuple(out[:MAX_WARNINGS])


def _straggler(ranks: Sequence[RankNow]) -> str | None:
    """One rank waiting for its data far longer than the others, over enough steps
    (the others then wait for it in the all-reduce); the final report measures it."""
    known = [r for r in ranks if r.data_wait_share is not None and r.steps >= MIN_CERTAIN_STEPS]
    if len(known) < 2:
        return None
    worst = max(known, key=lambda r: r.data_wait_share or 0.0)
    others = sorted(r.data_wait_share or 0.0 for r in known if r is not worst)
    typical = others[len(others) // 2]
    if (worst.data_wait_share or 0.0) - typical < STRAGGLER_GAP_SHARE:
        return None
    return (
        f"rank {worst.rank} straggles: waits for data {worst.data_wait_share:.0%} of its "
        f"steps, the others {typical:.0%}"
    )


def _samples_per_s(windows: Iterable[deque[StepRecord]]) -> float | None:
    total = 0.0
    known = False
    for window in windows:
        samples = [s for s in window if s.samples is not None]
        duration = sum(s.duration_s for s in samples)
        if samples and duration > 0:
            total += sum(s.samples or 0 for s in samples) / duration
            known = True
    return total if known else None
