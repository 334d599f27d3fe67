"""Other processes competing with the job for its GPUs or its CPU (``contention``).

A process on a job GPU is foreign when its pid is not the job's. NVML reports
pids in the host's namespace, so inside a container no job pid may match:
then only processes of another user count as foreign.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.input_bound import is_input_bound, others_crowd
from trainmedic.diagnose.thresholds import MIB, Thresholds
from trainmedic.diagnose.view import Interval, RunView, sample_intervals
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import GpuProcess

#: below this measured slowdown, contention is reported for information only.
NO_EFFECT_SHARE = 0.02


def gpu_contention(view: RunView, th: Thresholds) -> list[Finding]:
    """Foreign processes on a job GPU for at least ``foreign_gpu_min_share`` of the time."""
    if view.uses_gpu is False or not any(g.processes for g in view.record.gpu):
        return []
    same_namespace = any(p.pid in view.pids for g in view.record.gpu for p in g.processes)
    findings = []
    for index in view.job_gpu_indices:
        series = view.gpu_series(index)
        intervals = sample_intervals([g.timestamp for g in series])
        hit: list[Interval] = []
        foreign: dict[int, GpuProcess] = {}
        for g, iv in zip(series, intervals, strict=True):
            procs = [p for p in g.processes if _foreign(p, view, same_namespace)]
            if procs:
                hit.append(iv)
                for p in procs:
                    foreign[p.pid] = p
        covered = sum(b - a for a, b in intervals)
        share = sum(b - a for a, b in hit) / covered if covered > 0 else 0.0
        if not hit or share < th.foreign_gpu_min_share or len(hit) < min(2, len(series)):
            continue
        impact = view.slowdown_share(hit) if share < 1.0 else None
        severity = (
            Severity.INFO if impact is not None and impact < NO_EFFECT_SHARE else Severity.WARNING
        )
        names = ", ".join(_describe(p) for p in list(foreign.values())[:3])
        findings.append(
            Finding(
                id="contention.gpu_process",
                category=Category.CONTENTION,
                severity=severity,
                title=f"Other processes share GPU {index} with the job: {names}",
                evidence={
                    "foreign_processes": [_process_dict(p) for p in list(foreign.values())[:5]],
                    "foreign_time_share": share,
                    "foreign_gpu_min_share": th.foreign_gpu_min_share,
                    "samples_with_foreign": len(hit),
                    "gpu_utilization_pct": _mean_util(series),
                    "pid_namespace_matches": same_namespace,
                },
                fix=(
                    "Give the job a GPU of its own: stop or move the other processes "
                    "(nvidia-smi lists them), choose a free GPU with CUDA_VISIBLE_DEVICES, or "
                    "have the scheduler hand out exclusive GPUs (nvidia-smi -c "
                    "EXCLUSIVE_PROCESS, MIG instances)."
                ),
                impact=impact,
                subject=f"gpu{index}",
            )
        )
    return findings


def cpu_contention(view: RunView, th: Thresholds) -> list[Finding]:
    """Others use at least ``others_cpu_share`` of the usable cores (and one core) while
    the machine is at ``system_cpu_busy_pct``."""
    if not others_crowd(view, th):
        return []
    if is_input_bound(view, th):
        return []  # the input rule names contention as the cause of the wait
    cores = view.usable_cores
    assert cores is not None
    limit = max(1.0, th.others_cpu_share * cores)
    host = sorted(view.steady_host, key=lambda h: h.t)
    intervals = sample_intervals([h.t for h in host])
    hit = [
        iv
        for h, iv in zip(host, intervals, strict=True)
        if h.others_cpu_pct is not None
        and h.others_cpu_pct / 100.0 >= limit
        and h.system_cpu_pct >= th.system_cpu_busy_pct
    ]
    impact = view.slowdown_share(hit) if 0 < len(hit) < len(host) else None
    severity = (
        Severity.INFO if impact is not None and impact < NO_EFFECT_SHARE else Severity.WARNING
    )
    s = view.summary
    others = s.others_cpu_mean_cores
    assert others is not None
    ev: dict[str, Any] = {
        "others_cpu_cores": others,
        "others_cpu_limit_cores": limit,
        "usable_cores": cores,
        "job_cpu_cores": s.job_cpu_mean_cores,
        "system_cpu_pct": s.system_cpu_mean_pct,
        "system_cpu_busy_pct": th.system_cpu_busy_pct,
    }
    if view.machine is not None and view.machine.host.top_processes:
        ev["top_other_processes"] = [
            {"pid": p.pid, "user": p.user, "name": p.name, "cpu_pct": p.cpu_pct}
            for p in view.machine.host.top_processes[:5]
        ]
    return [
        Finding(
            id="contention.cpu",
            category=Category.CONTENTION,
            severity=severity,
            title=f"Other processes use {others:.1f} of the job's {cores:g} usable cores",
            evidence=ev,
            fix=(
                "Reserve the cores: stop or move the other processes, pin them away from the "
                "job (taskset -c), or limit them with a container/cgroup (docker run --cpus)."
            ),
            impact=impact,
            subject="host",
        )
    ]


def _foreign(p: GpuProcess, view: RunView, same_namespace: bool) -> bool:
    if same_namespace:
        return p.pid not in view.pids
    return p.user is not None and view.job_user is not None and p.user != view.job_user


def _describe(p: GpuProcess) -> str:
    who = f" ({p.user})" if p.user else ""
    return f"{p.name or 'pid'} {p.pid}{who}"


def _process_dict(p: GpuProcess) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": p.pid, "name": p.name, "user": p.user}
    if p.used_memory_bytes is not None:
        out["used_memory_mib"] = p.used_memory_bytes / MIB
    return out


def _mean_util(series: list[Any]) -> float | None:
    values = [g.utilization_gpu_pct for g in series if g.utilization_gpu_pct is not None]
    return sum(values) / len(values) if values else None
