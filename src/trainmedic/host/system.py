"""The seam between host measurements and the operating system: CPU times, memory, processes.

:class:`SystemProbe` is what :func:`trainmedic.host.gather.gather_host_facts`
asks; :class:`PsutilProbe` answers from psutil, ``os`` and, on Linux, one read
of ``/proc/<pid>/stat`` per process (cheaper than psutil's several). Tests
stand in with their own probe.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from trainmedic.host import ps

# The /proc/<pid>/stat layout read here is Linux's; elsewhere psutil reads processes.
_DEFAULT_PROC_ROOT = "/proc" if sys.platform.startswith("linux") else None


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
        times = ps.cpu_times()
        total = sum(times)
        # guest time is already counted in user time on Linux.
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        steal = getattr(times, "steal", None)
        return CpuTimes(busy_s=total - idle - (steal or 0.0), total_s=total, steal_s=steal)

    def memory(self) -> MemoryReading:
        vm = ps.virtual_memory()
        swap = ps.swap_memory()
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
                self._boot_time_s = ps.boot_time()
        return self._boot_time_s

    def _processes_from_psutil(self) -> Iterator[ProcessReading]:
        attrs = ["pid", "name", "uids", "cpu_times", "memory_info", "create_time"]
        for proc in ps.process_iter(attrs, ad_value=None):
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
