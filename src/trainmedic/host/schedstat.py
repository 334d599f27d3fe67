"""Per-thread scheduler counters: how long each thread ran, and how long it waited for a CPU.

Linux keeps, for every thread, ``/proc/<pid>/task/<tid>/schedstat``: three
numbers, the time it spent on a CPU (ns), the time it spent runnable but
waiting in a run queue for a CPU (ns, the *run-queue delay*), and the number
of time slices it got. The run-queue delay is what contention costs a thread
directly: while it waits, the thread is ready to work and no CPU runs it, be
the CPU taken by another process, by the hypervisor (steal), or withheld by a
cgroup quota. Reading them costs a few microseconds per thread and needs no
privilege for one's own processes (kernels since 2.6.23 with ``CONFIG_SCHED_INFO``,
on by default).

:func:`parse_schedstat` is pure; :func:`read_tasks` reads one process's threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"


@dataclass(frozen=True)
class TaskTimes:
    """Cumulative scheduler counters of one thread.

    Attributes:
        run_ns: time on a CPU, nanoseconds.
        wait_ns: time runnable but waiting for a CPU (run-queue delay), nanoseconds.
        slices: time slices run.
    """

    run_ns: int
    wait_ns: int
    slices: int


def parse_schedstat(text: str) -> TaskTimes | None:
    """The counters of one ``schedstat`` file's text; ``None`` when malformed."""
    parts = text.split()
    if len(parts) < 3:
        return None
    try:
        run, wait, slices = int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        return None
    if run < 0 or wait < 0 or slices < 0:
        return None
    return TaskTimes(run, wait, slices)


def read_tasks(pid: int, proc: str = PROC) -> dict[int, TaskTimes]:
    """Counters of every thread of ``pid`` by thread id; empty when the process is gone,
    not readable, or the kernel keeps no scheduler statistics."""
    base = f"{proc}/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return {}
    out: dict[int, TaskTimes] = {}
    for name in tids:
        if not name.isdigit():
            continue
        try:
            with open(f"{base}/{name}/schedstat", "rb") as f:
                raw = f.read(128)
        except OSError:
            continue  # the thread ended between listing and reading
        times = parse_schedstat(raw.decode("ascii", "replace"))
        if times is not None:
            out[int(name)] = times
    return out


def schedstat_available(proc: str = PROC) -> bool:
    """Whether this kernel keeps per-thread scheduler statistics."""
    try:
        with open(f"{proc}/self/schedstat", "rb") as f:
            return parse_schedstat(f.read(128).decode("ascii", "replace")) is not None
    except OSError:
        return False
