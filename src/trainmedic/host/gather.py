"""Gather :class:`HostFacts` from this machine in a fraction of a second.

CPU busy shares and per-process CPU are rates, so the host is read twice,
``window_s`` apart (0.2 s by default: doctor answers in under two seconds in
all). Everything the operating system is asked goes through a
:class:`SystemProbe` (psutil and ``os`` in :class:`PsutilProbe`), the cgroup
through a filesystem ``root``, and the environment through a mapping, so tests
can stand in for each.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import psutil

from trainmedic.host.cgroup import CgroupState, read_cgroup
from trainmedic.host.types import CpuFacts, HostFacts, HostProcess, MemoryFacts, ShmFacts

# The /proc/<pid>/stat layout read here is Linux's; elsewhere psutil reads processes.
_DEFAULT_PROC_ROOT = "/proc" if sys.platform.startswith("linux") else None

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


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU time of the whole system, seconds summed over all cores.

    Attributes:
        busy_s: time not idle and not waiting for I/O (steal excluded).
        total_s: all time, steal included.
        steal_s: time the hypervisor ran other virtual machines, or ``None``.
    """

    busy_s: float
    total_s: float
    steal_s: float | None


@dataclass(frozen=True)
class MemoryReading:
    """Host memory and swap, bytes; ``swap_in/out_bytes`` are cumulative since boot."""

    total_bytes: int
    available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    swap_in_bytes: int | None
    swap_out_bytes: int | None


@dataclass(frozen=True)
class ProcessReading:
    """One process at one moment.

    Attributes:
        uid: real user id, ``None`` when unreadable.
        cpu_s: user + system CPU time since the process started, seconds.
        children_cpu_s: CPU time of its children that exited and were reaped,
            seconds (how the CPU of short-lived processes stays visible).
        started_at: creation time, Unix seconds (tells a reused pid from the
            same process).
    """

    pid: int
    uid: int | None
    user: str | None
    name: str
    cpu_s: float
    rss_bytes: int
    started_at: float
    children_cpu_s: float = 0.0


class SystemProbe(Protocol):
    """What :func:`gather_host_facts` asks the operating system."""

    def hostname(self) -> str: ...

    def current_user(self) -> tuple[int | None, str]:
        """(uid, name) of the user running trainmedic."""
        ...

    def logical_cores(self) -> int: ...

    def affinity_cores(self) -> int | None:
        """Cores this process may run on, ``None`` where the OS cannot say."""
        ...

    def load_avg_1m(self) -> float | None: ...

    def cpu_times(self) -> CpuTimes: ...

    def memory(self) -> MemoryReading: ...

    def processes(self) -> Iterable[ProcessReading]:
        """Every process visible, skipping those that vanish while being read."""
        ...


