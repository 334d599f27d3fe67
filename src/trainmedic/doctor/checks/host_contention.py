"""Other people's work on the host: their CPU load, their memory, other VMs' CPU.

A process is someone else's when another user owns it. In a container the
processes of other containers are invisible, but the host's CPU counters are
not, so load nobody visible accounts for is reported too. Thresholds and
reasoning: docs/doctor-checks.md, section "contention (host)".
"""

from __future__ import annotations

from collections.abc import Callable

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.host.types import CpuFacts, HostProcess

_GIB = float(1 << 30)

OTHERS_CPU_SHARE = 0.5
"""Others' CPU, as a share of the cores usable here, that leaves the job short."""

MIN_CONTENDED_CORES = 1.0
"""Less CPU than one core taken by others is never worth a warning."""

HOST_SATURATED_PCT = 80.0
"""Whole-host CPU busy share above which runnable threads queue for a core."""

STEAL_WARN_PCT = 10.0
"""Share of CPU time the hypervisor gave to other VMs that marks an oversold host."""

OTHERS_MEMORY_SHARE = 0.25
"""Share of the host's RAM held by other users' processes that counts as contention..."""

OTHERS_MEMORY_PRESSURE_SHARE = 0.5
"""...when less than this share of the RAM is still available."""

_TOP = 5

_DEDICATED_FIX = (
    "Run on a host (or cores) nobody else uses: ask the scheduler for exclusive nodes "
    "(e.g. Slurm --exclusive), pin the job to idle cores (taskset -c / numactl "
    "--physcpubind), or ask the machine's owner or provider for dedicated resources."
)


def describe_process(p: HostProcess) -> str:
    """``pid 123 (bob, python, 350% CPU, 12.0 GiB)`` for evidence."""
    user = p.user if p.user is not None else "owner not visible"
    return f"pid {p.pid} ({user}, {p.name}, {p.cpu_pct:.0f}% CPU, {p.rss_bytes / _GIB:.1f} GiB)"


def _top(processes: tuple[HostProcess, ...], key: Callable[[HostProcess], float]) -> list[str]:
    ranked = sorted(processes, key=lambda p: (-key(p), p.pid))
    return [describe_process(p) for p in ranked[:_TOP] if key(p) > 0]


def _contended_threshold(cpu: CpuFacts) -> float:
    return max(MIN_CONTENDED_CORES, OTHERS_CPU_SHARE * cpu.usable_cores)


def check_others_cpu(facts: MachineFacts) -> list[Finding]:
    """Processes of other users burn CPU the job would use."""
    cpu = facts.host.cpu
    others = cpu.others_busy_cores
    threshold = _contended_threshold(cpu)
    if others is None or others < threshold:
        return []
    users = sorted({p.user for p in facts.host.top_processes if p.user and p.cpu_pct > 0})
    return [
        Finding(
            id="contention.host_cpu.other_users",
            category=Category.CONTENTION,
            severity=Severity.WARNING,
            title=(
                f"Other users' processes use {others:.1f} cores; {cpu.usable_cores:g} are "
                "usable here"
            ),
            evidence={
                "others_busy_cores": round(others, 2),
                "usable_cores": round(cpu.usable_cores, 2),
                "threshold_cores": round(threshold, 2),
                "busy_pct": cpu.busy_pct,
                "load_avg_1m": cpu.load_avg_1m,
                "other_users": users,
                "top_processes": _top(facts.host.top_processes, lambda p: p.cpu_pct),
            },
            detail=(
                "Measured over a fraction of a second: a short burst looks like this too; "
                "run doctor again or watch `top` to confirm."
            ),
            fix=_DEDICATED_FIX,
            impact=None,
            subject="host",
        )
    ]


