"""Gather :class:`HostFacts` from this machine in a fraction of a second.

CPU busy shares and per-process CPU are rates, so the host is read twice,
``window_s`` apart (0.2 s by default: doctor answers in under two seconds in
all). Everything the operating system is asked goes through a
:class:`~trainmedic.host.system.SystemProbe` (psutil, ``os`` and ``/proc`` in
:class:`~trainmedic.host.system.PsutilProbe`), the cgroup
through a filesystem ``root``, and the environment through a mapping, so tests
can stand in for each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from trainmedic.host.cgroup import CgroupState, read_cgroup
from trainmedic.host.system import CpuTimes, MemoryReading, ProcessReading, PsutilProbe, SystemProbe
from trainmedic.host.types import CpuFacts, HostFacts, HostProcess, MemoryFacts, ShmFacts

DEFAULT_WINDOW_S = 0.2
"""Seconds between the two readings; long enough for 100 Hz CPU accounting."""

TOP_PROCESSES = 5
"""Processes of other users kept in the facts, per ranking (CPU and memory)."""

TRAINING_ENV_VARS: tuple[str, ...] = (
    # Thread pools that default to os.cpu_count()-ish sizes and oversubscribe
    # a CPU-limited container (OpenMP also drives torch's intra-op pool).
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    # Debugging switches that cost speed when left on.
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "TORCH_DISTRIBUTED_DEBUG",
    # Allocator configuration (PYTORCH_ALLOC_CONF is the newer, device-generic name).
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    # Which GPUs the job sees, and in what order.
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    # Collective-communication settings that change the data path between GPUs.
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_DEBUG",
    # Reported for context: they only change what an error prints.
    "TORCH_SHOW_CPP_STACKTRACES",
)
"""Environment variables doctor reports; see docs/doctor-checks.md for why each."""


def gather_host_facts(
    probe: SystemProbe | None = None,
    *,
    root: str = "/",
    shm_path: str = "/dev/shm",
    environ: Mapping[str, str] | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
) -> HostFacts:
    """Read the host: cores and their limits, load, memory, /dev/shm, env, other users.

    Args:
        probe: the operating system (default: :class:`PsutilProbe`).
        root: filesystem root the cgroup files are read under.
        shm_path: the shared-memory filesystem DataLoader workers use.
        environ: the environment to report from (default: ``os.environ``).
        window_s: seconds between the two readings rates are computed from.
        sleep / clock: wait and monotonic time, seconds.
        wall_clock: Unix time, seconds (compared with process start times).
    """
    probe = probe if probe is not None else PsutilProbe()
    environ = environ if environ is not None else os.environ
    uid, user = probe.current_user()
    logical = probe.logical_cores()

    started = clock()
    window_start = wall_clock()
    cpu_before = probe.cpu_times()
    memory_before = probe.memory()
    processes_before = {p.pid: p for p in probe.processes()}
    sleep(window_s)
    processes_after = list(probe.processes())
    cpu_after = probe.cpu_times()
    memory_after = probe.memory()
    elapsed_s = max(clock() - started, 1e-6)

    cgroup = read_cgroup(root)
    rates = _process_rates(processes_before, processes_after, elapsed_s)
    others = [(p, pct) for p, pct in rates if not _is_own(p, uid)]
    own_cores, others_cores = _busy_cores_by_owner(
        processes_before, processes_after, uid, window_start, elapsed_s
    )
    # Memory is a level, not a rate: every process of the second reading counts.
    others_rss = sum(p.rss_bytes for p in processes_after if not _is_own(p, uid))

    cpu = CpuFacts(
        logical_cores=logical,
        affinity_cores=probe.affinity_cores(),
        cgroup_quota_cores=cgroup.cpu.quota_cores if cgroup.cpu else None,
        throttled_periods=cgroup.cpu.throttled_periods if cgroup.cpu else None,
        total_periods=cgroup.cpu.periods if cgroup.cpu else None,
        throttled_s=cgroup.cpu.throttled_s if cgroup.cpu else None,
        load_avg_1m=probe.load_avg_1m(),
        busy_pct=_share_pct(cpu_before.busy_s, cpu_after.busy_s, cpu_before, cpu_after),
        others_busy_cores=others_cores,
        own_busy_cores=own_cores if uid is not None else None,
        steal_pct=(
            _share_pct(cpu_before.steal_s, cpu_after.steal_s, cpu_before, cpu_after)
            if cpu_before.steal_s is not None and cpu_after.steal_s is not None
            else None
        ),
    )
    return HostFacts(
        hostname=probe.hostname(),
        user=user,
        cpu=cpu,
        memory=_memory_facts(memory_before, memory_after, elapsed_s, cgroup, others_rss),
        shm=read_shm(shm_path),
        env={name: environ[name] for name in TRAINING_ENV_VARS if name in environ},
        top_processes=_top_processes(others),
    )


def read_shm(path: str = "/dev/shm") -> ShmFacts | None:
    """Size and free space of the shared-memory filesystem, ``None`` when absent."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return ShmFacts(
        path=path,
        total_bytes=st.f_blocks * st.f_frsize,
        free_bytes=st.f_bavail * st.f_frsize,
    )


