"""Builders of run records, steps, GPU and host samples and loader facts, shared by every test.

Every builder takes the few numbers a test is about and fills the rest with a
plausible healthy default, so a test reads as the situation it describes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar

from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.gpu.types import GpuProcess, GpuSample
from trainmedic.host.types import CpuFacts, HostFacts, MemoryFacts, ShmFacts
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunEvent,
    RunMeta,
    RunRecord,
    StepRecord,
    StepWindow,
)

T0 = 1_700_000_000.0
JOB_PID = 4242
GIB = 1 << 30
MIB = 1 << 20

S = TypeVar("S", GpuSample, HostSample)


def make_steps(
    n: int,
    duration: float = 0.1,
    wait: float = 0.0,
    *,
    durations: Sequence[float] | None = None,
    compute: float | None = None,
    gpu_time: float | None = None,
    samples: int | None = None,
    pid: int = JOB_PID,
    rank: int | None = None,
    start: float = T0,
    first_step: int = 1,
    phase: str = "train",
    autocast: bool | None = None,
    **fields: Any,
) -> list[StepRecord]:
    """``n`` consecutive steps of ``duration`` seconds (or ``durations``), each waiting
    ``wait`` seconds for data, starting at ``start``."""
    seq = list(durations) if durations is not None else [duration] * n
    steps, t = [], start
    for i, d in enumerate(seq):
        t += d
        steps.append(
            StepRecord(
                step=first_step + i,
                t=t,
                duration_s=d,
                data_wait_s=min(wait, d),
                compute_s=compute,
                gpu_time_s=gpu_time,
                samples=samples,
                pid=pid,
                rank=rank,
                phase=phase,
                autocast=autocast,
                **fields,
            )
        )
    return steps


def make_window(
    after: Sequence[StepRecord],
    count: int,
    duration: float,
    wait: float = 0.0,
    *,
    duration_max: float | None = None,
) -> StepWindow:
    """``count`` folded steps of ``duration`` seconds right after the steps ``after``."""
    last = after[-1]
    return StepWindow(
        t_start=last.t,
        t=last.t + count * duration,
        count=count,
        first_step=last.step + 1,
        last_step=last.step + count,
        duration_sum_s=count * duration,
        duration_min_s=duration,
        duration_max_s=duration if duration_max is None else duration_max,
        data_wait_sum_s=count * wait,
        pid=last.pid,
    )


def make_gpu(
    t: float = T0,
    *,
    index: int = 0,
    job_pids: Iterable[int] = (JOB_PID,),
    others: Iterable[GpuProcess] = (),
    **fields: Any,
) -> GpuSample:
    """One reading of a busy, cool H100 running the job's processes."""
    base: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index:04d}",
        "memory_total_bytes": 80 * GIB,
        "memory_used_bytes": 40 * GIB,
        "utilization_gpu_pct": 95.0,
        "utilization_memory_pct": 40.0,
        "temperature_c": 62.0,
        "temperature_slowdown_c": 87.0,
        "temperature_shutdown_c": 92.0,
        "power_draw_w": 550.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980.0,
        "sm_clock_max_mhz": 1980.0,
        "clock_event_reasons": 0,
        "compute_capability": (9, 0),
        "processes": tuple(
            GpuProcess(pid=p, used_memory_bytes=38 * GIB, user="alice", name="python")
            for p in job_pids
        )
        + tuple(others),
    }
    base.update(fields)
    return GpuSample(timestamp=t, index=index, **base)


def make_gpu_series(
    n: int, *, start: float = T0, period: float = 1.0, **fields: Any
) -> list[GpuSample]:
    """``n`` readings ``period`` seconds apart, the first at ``start + period``."""
    return [make_gpu(start + (i + 1) * period, **fields) for i in range(n)]


def make_host(t: float = T0, **fields: Any) -> HostSample:
    """One host reading: a job using 2 of 16 usable cores on a quiet machine."""
    base: dict[str, Any] = {
        "job_cpu_pct": 200.0,
        "job_rss_bytes": 6 * GIB,
        "job_processes": 5,
        "system_cpu_pct": 15.0,
        "usable_cores": 16.0,
        "iowait_pct": 0.5,
        "disk_read_bytes_per_s": 5.0 * MIB,
        "disk_write_bytes_per_s": 0.0,
        "net_recv_bytes_per_s": 0.1 * MIB,
        "net_sent_bytes_per_s": 0.1 * MIB,
        "mem_available_bytes": 100 * GIB,
        "swap_used_bytes": 0,
        "others_cpu_pct": 10.0,
    }
    base.update(fields)
    return HostSample(t=t, **base)


def make_host_series(
    n: int, *, start: float = T0, period: float = 1.0, **fields: Any
) -> list[HostSample]:
    return [make_host(start + (i + 1) * period, **fields) for i in range(n)]


def during(samples: Sequence[S], t_from: float, t_to: float, **fields: Any) -> list[S]:
    """The series with ``fields`` changed in the readings timed within [t_from, t_to]."""
    out: list[S] = []
    for s in samples:
        t = s.timestamp if isinstance(s, GpuSample) else s.t
        out.append(replace(s, **fields) if t_from <= t <= t_to else s)
    return out