def check_unseen_load(facts: MachineFacts) -> list[Finding]:
    """The host's CPUs are saturated by work no process visible here accounts for."""
    cpu = facts.host.cpu
    if cpu.busy_pct is None or cpu.busy_pct < HOST_SATURATED_PCT:
        return []
    busy_cores = cpu.busy_pct / 100.0 * cpu.logical_cores
    seen = (cpu.own_busy_cores or 0.0) + (cpu.others_busy_cores or 0.0)
    unseen = busy_cores - seen
    threshold = _contended_threshold(cpu)
    if unseen < threshold:
        return []
    return [
        Finding(
            id="contention.host_cpu.unseen_load",
            category=Category.CONTENTION,
            severity=Severity.WARNING,
            title=(
                f"The host's CPUs are {cpu.busy_pct:.0f}% busy, {unseen:.1f} cores of it by "
                "processes not visible here"
            ),
            evidence={
                "busy_pct": round(cpu.busy_pct, 1),
                "busy_cores": round(busy_cores, 2),
                "visible_busy_cores": round(seen, 2),
                "unseen_busy_cores": round(unseen, 2),
                "logical_cores": cpu.logical_cores,
                "usable_cores": round(cpu.usable_cores, 2),
                "load_avg_1m": cpu.load_avg_1m,
            },
            detail=(
                "Other containers on the same host (or processes this account may not list) "
                "compete for the same cores; a container's CPU quota caps its use but does "
                "not reserve cores for it."
            ),
            fix=_DEDICATED_FIX,
            impact=None,
            subject="host",
        )
    ]


def check_steal(facts: MachineFacts) -> list[Finding]:
    """The hypervisor runs other virtual machines on this VM's CPUs."""
    steal = facts.host.cpu.steal_pct
    if steal is None or steal < STEAL_WARN_PCT:
        return []
    return [
        Finding(
            id="contention.host_cpu.steal",
            category=Category.CONTENTION,
            severity=Severity.WARNING,
            title=f"The hypervisor took {steal:.0f}% of this VM's CPU time for other VMs",
            evidence={"steal_pct": round(steal, 1), "threshold_pct": STEAL_WARN_PCT},
            detail=(
                "Steal time is CPU the VM wanted but did not get: its vCPUs share physical "
                "cores with other tenants. Data loading and the Python loop slow down by "
                "about that share when they are CPU-bound."
            ),
            fix=(
                "Ask the provider for dedicated cores (a dedicated-host or non-burstable "
                "instance type) or move to another host; `mpstat 1` or `top` (st) shows "
                "steal over time."
            ),
            impact=None,
            subject="host",
        )
    ]


def check_others_memory(facts: MachineFacts) -> list[Finding]:
    """Other users' processes hold a large share of the RAM while memory is short.

    Summed RSS counts shared pages once per process, so it is capped at the
    memory in use.
    """
    m = facts.host.memory
    if m.others_rss_bytes is None or m.total_bytes <= 0:
        return []
    in_use = max(0, m.total_bytes - m.available_bytes)
    others = min(m.others_rss_bytes, in_use)
    if others < OTHERS_MEMORY_SHARE * m.total_bytes:
        return []
    if m.available_bytes >= OTHERS_MEMORY_PRESSURE_SHARE * m.total_bytes:
        return []
    return [
        Finding(
            id="contention.host_memory.other_users",
            category=Category.CONTENTION,
            severity=Severity.WARNING,
            title=(
                f"Other users' processes hold {others / _GIB:.1f} GiB of the host's "
                f"{m.total_bytes / _GIB:.1f} GiB memory; {m.available_bytes / _GIB:.1f} GiB "
                "is available"
            ),
            evidence={
                "others_rss_gib": round(others / _GIB, 2),
                "others_share_pct": round(100.0 * others / m.total_bytes, 1),
                "available_gib": round(m.available_bytes / _GIB, 2),
                "memory_total_gib": round(m.total_bytes / _GIB, 2),
                "top_processes": _top(facts.host.top_processes, lambda p: float(p.rss_bytes)),
            },
            fix=_DEDICATED_FIX + " Otherwise size workers and caches for the memory available.",
            impact=None,
            subject="host",
        )
    ]


CHECKS = (check_others_cpu, check_unseen_load, check_steal, check_others_memory)