def _is_own(proc: ProcessReading, uid: int | None) -> bool:
    """Owned by the current user; with no user id to compare, nothing is."""
    return uid is not None and proc.uid == uid


_START_TIME_SLACK_S = 1.0
"""Process start times are kept in clock ticks since boot; converting them to
Unix time can be off by a fraction of a second."""


def _share_pct(before: float, after: float, cpu_before: CpuTimes, cpu_after: CpuTimes) -> float:
    """Growth of one CPU-time counter as a percentage of all CPU time in between."""
    total = cpu_after.total_s - cpu_before.total_s
    if total <= 0:
        return 0.0
    return max(0.0, min(100.0, (after - before) / total * 100.0))


def _busy_cores_by_owner(
    before: Mapping[int, ProcessReading],
    after: list[ProcessReading],
    uid: int | None,
    window_start: float,
    elapsed_s: float,
) -> tuple[float, float]:
    """CPU used in the window by the user's processes and by everyone else's, in cores.

    Short-lived processes (shell pipelines, compiler jobs, restarted workers)
    would slip between two readings; once reaped, their CPU appears in the
    parent's children time. So each process counts with its reaped children,
    a process born in the window counts whole, and a process that exited
    counts minus what it had used before the window (its parent's children
    time now holds its whole life).
    """
    own = others = 0.0

    def add(proc: ProcessReading, seconds: float) -> None:
        nonlocal own, others
        if _is_own(proc, uid):
            own += seconds
        else:
            others += seconds

    seen: set[int] = set()
    for proc in after:
        prev = before.get(proc.pid)
        total = proc.cpu_s + proc.children_cpu_s
        if prev is not None and prev.started_at == proc.started_at:
            seen.add(proc.pid)
            add(proc, total - (prev.cpu_s + prev.children_cpu_s))
        elif proc.started_at >= window_start - _START_TIME_SLACK_S:
            add(proc, total)
    for pid, prev in before.items():
        if pid not in seen:
            add(prev, -(prev.cpu_s + prev.children_cpu_s))
    return max(0.0, own) / elapsed_s, max(0.0, others) / elapsed_s


def _process_rates(
    before: Mapping[int, ProcessReading], after: Iterable[ProcessReading], elapsed_s: float
) -> list[tuple[ProcessReading, float]]:
    """(process, CPU percent of one core) for processes seen in both readings.

    A process born inside the window is left out: it cannot have used more
    than ``elapsed_s`` of CPU per thread yet, and one missing from the first
    reading for another reason would be charged its whole lifetime.
    """
    out: list[tuple[ProcessReading, float]] = []
    for proc in after:
        prev = before.get(proc.pid)
        if prev is None or prev.started_at != proc.started_at:
            continue
        out.append((proc, max(0.0, proc.cpu_s - prev.cpu_s) / elapsed_s * 100.0))
    return out


def _memory_facts(
    before: MemoryReading,
    after: MemoryReading,
    elapsed_s: float,
    cgroup: CgroupState,
    others_rss_bytes: int,
) -> MemoryFacts:
    limit = cgroup.memory.limit_bytes if cgroup.memory else None
    if limit is not None and limit >= after.total_bytes:
        limit = None  # a limit above the RAM never binds before the host runs out
    return MemoryFacts(
        total_bytes=after.total_bytes,
        available_bytes=after.available_bytes,
        swap_total_bytes=after.swap_total_bytes,
        swap_used_bytes=after.swap_used_bytes,
        cgroup_limit_bytes=limit,
        cgroup_usage_bytes=cgroup.memory.usage_bytes if cgroup.memory else None,
        cgroup_working_set_bytes=cgroup.memory.working_set_bytes if cgroup.memory else None,
        cgroup_oom_kills=cgroup.memory.oom_kills if cgroup.memory else None,
        others_rss_bytes=others_rss_bytes,
        swap_in_bytes_per_s=_rate(before.swap_in_bytes, after.swap_in_bytes, elapsed_s),
        swap_out_bytes_per_s=_rate(before.swap_out_bytes, after.swap_out_bytes, elapsed_s),
    )


def _rate(before: int | None, after: int | None, elapsed_s: float) -> float | None:
    if before is None or after is None:
        return None
    return max(0, after - before) / elapsed_s


def _top_processes(others: list[tuple[ProcessReading, float]]) -> tuple[HostProcess, ...]:
    """The busiest by CPU and the largest by memory, busiest first, no duplicates."""
    by_cpu = sorted((o for o in others if o[1] > 0), key=lambda o: -o[1])[:TOP_PROCESSES]
    by_rss = sorted((o for o in others if o[0].rss_bytes > 0), key=lambda o: -o[0].rss_bytes)[
        :TOP_PROCESSES
    ]
    chosen: dict[int, tuple[ProcessReading, float]] = {}
    for proc, pct in [*by_cpu, *by_rss]:
        chosen.setdefault(proc.pid, (proc, pct))
    ranked = sorted(chosen.values(), key=lambda o: (-o[1], -o[0].rss_bytes, o[0].pid))
    return tuple(
        HostProcess(
            pid=p.pid, user=p.user, name=p.name, cpu_pct=round(pct, 1), rss_bytes=p.rss_bytes
        )
        for p, pct in ranked
    )
