"""The host's CPU as the job will see it: usable cores, throttling, thread settings.

Libraries size thread pools and data-loading workers from ``os.cpu_count()``,
which counts every core of the machine, not the ones this process may use
(CPU affinity) or the share its container may burn (cgroup quota). Thresholds
and reasoning: docs/doctor-checks.md, section "cpu".
"""

from __future__ import annotations

import math

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.host.types import CpuFacts

OVERSUBSCRIPTION_RATIO = 1.25
"""``os.cpu_count()`` over usable cores from which sizing by ``cpu_count`` hurts:
below it the extra threads are a few percent and the scheduler absorbs them."""

THROTTLED_SHARE_WARN = 0.05
"""Share of CFS periods in which the cgroup used up its quota and was stopped."""

MIN_THROTTLE_PERIODS = 100
"""Periods (10 s at the default 100 ms) before the throttled share means anything."""

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
"""Thread-pool sizes read from the environment by OpenMP (and so torch), MKL,
OpenBLAS and numexpr."""


def usable_cores_whole(cpu: CpuFacts) -> int:
    """Usable cores rounded down, at least 1: a thread count that fits."""
    return max(1, math.floor(cpu.usable_cores + 1e-9))


def parse_thread_count(value: str) -> int | None:
    """A thread-count variable's value as the library reads it, ``None`` if invalid.

    OpenMP accepts a comma list (one count per nesting level); the outer
    level is the one that sizes the pool.
    """
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        return None
    return int(first)


def _limit_phrase(cpu: CpuFacts) -> str:
    parts = []
    if cpu.affinity_cores is not None and cpu.affinity_cores < cpu.logical_cores:
        parts.append(f"CPU affinity allows {cpu.affinity_cores}")
    if cpu.cgroup_quota_cores is not None and cpu.cgroup_quota_cores < cpu.logical_cores:
        parts.append(f"the container's CPU quota is {cpu.cgroup_quota_cores:g} cores")
    return " and ".join(parts)


def check_usable_cores(facts: MachineFacts) -> list[Finding]:
    """Fewer usable cores than ``os.cpu_count()`` says: pools sized from it oversubscribe."""
    cpu = facts.host.cpu
    usable = cpu.usable_cores
    if cpu.logical_cores < OVERSUBSCRIPTION_RATIO * usable:
        return []
    whole = usable_cores_whole(cpu)
    omp_raw = facts.host.env.get("OMP_NUM_THREADS")
    omp = parse_thread_count(omp_raw) if omp_raw is not None else None
    pools_sized = omp is not None and omp <= math.ceil(usable)
    fix = (
        f"Size thread pools and DataLoader workers from the {whole} usable cores, not from "
        f"os.cpu_count() ({cpu.logical_cores}): "
    )
    if omp_raw is None:
        fix += f"export OMP_NUM_THREADS={whole} (divided by the training processes per node); "
    fix += (
        "keep num_workers plus the main processes at or below the usable cores (read them "
        "with len(os.sched_getaffinity(0)) and the cgroup quota)."
    )
    return [
        Finding(
            id="cpu.usable_below_logical",
            category=Category.CPU,
            severity=Severity.INFO if pools_sized else Severity.WARNING,
            title=(
                f"Only {usable:g} of the {cpu.logical_cores} cores os.cpu_count() reports are "
                f"usable ({_limit_phrase(cpu)})"
            ),
            evidence={
                "logical_cores": cpu.logical_cores,
                "affinity_cores": cpu.affinity_cores,
                "cgroup_quota_cores": cpu.cgroup_quota_cores,
                "usable_cores": round(usable, 2),
                "omp_num_threads": omp_raw,
            },
            detail=(
                "OpenMP (torch's intra-op pool), MKL and OpenBLAS ignore the cgroup quota, and "
                "scripts often set num_workers=os.cpu_count(): more runnable threads than cores "
                "means each waits its turn and the quota throttles the whole container."
                + (" OMP_NUM_THREADS already fits the usable cores." if pools_sized else "")
            ),
            fix=fix,
            impact=None,
            subject="host",
        )
    ]


