"""What bounds DataLoader workers on this machine: usable cores, memory, ``/dev/shm``.

Cores are the fewest of the logical cores, the CPU affinity and the cgroup
quota (containers); memory is what the host has available and, in a
container, what is left below its limit. Each worker holds its own copy of
what the dataset touches, and its batches in flight pass through ``/dev/shm``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from trainmedic.host.cgroup import read_cgroup
from trainmedic.host.gather import read_shm

MEMORY_SHARE = 0.5
"""Share of the available memory the workers may take."""
SHM_SHARE = 0.5
"""Share of the free ``/dev/shm`` the batches in flight may take."""
MAX_IN_FLIGHT = 256
"""Most samples fetched at once (workers x threads) for latency-bound data."""


@dataclass(frozen=True)
class LoaderLimits:
    """Resources the data loading may use.

    Attributes:
        usable_cores: min(logical cores, affinity, cgroup quota).
        memory_available_bytes: host available memory, lowered to the cgroup's
            headroom in a container; ``None`` when unknown.
        shm_free_bytes: free space of ``/dev/shm``; ``None`` when absent.
    """

    usable_cores: float
    memory_available_bytes: int | None
    shm_free_bytes: int | None

    def max_workers(
        self, per_worker_bytes: int | None, batch_bytes: int | None, prefetch_factor: int
    ) -> int | None:
        """Workers that fit memory and ``/dev/shm``; ``None`` when nothing bounds them."""
        bounds = []
        if per_worker_bytes and self.memory_available_bytes is not None:
            bounds.append(int(self.memory_available_bytes * MEMORY_SHARE // per_worker_bytes))
        if batch_bytes and self.shm_free_bytes is not None:
            in_flight = batch_bytes * max(1, prefetch_factor)
            bounds.append(int(self.shm_free_bytes * SHM_SHARE // in_flight))
        return max(1, min(bounds)) if bounds else None

    @property
    def cpu_workers(self) -> int:
        """Workers for CPU-bound loading: one per usable core (at least 1)."""
        return max(1, math.floor(self.usable_cores + 1e-9))

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "usable_cores": self.usable_cores,
            "memory_available_bytes": self.memory_available_bytes,
            "shm_free_bytes": self.shm_free_bytes,
        }


def read_limits(root: str = "/", shm_path: str = "/dev/shm") -> LoaderLimits:
    """This process's limits, read now."""
    from trainmedic.host import ps

    cores: list[float] = [float(os.cpu_count() or 1)]
    if hasattr(os, "sched_getaffinity"):
        cores.append(float(len(os.sched_getaffinity(0))))
    try:
        cgroup = read_cgroup(root)
    except Exception:
        cgroup = None
    if cgroup is not None and cgroup.cpu is not None and cgroup.cpu.quota_cores:
        cores.append(cgroup.cpu.quota_cores)
    memory: int | None = int(ps.virtual_memory().available)
    if cgroup is not None and cgroup.memory is not None and cgroup.memory.limit_bytes:
        used = cgroup.memory.working_set_bytes or 0
        headroom = max(0, cgroup.memory.limit_bytes - used)
        memory = headroom if memory is None else min(memory, headroom)
    shm = read_shm(shm_path)
    return LoaderLimits(
        usable_cores=min(cores),
        memory_available_bytes=memory,
        shm_free_bytes=None if shm is None else shm.free_bytes,
    )
