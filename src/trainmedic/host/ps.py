"""The one door to psutil: every process and system-wide reading of trainmedic's goes
through here (as nvitop's ``api/host.py`` does), so the psutil surface the project
relies on is listed in one place, a version difference is mended once, and a test
sees what it would have to fake.

Only what the project uses is exported; add a name here before using it elsewhere.
The readings themselves stay with their users: the host samplers behind the
``system.py`` seam, the process tree in ``supervise``, the attach reader.
"""

from __future__ import annotations

from psutil import (
    STATUS_ZOMBIE,
    AccessDenied,
    Error,
    NoSuchProcess,
    Process,
    boot_time,
    cpu_times,
    disk_io_counters,
    net_io_counters,
    process_iter,
    swap_memory,
    virtual_memory,
    wait_procs,
)

__all__ = [
    "STATUS_ZOMBIE",
    "AccessDenied",
    "Error",
    "NoSuchProcess",
    "Process",
    "boot_time",
    "cpu_times",
    "disk_io_counters",
    "net_io_counters",
    "process_iter",
    "swap_memory",
    "virtual_memory",
    "wait_procs",
]
