"""Metrics for a fleet: what ``trainmedic run --prometheus`` serves.

:class:`MetricsState` is one more record sink (next to the run record's
writer and the live view): it keeps, per rank, a step counter and the last
:data:`WINDOW_STEPS` steps; per GPU, the latest reading; the job's CPU; and
the incidents (attempts, restarts, hangs) and findings the run produced so
far. :class:`MetricsCollector` turns a snapshot of it into Prometheus
metric families when a scraper asks. The names and labels are documented
in docs/metrics.md.

The work per scrape is bounded: one copy of the state under a lock, then
O(ranks × :data:`WINDOW_STEPS` + GPUs) arithmetic outside it. Nothing here
touches the job or blocks the supervisor: sinks only append under a lock,
and the HTTP server runs in its own thread (:mod:`.metrics_server`).
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainmedic.findings.model import Finding
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind
from trainmedic.record.types import HostSample, RunEvent, StepRecord
from trainmedic.resilience.incidents import ATTEMPT_END, HANG_DETECTED
from trainmedic.supervise.loop.attempt_state import AttemptNow, AttemptState
from trainmedic.supervise.observe.processes import IgnoringSink

WINDOW_STEPS = 50
"""Recent steps per rank that rates, shares and the step time are taken over."""
PREFIX = "trainmedic_"


@dataclass
class _Rank:
    """One rank (or the lead process of a job without ranks)."""

    rank: int | None
    local_rank: int | None = None
    pid: int = 0
    steps_total: int = 0
    last_step_t: float | None = None
    window: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS))


@dataclass(frozen=True)
class RankNow:
    """One rank's figures at a scrape."""

    rank: int | None
    local_rank: int | None
    steps_total: int
    last_step_t: float | None
    steps_per_s: float | None
    step_time_s: float | None
    samples_per_s: float | None
    data_wait_ratio: float | None
    compute_ratio: float | None


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape reports, copied out of :class:`MetricsState`."""

    node: str
    run_id: str
    started_at: float
    ranks: tuple[RankNow, ...]
    gpus: tuple[GpuSample, ...]
    host: HostSample | None
    attempts: int
    restarts: dict[str, int]
    hangs: int
    findings: dict[tuple[str, str], int]
    warnings: int
    attempt_state: str | None = None


class MetricsState(IgnoringSink):
    """The record sink behind the exporter; thread-safe.

    Args:
        run_id: the run directory's name (a label of ``trainmedic_run_info``).
        node: the host's name (the ``node`` label); default ``socket.gethostname()``.
        warnings: the live view's current warnings (a seam; none by default).
    """

    def __init__(
        self,
        run_id: str,
        node: str | None = None,
        started_at: float | None = None,
        warnings: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.run_id = run_id
        self.node = node or socket.gethostname()
        self.started_at = time.time() if started_at is None else started_at
        self.warnings = warnings
        self._lock = threading.Lock()
        self._ranks: dict[int | None, _Rank] = {}
        self._pid_rank: dict[int, tuple[int | None, int | None]] = {}
        self._lead_unranked: int | None = None
        self._gpus: dict[int, GpuSample] = {}
        self._host: HostSample | None = None
        self._attempts = 0
        self._restarts: Counter[str] = Counter()
        self._hangs = 0
        self._incident_findings: Counter[tuple[str, str]] = Counter()
        self._final: Counter[tuple[str, str]] | None = None
        self._attempt_state: str | None = None

    # --- the sink ---------------------------------------------------------------------------

    def add_step(self, step: StepRecord) -> None:
        if step.phase != "train":
            return
        with self._lock:
            known = self._pid_rank.get(step.pid)
            rank = step.rank if step.rank is not None else (known[0] if known else None)
            if rank is None:
                # A job without ranks: the first process that steps stands for it.
                if self._lead_unranked is None:
                    self._lead_unranked = step.pid
                if step.pid != self._lead_unranked:
                    return
            entry = self._ranks.get(rank)
            if entry is None:
                entry = self._ranks[rank] = _Rank(rank)
            if entry.pid != step.pid:
                entry.pid = step.pid
                entry.window.clear()  # a new attempt's process: its own rates
            if known is not None and known[1] is not None:
                entry.local_rank = known[1]
            entry.steps_total += 1
            entry.last_step_t = step.t
            entry.window.append(step)

    def add_gpu(self, sample: GpuSample) -> None:
        with self._lock:
            self._gpus[sample.index] = sample

    def add_host(self, sample: HostSample) -> None:
        with self._lock:
            self._host = sample

    def add_event(self, event: RunEvent) -> None:
        with self._lock:
            if event.kind == EventKind.PROCESS_START and event.pid is not None:
                rank, local = event.data.get("rank"), event.data.get("local_rank")
                self._pid_rank[event.pid] = (
                    rank if isinstance(rank, int) else None,
                    local if isinstance(local, int) else None,
                )
            elif event.kind == EventKind.JOB_START:
                self._attempts += 1
            elif event.kind == HANG_DETECTED:
                self._hangs += 1
            elif event.kind == ATTEMPT_END:
                data = event.data
                if data.get("restarted"):
                    self._restarts[str(data.get("failure_class") or "unknown")] += 1
                finding = data.get("finding")
                if isinstance(finding, dict):
                    key = (str(finding.get("severity")), str(finding.get("category")))
                    self._incident_findings[key] += 1

    def attempt_changed(self, now: AttemptNow) -> None:
        """Listens to the restart loop (:class:`~.attempt_state.AttemptTracker`)."""
        with self._lock:
            self._attempt_state = None if now.state is None else str(now.state)

    def set_findings(self, findings: Sequence[Finding]) -> None:
        """The run's final diagnosis (replaces the incidents' findings in the counts)."""
        counts: Counter[tuple[str, str]] = Counter(
            (f.severity.value, f.category.value) for f in findings
        )
        with self._lock:
            self._final = counts

    # --- a scrape -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            ranks = [(r.rank, r.local_rank, r.steps_total, r.last_step_t, list(r.window))
                     for r in self._ranks.values()]  # fmt: skip
            gpus = tuple(self._gpus[i] for i in sorted(self._gpus))
            host = self._host
            findings = dict(self._final if self._final is not None else self._incident_findings)
            attempts, restarts, hangs = self._attempts, dict(self._restarts), self._hangs
            attempt_state = self._attempt_state
        warnings = 0
        if self.warnings is not None:
            try:
                warnings = len(self.warnings())
            except Exception:
                warnings = 0
        return Snapshot(
            node=self.node,
            run_id=self.run_id,
            started_at=self.started_at,
            ranks=tuple(_rank_now(*r) for r in sorted(ranks, key=lambda r: (r[0] is None, r[0]))),
            gpus=gpus,
            host=host,
            attempts=attempts,
            restarts=restarts,
            hangs=hangs,
            findings=findings,
            warnings=warnings,
            attempt_state=attempt_state,
        )


def _rank_now(
    rank: int | None,
    local_rank: int | None,
    total: int,
    last_t: float | None,
    window: list[StepRecord],
) -> RankNow:
    duration = sum(s.duration_s for s in window)
    with_samples = [s for s in window if s.samples is not None]
    sample_time = sum(s.duration_s for s in with_samples)
    computed = [s for s in window if s.compute_s is not None]
    compute_time = sum(s.duration_s for s in computed)
    return RankNow(
        rank=rank,
        local_rank=local_rank,
        steps_total=total,
        last_step_t=last_t,
        steps_per_s=len(window) / duration if duration > 0 else None,
        step_time_s=statistics.median(s.duration_s for s in window) if window else None,
        samples_per_s=sum(s.samples or 0 for s in with_samples) / sample_time
        if sample_time > 0
        else None,
        data_wait_ratio=min(1.0, sum(s.data_wait_s for s in window) / duration)
        if duration > 0
        else None,
        compute_ratio=min(1.0, sum(s.compute_s or 0.0 for s in computed) / compute_time)
        if compute_time > 0
        else None,
    )


class MetricsCollector(Collector):
    """Prometheus metric families from :meth:`MetricsState.snapshot` (docs/metrics.md)."""

    def __init__(self, state: MetricsState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state.snapshot()
        node = s.node
        info = GaugeMetricFamily(
            PREFIX + "run_info", "The supervised run (value 1).", labels=["node", "run_id"]
        )
        info.add_metric([node, s.run_id], 1.0)
        yield info
        started = GaugeMetricFamily(
            PREFIX + "run_start_time_seconds", "Unix time the run started.", labels=["node"]
        )
        started.add_metric([node], s.started_at)
        yield started
        yield from _rank_families(s)
        yield from _gpu_families(s)
        yield from _incident_families(s)


def _labels(node: str, r: RankNow) -> list[str]:
    return [
        node,
        "" if r.rank is None else str(r.rank),
        "" if r.local_rank is None else str(r.local_rank),
    ]


def _rank_families(s: Snapshot) -> Iterator[Metric]:
    names = ["node", "rank", "local_rank"]
    steps = CounterMetricFamily(
        PREFIX + "steps", "Training steps completed, per rank (all attempts).", labels=names
    )
    last = GaugeMetricFamily(
        PREFIX + "last_step_timestamp_seconds",
        "Unix time the rank's last training step ended.",
        labels=names,
    )
    gauges = {
        "steps_per_second": "Training steps per second over the rank's last 50 steps.",
        "step_time_seconds": "Median step time over the rank's last 50 steps.",
        "samples_per_second": "Samples per second of the rank over its last 50 steps.",
        "data_wait_ratio": "Share of step time waiting for data, last 50 steps (0..1).",
        "compute_ratio": "Share of step time in forward/backward/optimizer, last 50 steps (0..1).",
    }
    families = {
        k: GaugeMetricFamily(PREFIX + k, text, labels=names) for k, text in gauges.items()
    }
    for r in s.ranks:
        labels = _labels(s.node, r)
        steps.add_metric(labels, float(r.steps_total))
        if r.last_step_t is not None:
            last.add_metric(labels, r.last_step_t)
        for key, value in (
            ("steps_per_second", r.steps_per_s),
            ("step_time_seconds", r.step_time_s),
            ("samples_per_second", r.samples_per_s),
            ("data_wait_ratio", r.data_wait_ratio),
            ("compute_ratio", r.compute_ratio),
        ):
            if value is not None:
                families[key].add_metric(labels, value)
    yield steps
    yield last
    yield from families.values()
    if s.host is not None:
        cpu = GaugeMetricFamily(
            PREFIX + "job_cpu_cores", "CPU used by the job's process tree, cores.", labels=["node"]
        )
        cpu.add_metric([s.node], s.host.job_cpu_pct / 100.0)
        yield cpu
        if s.host.others_cpu_pct is not None:
            others = GaugeMetricFamily(
                PREFIX + "others_cpu_cores", "CPU used by other processes, cores.", labels=["node"]
            )
            others.add_metric([s.node], s.host.others_cpu_pct / 100.0)
            yield others


def _gpu_families(s: Snapshot) -> Iterator[Metric]:
    names = ["node", "gpu", "uuid"]
    specs: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
        ("gpu_utilization_percent", "GPU utilization (NVML), percent.",
         lambda g: g.utilization_gpu_pct),
        ("gpu_memory_used_bytes", "GPU memory used, bytes.",
         lambda g: None if g.memory_used_bytes is None else float(g.memory_used_bytes)),
        ("gpu_memory_total_bytes", "GPU memory in all, bytes.",
         lambda g: None if g.memory_total_bytes is None else float(g.memory_total_bytes)),
        ("gpu_temperature_celsius", "GPU temperature, degrees Celsius.",
         lambda g: g.temperature_c),
        ("gpu_power_watts", "GPU power draw, watts.", lambda g: g.power_draw_w),
        ("gpu_sm_clock_hertz", "GPU SM clock, hertz.",
         lambda g: None if g.sm_clock_mhz is None else g.sm_clock_mhz * 1e6),
        ("gpu_slowdown", "1 while a clock event reason slows the GPU (heat, power), else 0.",
         lambda g: None if g.clock_event_reasons is None
         else float(bool(faults.active_reasons(g)))),
    ]  # fmt: skip
    for name, text, read in specs:
        family = GaugeMetricFamily(PREFIX + name, text, labels=names)
        for g in s.gpus:
            value = read(g)
            if value is not None:
                family.add_metric([s.node, str(g.index), g.uuid or ""], value)
        yield family


def _incident_families(s: Snapshot) -> Iterator[Metric]:
    attempts = CounterMetricFamily(
        PREFIX + "attempts", "Attempts of the job started (1 + restarts).", labels=["node"]
    )
    attempts.add_metric([s.node], float(s.attempts))
    yield attempts
    restarts = CounterMetricFamily(
        PREFIX + "restarts",
        "Restarts of the job, by the failure class of the attempt that ended.",
        labels=["node", "failure_class"],
    )
    for cls, n in sorted(s.restarts.items()):
        restarts.add_metric([s.node, cls], float(n))
    yield restarts
    hangs = CounterMetricFamily(
        PREFIX + "hangs", "Hangs detected (and stopped) by the watchdog.", labels=["node"]
    )
    hangs.add_metric([s.node], float(s.hangs))
    yield hangs
    if s.attempt_state is not None:
        # A state set, as Prometheus names one: 1 for the current state, 0 for the others.
        state = GaugeMetricFamily(
            PREFIX + "attempt_state",
            "The restart loop's state: 1 for the current one (starting, running, stopping, "
            "hung, winding_down, deciding, backing_off, done).",
            labels=["node", "state"],
        )
        for name in AttemptState:
            state.add_metric([s.node, name.value], float(name.value == s.attempt_state))
        yield state
    findings = GaugeMetricFamily(
        PREFIX + "findings",
        "Findings so far: the incidents' during the run, the whole diagnosis at its end.",
        labels=["node", "severity", "category"],
    )
    for (severity, category), n in sorted(s.findings.items()):
        findings.add_metric([s.node, severity, category], float(n))
    yield findings
    warnings = GaugeMetricFamily(
        PREFIX + "live_warnings", "Warnings the live view shows now.", labels=["node"]
    )
    warnings.add_metric([s.node], float(s.warnings))
    yield warnings


__all__ = ["WINDOW_STEPS", "MetricsCollector", "MetricsState", "RankNow", "Snapshot"]