def make_loader(
    num_workers: int = 8,
    *,
    batch_size: int | None = 64,
    pid: int = JOB_PID,
    pin_memory: bool = True,
    prefetch_factor: int | None = 2,
    dataset_len: int | None = 50_000,
    loader_id: int = 1,
) -> LoaderInfo:
    return LoaderInfo(
        t=T0,
        pid=pid,
        loader_id=loader_id,
        num_workers=num_workers,
        batch_size=batch_size,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        persistent_workers=num_workers > 0,
        dataset_type="map",
        dataset_len=dataset_len,
    )


def make_activity(t: float = T0 + 10.0, pid: int = JOB_PID + 1, **counts: int) -> LoaderActivity:
    """Stack samples of loader workers per state, e.g. ``file_read=80, transform=10``."""
    return LoaderActivity(t=t, pid=pid, counts=counts)


def make_handoff(
    t: float = T0 + 10.0,
    pid: int = JOB_PID,
    *,
    waits: int,
    threads: Mapping[str, int] | None = None,
    processes: Mapping[str, int] | None = None,
    in_flight: float | None = None,
    own: Mapping[str, int] | None = None,
    frames: Mapping[str, int] | None = None,
    server: Mapping[str, int] | None = None,
    server_running: int = 0,
    peer: str = "4242 python store.py --port 7000",
    answered: int = 0,
) -> LoaderActivity:
    """Samples of a training thread between steps (no DataLoader) that waited ``waits``
    times on other threads or processes (``ipc_wait``, plus its ``own`` other states),
    and what those did meanwhile: ``threads``/``processes`` observations by state
    (``socket=40, idle=4``). ``in_flight``: requests in flight summed over them (default:
    one per thread or process in ``socket`` or ``file``). ``server``: observations of the
    process ``peer`` at the far end of their sockets, by activity, with ``server_running``
    of its threads on a CPU over them. ``answered``: of the ``waits``, those whose wait
    was already answered, the helpers not looked at."""
    threads, processes = dict(threads or {}), dict(processes or {})
    handoff: dict[str, int] = {"waits": waits}
    if answered:
        handoff["delivered"] = answered
    handoff.update({f"thread:{k}": v for k, v in threads.items()})
    handoff.update({f"process:{k}": v for k, v in processes.items()})
    io = sum(obs.get(k, 0) for obs in (threads, processes) for k in ("socket", "file"))
    handoff["in_flight"] = int(io if in_flight is None else in_flight)
    if server:
        handoff.update({f"server:{k}": v for k, v in server.items()})
        handoff["server_running"] = server_running
        handoff[f"peer:{peer}"] = sum(server.values())
    counts = {"ipc_wait": waits, **(own or {})}
    return LoaderActivity(t=t, pid=pid, counts=counts, handoff=handoff,
                          helper_frames=dict(frames or {}))  # fmt: skip


def make_event(
    kind: str, message: str = "", t: float = T0 + 1.0, pid: int | None = JOB_PID, **data: Any
) -> RunEvent:
    return RunEvent(t=t, kind=kind, message=message, pid=pid, data=data)


def make_record(
    steps: Iterable[StepRecord] = (),
    *,
    windows: Iterable[StepWindow] = (),
    gpu: Iterable[GpuSample] = (),
    host: Iterable[HostSample] = (),
    loaders: Iterable[LoaderInfo] = (),
    activity: Iterable[LoaderActivity] = (),
    events: Iterable[RunEvent] = (),
    exit_code: int | None = 0,
    started_at: float = T0,
    ended_at: float | Literal["after_steps"] | None = "after_steps",
    meta: RunMeta | None = None,
) -> RunRecord:
    """A run record; its meta says the run ended a second after its last step
    (``ended_at=None``: a run still open), unless ``meta`` is given whole."""
    steps = list(steps)
    if ended_at == "after_steps":
        ended_at = max([s.t for s in steps] + [started_at]) + 1.0
    if meta is None:
        meta = RunMeta(
            run_id="test-run",
            command=("python", "train.py"),
            cwd="/work",
            started_at=started_at,
            ended_at=ended_at,
            exit_code=exit_code,
            gpu_backend="simulated",
        )
    return RunRecord(
        meta=meta,
        steps=steps,
        windows=list(windows),
        loaders=list(loaders),
        loader_activity=list(activity),
        gpu=list(gpu),
        host=list(host),
        events=list(events),
    )


def make_machine(
    *,
    cores: int = 16,
    shm_total: int | None = 32 * GIB,
    user: str = "alice",
    gpus: Sequence[GpuSample] = (),
) -> MachineFacts:
    """Doctor's facts of a machine with ``cores`` cores and ``shm_total`` bytes of /dev/shm."""
    return MachineFacts(
        host=HostFacts(
            hostname="node1",
            user=user,
            cpu=CpuFacts(logical_cores=cores),
            memory=MemoryFacts(total_bytes=256 * GIB, available_bytes=200 * GIB),
            shm=None if shm_total is None else ShmFacts("/dev/shm", shm_total, shm_total),
        ),
        gpu=GpuFacts(backend="simulated", driver=None, samples=tuple(gpus)),
        torch=None,
    )


def ids(findings: Iterable[Any]) -> list[str]:
    return [f.id for f in findings]
