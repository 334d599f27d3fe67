"""Host RAM and swap: room for the job's processes, workers and page cache.

The catalogue has no category of its own for host memory; findings here use
``cpu``, the catalogue's category for the host side of the machine (as
``gpu_memory`` is for the GPU side). Memory taken by other users' processes is
reported by :mod:`trainmedic.doctor.checks.host_contention` as ``contention``.
Thresholds and reasoning: docs/doctor-checks.md, section "host memory".
"""

from __future__ import annotations

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity

_GIB = float(1 << 30)
_MIB = float(1 << 20)

LOW_AVAILABLE_SHARE = 0.10
LOW_AVAILABLE_BYTES = 4 << 30
"""Available memory (or room below a container's limit) is low below *both* 10 %
of the memory and 4 GiB: 10 % of a 1 TiB host is plenty, and 4 GiB of an
8 GiB machine is not short."""

SWAP_ACTIVE_BYTES_PER_S = float(1 << 20)
"""Swap traffic (in + out) that means pages move to disk right now."""

SWAP_USED_MIN_BYTES = 256 << 20
"""Swap in use worth reporting; a few MiB of idle daemon pages are not."""

SWAP_PRESSURE_AVAILABLE_SHARE = 0.20
"""With swap in use and less than this share available, new allocations swap."""

_REDUCE_FIX = (
    "lower DataLoader num_workers or prefetch_factor (each worker holds a copy of the dataset "
    "object and its prefetched batches), keep the dataset out of RAM (memory-map it or read "
    "lazily), or stop other jobs on this host"
)


def _gib(n: int | float | None) -> float | None:
    return None if n is None else round(n / _GIB, 2)


def _low_threshold(total_bytes: int) -> float:
    """Bytes below which available memory counts as low, for memory of ``total_bytes``."""
    return min(LOW_AVAILABLE_SHARE * total_bytes, float(LOW_AVAILABLE_BYTES))


def check_low_available(facts: MachineFacts) -> list[Finding]:
    """Little memory left on the host for the job's processes and the page cache."""
    m = facts.host.memory
    threshold = _low_threshold(m.total_bytes)
    if m.available_bytes >= threshold:
        return []
    return [
        Finding(
            id="cpu.host_memory.low_available",
            category=Category.CPU,
            severity=Severity.WARNING,
            title=(
                f"Only {m.available_bytes / _GIB:.1f} GiB of the host's "
                f"{m.total_bytes / _GIB:.1f} GiB memory is available"
            ),
            evidence={
                "available_gib": _gib(m.available_bytes),
                "memory_total_gib": _gib(m.total_bytes),
                "others_rss_gib": _gib(m.others_rss_bytes),
                "threshold_gib": _gib(threshold),
            },
            detail=(
                "Short memory evicts the page cache that keeps the dataset's files hot, pushes "
                "pages to swap, and ends with the kernel's OOM killer ending a worker or the job."
            ),
            fix=f"Free memory before training: {_REDUCE_FIX}; or use a host with more RAM.",
            impact=None,
            subject="host",
        )
    ]


def check_cgroup_near_limit(facts: MachineFacts) -> list[Finding]:
    """The container's working set leaves little room below its memory limit.

    The working set (usage minus inactive page cache) is what counts: page
    cache is dropped before anything is killed.
    """
    m = facts.host.memory
    limit, used = m.cgroup_limit_bytes, m.cgroup_working_set_bytes
    if limit is None or used is None:
        return []
    room = max(0, limit - used)
    threshold = _low_threshold(limit)
    if room >= threshold:
        return []
    return [
        Finding(
            id="cpu.host_memory.cgroup_near_limit",
            category=Category.CPU,
            severity=Severity.WARNING,
            title=(
                f"The container uses {used / _GIB:.1f} GiB of its {limit / _GIB:.1f} GiB memory "
                f"limit; {room / _GIB:.1f} GiB is left"
            ),
            evidence={
                "cgroup_working_set_gib": _gib(used),
                "cgroup_usage_gib": _gib(m.cgroup_usage_bytes),
                "cgroup_limit_gib": _gib(limit),
                "room_gib": _gib(room),
                "threshold_gib": _gib(threshold),
            },
            detail=(
                "At the limit the kernel OOM-kills a process of the container (often a "
                "DataLoader worker, which torch reports as 'DataLoader worker ... killed by "
                "signal: Killed'), however much the host has free."
            ),
            fix=(
                "Raise the container's memory limit (docker run --memory; Kubernetes "
                f"resources.limits.memory), or {_REDUCE_FIX}."
            ),
            impact=None,
            subject="host",
        )
    ]


