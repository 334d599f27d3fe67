"""The run record: what one ``trainmedic run`` measured, as typed records.

Producers (the probe inside the job, the samplers in the supervisor) emit
these; the record store (:mod:`trainmedic.record.store`) keeps them bounded on
disk; diagnosis and reports read them back as a :class:`RunRecord`. Every
record is a frozen dataclass with a ``t`` field: Unix time in seconds.
The on-disk format is documented in docs/run-record.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind


@dataclass(frozen=True)
class StepRecord:
    """One training step of one process, ending at ``t``.

    Attributes:
        step: 1-based step number within the process (the attempt).
        t: Unix time at the end of the step, seconds.
        duration_s: time since the previous step ended (or since the first
            step began, for the first), seconds.
        data_wait_s: time the loop was blocked waiting for the next batch
            (DataLoader ``__next__``; for scripts without a DataLoader, host time
            between steps outside forward/backward/optimizer), seconds.
        compute_s: host time inside forward, backward and the optimizer, seconds.
        gpu_time_s: GPU time of the step from CUDA events (read without extra
            synchronisation, so it may arrive with a later step), or ``None``.
        samples: samples in the step's batch, when known.
        source: what marked the step: ``optimizer``, ``backward`` or ``api``.
        phase: ``train`` unless the script or a heuristic says ``eval``,
            ``checkpoint`` or another name.
        pid / rank: process id and distributed rank (``None`` outside DDP).
        alloc_peak_bytes / reserved_peak_bytes: CUDA allocator peaks in the step.
        alloc_retries / ooms: cumulative ``num_alloc_retries`` / ``num_ooms``.
        autocast: whether autocast was active during the step.
    """

    step: int
    t: float
    duration_s: float
    data_wait_s: float = 0.0
    compute_s: float | None = None
    gpu_time_s: float | None = None
    samples: int | None = None
    source: str = "optimizer"
    phase: str = "train"
    pid: int = 0
    rank: int | None = None
    alloc_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    autocast: bool | None = None


@dataclass(frozen=True)
class StepWindow:
    """Aggregate of consecutive ordinary steps, kept when single steps are dropped.

    A long run keeps every anomalous step exactly and folds the rest into
    windows, which bounds the record (docs/run-record.md).

    Attributes:
        t_start / t: first step's start and last step's end, Unix seconds.
        count: steps folded in.
        duration_sum_s / data_wait_sum_s / compute_sum_s / gpu_time_sum_s: sums, seconds.
        duration_min_s / duration_max_s: extremes, seconds.
        samples_sum: samples over the window (``None`` when unknown).
        compute_count / compute_duration_sum_s: how many of its steps had a compute
            time, and their summed durations, seconds - a share of compute is
            ``compute_sum_s`` over the latter (steps timed without the compute
            hooks have none). ``None`` (records before them): every step had one.
        gpu_time_count / gpu_time_duration_sum_s: the same for GPU time (CUDA
            events arrive late, and a step whose events were not ready has none).
    """

    t_start: float
    t: float
    count: int
    first_step: int
    last_step: int
    duration_sum_s: float
    duration_min_s: float
    duration_max_s: float
    data_wait_sum_s: float
    compute_sum_s: float | None = None
    gpu_time_sum_s: float | None = None
    samples_sum: int | None = None
    pid: int = 0
    phase: str = "train"
    compute_count: int | None = None
    compute_duration_sum_s: float | None = None
    gpu_time_count: int | None = None
    gpu_time_duration_sum_s: float | None = None


@dataclass(frozen=True)
class LoaderInfo:
    """A DataLoader the job created, with the settings that matter for speed."""

    t: float
    pid: int
    loader_id: int
    num_workers: int
    batch_size: int | None
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    dataset_type: str | None = None
    dataset_len: int | None = None


@dataclass(frozen=True)
class LoaderActivity:
    """Where data-loading time went, from sampling stacks of loader threads/workers.

    Attributes:
        counts: samples per state: ``transform`` (computing), ``file_read``,
            ``socket_wait``, ``ipc_wait``, ``idle``, ``other``.
        top_frames: most frequent leaf frames, ``"file:line func" -> samples``.
        handoff: while the training thread waited on other threads or processes
            (a pool's futures, a queue, an event loop elsewhere): ``waits``, the
            samples of it that waited so, and what the others did meanwhile,
            ``thread:<state>`` / ``process:<state>`` observations
            (:mod:`trainmedic.probe.handoff`); empty when it never did.
        helper_frames: those threads' most frequent frames while they worked.
    """

    t: float
    pid: int
    counts: Mapping[str, int]
    top_frames: Mapping[str, int] = field(default_factory=dict)
    handoff: Mapping[str, int] = field(default_factory=dict)
    helper_frames: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HostSample:
    """One host reading taken by the supervisor.

    Attributes:
        job_cpu_pct: CPU of the job's whole process tree, percent of one core
            (400 = four cores busy).
        job_rss_bytes: resident memory of the job's process tree.
        job_processes: processes in the tree (DataLoader workers included).
        system_cpu_pct: whole-machine CPU, percent of all logical cores.
        usable_cores: cores the job may use (affinity, cgroup quota).
        iowait_pct: share of CPU time waiting on I/O, percent.
        disk_read_bytes_per_s / net_recv_bytes_per_s: rates since the last sample.
        others_cpu_pct: CPU of processes outside the job, percent of one core.
        cgroup_throttled_s: the job's cgroup's cumulative throttled time, seconds.
        steal_pct: CPU time the hypervisor gave to other virtual machines, percent
            of all logical cores (0 on bare metal).
        train_threads .. job_threads: the job's threads over the period since the
            previous reading, from the kernel's per-thread scheduler counters
            (:mod:`trainmedic.host.schedstat`), in *cores* (seconds per second:
            0.5 is half a core, or two threads a quarter each); ``None`` when
            not measured.
        train_threads: training threads measured: the main thread of each process
            that marks training steps.
        train_cpu_cores / train_wait_cores: their time on a CPU / waiting in a
            run queue for one (runnable, but no CPU ran them), summed.
        train_wait_max_share: the largest share of the period one training
            thread spent waiting for a CPU, 0..1.
        helper_cpu_cores / helper_wait_cores: the other threads of the training
            processes (torch's intra-op pool, the pin-memory thread, ...).
        loader_cpu_cores / loader_wait_cores: every thread of the DataLoader
            worker processes.
        job_wait_cores: every thread of the job's process tree, waiting.
        job_threads: threads in the job's process tree.
        tool_cpu_pct: trainmedic's own CPU on this host (the supervisor and the
            processes it runs, such as py-spy sampling the job), percent of one
            core; it is in neither ``job_cpu_pct`` nor ``others_cpu_pct``.
    """

    t: float
    job_cpu_pct: float
    job_rss_bytes: int
    job_processes: int
    system_cpu_pct: float
    usable_cores: float
    iowait_pct: float | None
    disk_read_bytes_per_s: float | None
    disk_write_bytes_per_s: float | None
    net_recv_bytes_per_s: float | None
    net_sent_bytes_per_s: float | None
    mem_available_bytes: int
    swap_used_bytes: int
    others_cpu_pct: float | None = None
    cgroup_throttled_s: float | None = None
    steal_pct: float | None = None
    train_threads: int | None = None
    train_cpu_cores: float | None = None
    train_wait_cores: float | None = None
    train_wait_max_share: float | None = None
    helper_cpu_cores: float | None = None
    helper_wait_cores: float | None = None
    loader_cpu_cores: float | None = None
    loader_wait_cores: float | None = None
    job_wait_cores: float | None = None
    job_threads: int | None = None
    tool_cpu_pct: float | None = None


@dataclass(frozen=True)
class RunEvent:
    """Something that happened once: a process start, a probe part disabled,
    an exception, a stall, a restart.

    Attributes:
        kind: what happened (:class:`~trainmedic.record.events.EventKind`).
        message: one line for a person.
        data: details (traceback text, part name, ...).
    """

    t: float
    kind: EventKind
    message: str
    pid: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunMeta:
    """The run as a whole.

    Attributes:
        command: the user's command, as argv.
        started_at / ended_at: Unix seconds (``ended_at`` is ``None`` while running).
        exit_code: the job's exit code (negative: killed by that signal).
        environment: doctor's facts at start (GPUs, host), as JSON-ready data.
    """

    run_id: str
    command: tuple[str, ...]
    cwd: str
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    trainmedic_version: str = ""
    gpu_backend: str = "none"
    environment: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord:
    """A whole run in memory, as diagnosis and reports read it."""

    meta: RunMeta
    steps: list[StepRecord] = field(default_factory=list)
    windows: list[StepWindow] = field(default_factory=list)
    loaders: list[LoaderInfo] = field(default_factory=list)
    loader_activity: list[LoaderActivity] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    host: list[HostSample] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)