def check_throttling(facts: MachineFacts) -> list[Finding]:
    """The cgroup's CPU quota stopped it in a noticeable share of periods."""
    cpu = facts.host.cpu
    periods, throttled = cpu.total_periods, cpu.throttled_periods
    if periods is None or throttled is None or periods < MIN_THROTTLE_PERIODS:
        return []
    share = throttled / periods
    if share < THROTTLED_SHARE_WARN:
        return []
    quota = cpu.cgroup_quota_cores
    quota_text = f"{quota:g} cores" if quota is not None else "its quota"
    return [
        Finding(
            id="cpu.cgroup_throttled",
            category=Category.CPU,
            severity=Severity.WARNING,
            title=(
                f"The container was CPU-throttled in {share:.0%} of scheduling periods "
                f"(limit {quota_text})"
            ),
            evidence={
                "throttled_periods": throttled,
                "total_periods": periods,
                "throttled_share_pct": round(100.0 * share, 1),
                "throttled_s": round(cpu.throttled_s, 1) if cpu.throttled_s is not None else None,
                "cgroup_quota_cores": quota,
                "threshold_pct": 100.0 * THROTTLED_SHARE_WARN,
            },
            detail=(
                "The counters run since the container started, so earlier work counts too. A "
                "throttled container stops for the rest of each 100 ms period: data-loading "
                "workers and the process feeding the GPU stall together."
            ),
            fix=(
                "Raise the CPU limit (docker run --cpus=N; Kubernetes resources.limits.cpu, or "
                "drop the limit and keep the request), or run fewer threads than the quota: "
                f"OMP_NUM_THREADS and num_workers summing to at most {usable_cores_whole(cpu)}."
            ),
            impact=None,
            subject="host",
        )
    ]


def check_thread_env(facts: MachineFacts) -> list[Finding]:
    """Thread-count variables above the usable cores, or set to values libraries ignore."""
    cpu = facts.host.cpu
    limit = math.ceil(cpu.usable_cores - 1e-9)
    too_many: dict[str, int] = {}
    invalid: dict[str, str] = {}
    for name in THREAD_ENV_VARS:
        raw = facts.host.env.get(name)
        if raw is None:
            continue
        count = parse_thread_count(raw)
        if count is None:
            invalid[name] = raw
        elif count > limit:
            too_many[name] = count
    out: list[Finding] = []
    if too_many:
        names = ", ".join(f"{k}={v}" for k, v in too_many.items())
        out.append(
            Finding(
                id="cpu.thread_env_oversubscribed",
                category=Category.CPU,
                severity=Severity.WARNING,
                title=f"{names} asks for more threads than the {cpu.usable_cores:g} usable cores",
                evidence={
                    **{f"{k.lower()}": v for k, v in too_many.items()},
                    "usable_cores": round(cpu.usable_cores, 2),
                },
                detail=(
                    "Every process of the job starts that many threads per pool; threads beyond "
                    "the cores wait in turn, and OpenMP threads spin while they wait."
                ),
                fix=(
                    "Set "
                    + " ".join(f"{k}={usable_cores_whole(cpu)}" for k in too_many)
                    + " or lower (divide by the training processes per node)."
                ),
                impact=None,
                subject="host",
            )
        )
    if invalid:
        names = ", ".join(f"{k}={v!r}" for k, v in invalid.items())
        out.append(
            Finding(
                id="cpu.thread_env_invalid",
                category=Category.CPU,
                severity=Severity.WARNING,
                title=f"{names} is not a positive thread count: the library ignores it",
                evidence={k.lower(): v for k, v in invalid.items()},
                detail=(
                    "An unparsable value falls back to the library's default pool size, which "
                    "counts every core of the machine."
                ),
                fix=(
                    "Set "
                    + " ".join(f"{k}={usable_cores_whole(cpu)}" for k in invalid)
                    + " (a positive integer) or unset it."
                ),
                impact=None,
                subject="host",
            )
        )
    return out


CHECKS = (check_usable_cores, check_throttling, check_thread_env)
