"""Typed facts about the host: CPU, memory, shared memory, environment, processes.

Gathered by :mod:`trainmedic.host.gather` (psutil, /proc, cgroup files) or
taken from a simulation file's ``host`` section. Units are in the names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CpuFacts:
    """CPU capacity and load.

    Attributes:
        logical_cores: what ``os.cpu_count()`` reports (what most libraries assume).
        affinity_cores: cores this process may run on (``sched_getaffinity``).
        cgroup_quota_cores: cgroup v1/v2 CPU quota in cores (``quota/period``), or
            ``None`` when unlimited.
        throttled_periods / total_periods: cgroup ``cpu.stat`` counters.
        throttled_s: total time the cgroup was throttled, seconds.
        load_avg_1m: 1-minute load average (runnable tasks).
        busy_pct: whole-system CPU utilization over a short window, 0..100 of all
            logical cores.
        others_busy_cores: CPU used by processes of other users, in cores.
        own_busy_cores: CPU used by processes of the current user, in cores.
        steal_pct: share of CPU time the hypervisor gave to other virtual machines
            over the same window, 0..100 (0 on bare metal; ``None`` when not reported).
    """

    logical_cores: int
    affinity_cores: int | None = None
    cgroup_quota_cores: float | None = None
    throttled_periods: int | None = None
    total_periods: int | None = None
    throttled_s: float | None = None
    load_avg_1m: float | None = None
    busy_pct: float | None = None
    others_busy_cores: float | None = None
    own_busy_cores: float | None = None
    steal_pct: float | None = None

    @property
    def usable_cores(self) -> float:
        """min(logical cores, CPU affinity, cgroup quota)."""
        limits: list[float] = [float(self.logical_cores)]
        if self.affinity_cores:
            limits.append(float(self.affinity_cores))
        if self.cgroup_quota_cores:
            limits.append(self.cgroup_quota_cores)
        return min(limits)


@dataclass(frozen=True)
class MemoryFacts:
    """Host memory, bytes.

    ``total_bytes`` and ``available_bytes`` are the host's (psutil does not see
    container limits); the cgroup fields say what the container may use.

    Attributes:
        cgroup_limit_bytes: the container's memory limit, or ``None`` when unlimited
            (a limit at or above the host's RAM counts as unlimited).
        cgroup_usage_bytes: what the cgroup is charged for, page cache included.
        cgroup_working_set_bytes: usage minus inactive file cache: what cannot be
            reclaimed cheaply, and what the OOM killer compares with the limit.
        cgroup_oom_kills: processes the kernel OOM-killed in this cgroup since it was
            created.
        others_rss_bytes: resident memory of processes owned by other users (shared
            pages counted once per process, so it can overstate).
        swap_in_bytes_per_s / swap_out_bytes_per_s: swap traffic over the short
            gather window, bytes per second.
    """

    total_bytes: int
    available_bytes: int
    swap_total_bytes: int = 0
    swap_used_bytes: int = 0
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None
    cgroup_working_set_bytes: int | None = None
    cgroup_oom_kills: int | None = None
    others_rss_bytes: int | None = None
    swap_in_bytes_per_s: float | None = None
    swap_out_bytes_per_s: float | None = None


SHM_MIN_BYTES = 1 << 30
"""A /dev/shm below 1 GiB is too small for DataLoader workers: Docker's and Kubernetes'
default is 64 MiB, which a few workers passing image batches fill at once. doctor's
check and the run diagnosis share it."""


@dataclass(frozen=True)
class ShmFacts:
    """The shared-memory filesystem DataLoader workers pass batches through.

    Attributes:
        total_bytes / free_bytes: size and free space of the filesystem, bytes.
    """

    path: str
    total_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class HostProcess:
    """A busy process on the host (for contention findings).

    Attributes:
        cpu_pct: CPU over the gather window, percent of one core (200 = two cores).
        rss_bytes: resident memory, bytes.
    """

    pid: int
    user: str | None
    name: str
    cpu_pct: float
    rss_bytes: int


@dataclass(frozen=True)
class HostFacts:
    """Everything doctor knows about the host.

    Attributes:
        user: the user running trainmedic.
        env: the environment variables that matter to training (thread counts,
            CUDA and allocator settings), name -> value.
        top_processes: processes of other users: the busiest by CPU and the
            largest by resident memory (up to five of each), busiest first.
    """

    hostname: str
    user: str
    cpu: CpuFacts
    memory: MemoryFacts
    shm: ShmFacts | None
    env: Mapping[str, str] = field(default_factory=dict)
    top_processes: tuple[HostProcess, ...] = ()