class PsutilProbe:
    """The real machine, through psutil and ``os``.

    On Linux, processes are read straight from ``/proc/<pid>/stat`` (one read
    and one ``stat`` per process, several times faster than psutil's generic
    path): hosts with thousands of processes and kernel threads must still be
    read twice within doctor's time budget.

    Args:
        proc_root: the procfs mount to read processes from, or ``None`` to use
            psutil (the default off Linux).
    """

    def __init__(self, proc_root: str | None = _DEFAULT_PROC_ROOT) -> None:
        self._user_names: dict[int, str] = {}
        self._proc_root = proc_root
        self._boot_time_s: float | None = None

    def hostname(self) -> str:
        return socket.gethostname()

    def current_user(self) -> tuple[int | None, str]:
        uid = os.getuid() if hasattr(os, "getuid") else None
        if uid is not None:
            return uid, self._user_name(uid)
        return None, os.environ.get("USERNAME") or os.environ.get("USER") or "unknown"

    def logical_cores(self) -> int:
        return os.cpu_count() or 1

    def affinity_cores(self) -> int | None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        return len(os.sched_getaffinity(0))

    def load_avg_1m(self) -> float | None:
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None

    def cpu_times(self) -> CpuTimes:
        times = psutil.cpu_times()
        total = sum(times)
        # guest time is already counted in user time on Linux.
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        steal = getattr(times, "steal", None)
        return CpuTimes(busy_s=total - idle - (steal or 0.0), total_s=total, steal_s=steal)

    def memory(self) -> MemoryReading:
        vm = psutil.virtual_memory()
        swap = psutil.swap_memory()
        return MemoryReading(
            total_bytes=vm.total,
            available_bytes=vm.available,
            swap_total_bytes=swap.total,
            swap_used_bytes=swap.used,
            swap_in_bytes=swap.sin,
            swap_out_bytes=swap.sout,
        )

    def processes(self) -> Iterable[ProcessReading]:
        if self._proc_root is not None:
            return self._processes_from_procfs(self._proc_root)
        return self._processes_from_psutil()

    def _processes_from_procfs(self, proc_root: str) -> Iterator[ProcessReading]:
        tick_hz = float(os.sysconf("SC_CLK_TCK"))
        page_bytes = os.sysconf("SC_PAGE_SIZE")
        boot_s = self._boot_time(proc_root)
        try:
            entries = list(os.scandir(proc_root))
        except OSError:
            return
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat"), "rb") as f:
                    data = f.read()
                # /proc/<pid> belongs to the process's (effective) user.
                uid = os.stat(entry.path).st_uid
            except OSError:
                continue  # exited while being read, or hidden (hidepid)
            user = self._user_name(uid)
            reading = _parse_proc_stat(
                int(entry.name), uid, user, data, tick_hz, page_bytes, boot_s
            )
            if reading is not None:
                yield reading

    def _boot_time(self, proc_root: str) -> float:
        if self._boot_time_s is None:
            self._boot_time_s = 0.0
            try:
                with open(os.path.join(proc_root, "stat"), encoding="ascii") as f:
                    for line in f:
                        if line.startswith("btime "):
                            self._boot_time_s = float(line.split()[1])
                            break
            except (OSError, ValueError):
                self._boot_time_s = psutil.boot_time()
        return self._boot_time_s

    def _processes_from_psutil(self) -> Iterator[ProcessReading]:
        attrs = ["pid", "name", "uids", "cpu_times", "memory_info", "create_time"]
        for proc in psutil.process_iter(attrs, ad_value=None):
            info = proc.info
            times = info.get("cpu_times")
            created = info.get("create_time")
            if times is None or created is None:
                continue
            uids = info.get("uids")
            uid = uids.real if uids is not None else None
            memory = info.get("memory_info")
            yield ProcessReading(
                pid=info["pid"],
                uid=uid,
                user=self._user_name(uid) if uid is not None else None,
                name=info.get("name") or "?",
                cpu_s=times.user + times.system,
                children_cpu_s=times.children_user + times.children_system,
                rss_bytes=memory.rss if memory is not None else 0,
                started_at=created,
            )

    def _user_name(self, uid: int) -> str:
        name = self._user_names.get(uid)
        if name is None:
            try:
                import pwd

                name = pwd.getpwuid(uid).pw_name
            except (ImportError, KeyError):
                name = str(uid)
            self._user_names[uid] = name
        return name


def _parse_proc_stat(
    pid: int, uid: int, user: str, data: bytes, tick_hz: float, page_bytes: int, boot_s: float
) -> ProcessReading | None:
    """One ``/proc/<pid>/stat`` line (proc(5)); ``None`` when malformed.

    The name sits in parentheses and may itself hold spaces and parentheses,
    so the fields are counted from the last ``)``. Its RSS is as approximate
    as ``statm``'s (the kernel batches the counters per CPU).
    """
    open_at, close_at = data.find(b"("), data.rfind(b")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = data[close_at + 2 :].split()
    if len(fields) < 22:
        return None
    try:
        utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
        start_ticks, rss_pages = int(fields[19]), int(fields[21])
    except ValueError:
        return None
    return ProcessReading(
        pid=pid,
        uid=uid,
        user=user,
        name=data[open_at + 1 : close_at].decode("utf-8", errors="replace") or "?",
        cpu_s=(utime + stime) / tick_hz,
        children_cpu_s=max(0, cutime + cstime) / tick_hz,
        rss_bytes=max(0, rss_pages) * page_bytes,
        started_at=boot_s + start_ticks / tick_hz,
    )


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