def check_oom_kills(facts: MachineFacts) -> list[Finding]:
    """The kernel already killed processes of this container for memory."""
    kills = facts.host.memory.cgroup_oom_kills
    if not kills:
        return []
    limit = facts.host.memory.cgroup_limit_bytes
    return [
        Finding(
            id="cpu.host_memory.oom_kills",
            category=Category.CPU,
            severity=Severity.WARNING,
            title=f"The kernel OOM-killed {kills} process(es) of this container since it started",
            evidence={"cgroup_oom_kills": kills, "cgroup_limit_gib": _gib(limit)},
            detail=(
                "An OOM kill ends a process with SIGKILL and no Python traceback: a training "
                "job that 'just died', or a DataLoader worker 'killed by signal: Killed'."
            ),
            fix=(
                "Give the container more memory (docker run --memory; Kubernetes "
                f"resources.limits.memory) or {_REDUCE_FIX}; `dmesg | grep -i oom` names "
                "the killed processes."
            ),
            impact=None,
            subject="host",
        )
    ]


def check_container_limit(facts: MachineFacts) -> list[Finding]:
    """A memory limit below the host's RAM, which ``free`` and psutil do not show."""
    m = facts.host.memory
    limit = m.cgroup_limit_bytes
    if limit is None or limit >= m.total_bytes:
        return []
    return [
        Finding(
            id="cpu.host_memory.container_limit",
            category=Category.CPU,
            severity=Severity.INFO,
            title=(
                f"This container may use {limit / _GIB:.1f} GiB of memory, although the host "
                f"shows {m.total_bytes / _GIB:.1f} GiB"
            ),
            evidence={"cgroup_limit_gib": _gib(limit), "memory_total_gib": _gib(m.total_bytes)},
            detail=(
                "free, top and psutil report the host's memory; caches or worker counts sized "
                "from them can exceed the container's limit and get OOM-killed."
            ),
            fix=f"Size in-memory caches and worker counts for {limit / _GIB:.1f} GiB.",
            impact=None,
            subject="host",
        )
    ]


def check_swap(facts: MachineFacts) -> list[Finding]:
    """Pages moving to and from swap now, or swap in use while memory is short."""
    m = facts.host.memory
    traffic = (m.swap_in_bytes_per_s or 0.0) + (m.swap_out_bytes_per_s or 0.0)
    evidence = {
        "swap_used_gib": _gib(m.swap_used_bytes),
        "swap_total_gib": _gib(m.swap_total_bytes),
        "swap_in_mib_per_s": round((m.swap_in_bytes_per_s or 0.0) / _MIB, 2),
        "swap_out_mib_per_s": round((m.swap_out_bytes_per_s or 0.0) / _MIB, 2),
        "available_gib": _gib(m.available_bytes),
        "memory_total_gib": _gib(m.total_bytes),
    }
    fix = (
        f"Keep the job within RAM: {_REDUCE_FIX}. Swapping shows live in `vmstat 1` "
        "(columns si/so)."
    )
    if traffic >= SWAP_ACTIVE_BYTES_PER_S:
        return [
            Finding(
                id="cpu.host_memory.swapping",
                category=Category.CPU,
                severity=Severity.WARNING,
                title=f"The host is swapping now ({traffic / _MIB:.1f} MiB/s to and from swap)",
                evidence=evidence,
                detail=(
                    "A process touching a swapped-out page waits for the disk: data-loading "
                    "workers and the training loop stall for milliseconds per page."
                ),
                fix=fix,
                impact=None,
                subject="host",
            )
        ]
    if m.swap_used_bytes < SWAP_USED_MIN_BYTES:
        return []
    pressure = m.available_bytes < SWAP_PRESSURE_AVAILABLE_SHARE * m.total_bytes
    return [
        Finding(
            id="cpu.host_memory.swap_used",
            category=Category.CPU,
            severity=Severity.WARNING if pressure else Severity.INFO,
            title=(
                f"{m.swap_used_bytes / _GIB:.1f} GiB of memory is swapped out"
                + (
                    f" and only {m.available_bytes / _GIB:.1f} GiB is available"
                    if pressure
                    else " (no swapping right now)"
                )
            ),
            evidence=evidence,
            detail=(
                "With little memory available, the job's own allocations will push pages to "
                "swap, and every touch of a swapped page waits for the disk."
                if pressure
                else "Pages swapped out earlier cost nothing until touched again."
            ),
            fix=fix,
            impact=None,
            subject="host",
        )
    ]


CHECKS = (
    check_low_available,
    check_cgroup_near_limit,
    check_oom_kills,
    check_container_limit,
    check_swap,
)
