"""Other processes competing with the job for its GPUs or its CPU (``contention``).

Severity and impact follow what the competition costs, never its mere
presence. On the CPU that is measured directly: the share of the training
thread's time spent runnable without a CPU (its run-queue delay, from the
kernel's scheduler counters; :mod:`trainmedic.diagnose.cpu_time`). The wait
is then attributed: to the job's cgroup quota (``cpu.throttled``), to the
hypervisor (``contention.steal``), to other processes (``contention.cpu``), or
to the job's own threads outnumbering its cores (``cpu.oversubscribed``) - or
keeping them full, others using next to nothing: the wait is then the job's
own threads' bursts, not other processes'.
Records without thread measurements fall back to others' CPU on a full
machine, with the slowdown of the steps that overlapped it.

On a GPU, a process on a job GPU is foreign when its pid is not the job's.
NVML reports pids in the host's namespace, so inside a container no job pid
may match: then only processes of another user count as foreign. Its cost is
the slowdown of the steps it overlapped; when it stayed the whole run, a GPU
that is busy (the job waits for it) makes it a warning, an idle one
information.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.cpu_time import contended_intervals
from trainmedic.diagnose.data_wait import is_input_bound
from trainmedic.diagnose.input_causes import input_cause
from trainmedic.diagnose.loading_cpu import others_crowd
from trainmedic.diagnose.thresholds import MIB, Thresholds
from trainmedic.diagnose.view import Interval, RunView, sample_intervals
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import GpuProcess

#: below this measured slowdown, contention is reported for information only.
NO_EFFECT_SHARE = 0.02
#: a wait that neither others' CPU nor the job's own threads account for is reported
#: from this multiple of ``cpu_wait_warning_share`` (a 5-6 % wait on a nearly full
#: machine is its ordinary scheduling).
NO_CULPRIT_MIN_WAIT_FACTOR = 2.0

RESERVE_CORES = (
    "Reserve the cores: stop or move the other processes, pin them away from the job "
    "(taskset -c), or limit them with a container/cgroup (docker run --cpus)."
)
"""The fix of CPU contention, wherever it is found."""


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
        util = _mean_util(series)
        if impact is not None:
            severity = Severity.INFO if impact < NO_EFFECT_SHARE else Severity.WARNING
        else:
            # Nothing to compare with: a GPU with room to spare costs the job little.
            busy = util is None or util >= th.gpu_util_low_pct
            severity = Severity.WARNING if busy else Severity.INFO
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
                    "gpu_utilization_pct": util,
                    "gpu_util_low_pct": th.gpu_util_low_pct,
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
    """The training thread waits for a CPU: a warning from ``cpu_wait_warning_share`` of
    its time, an error from ``cpu_wait_error_share``, information from
    ``cpu_wait_info_share`` (see the module docstring for the attribution)."""
    cpu = view.cpu
    if cpu.train_wait_share is None or view.summary.steps_steady < th.min_steady_steps:
        return _legacy_cpu_contention(view, th)
    s = view.summary
    cores = view.usable_cores
    # What trainmedic's own CPU (its supervisor, the py-spy it runs) takes from the job
    # is the tool's overhead (docs/performance.md), not a cause in the job: a healthy
    # job of two busy threads on 2 cores waited 6 % beside 0.08 cores of it.
    tool_wait = cpu.tool_wait_share(cores)
    wait = cpu.train_wait_share - tool_wait
    if wait < th.cpu_wait_info_share:
        return []
    cause = input_cause(view, th).key if is_input_bound(view, th) else None
    if cause == "contention":
        return []  # the input rule names contention as the cause of the wait
    others = s.others_cpu_mean_cores or 0.0
    runnable = cpu.job_runnable_cores
    own_excess = max(0.0, (runnable or 0.0) - (cores or float("inf")))
    # Each second others run displaces one thread for at most that second: when they
    # ran for less CPU time than the training threads lost waiting, they cannot be
    # what the wait was spent on.
    unaccounted = others < wait * max(1.0, cpu.train_threads or 1.0)
    severity = (
        Severity.ERROR
        if wait >= th.cpu_wait_error_share
        else Severity.WARNING
        if wait >= th.cpu_wait_warning_share
        else Severity.INFO
    )
    ev: dict[str, Any] = {
        "train_cpu_wait_share": cpu.train_wait_share,
        "tool_cpu_cores": cpu.tool_cpu_cores,
        "tool_cpu_wait_share": tool_wait or None,
        "train_cpu_wait_max_share": cpu.train_wait_max_share,
        "cpu_wait_warning_share": th.cpu_wait_warning_share,
        "cpu_wait_error_share": th.cpu_wait_error_share,
        "training_threads": cpu.train_threads,
        "helper_cpu_cores": cpu.helper_cpu_cores,
        "loader_cpu_wait_share": cpu.loader_wait_share,
        "job_cpu_cores": s.job_cpu_mean_cores,
        "job_runnable_cores": runnable,
        "usable_cores": cores,
        "others_cpu_cores": others,
        "steal_pct": cpu.steal_pct,
        "cgroup_throttled_share": cpu.throttled_share,
        "host_readings": cpu.readings,
    }
    if view.machine is not None and view.machine.host.top_processes:
        ev["top_other_processes"] = [
            {"pid": p.pid, "user": p.user, "name": p.name, "cpu_pct": p.cpu_pct}
            for p in view.machine.host.top_processes[:5]
        ]
    slowdown = view.slowdown_share(contended_intervals(view.steady_host, th.cpu_wait_warning_share))
    if slowdown is not None:
        ev["contended_steps_slowdown_share"] = slowdown
    ev = {k: v for k, v in ev.items() if v is not None}
    lost = f"the training thread waits for a CPU {cpu.train_wait_share:.0%} of its time"
    if tool_wait >= 0.005:
        lost += f" ({tool_wait:.0%} of it for trainmedic's own CPU)"
    if cpu.throttled_share is not None and cpu.throttled_share >= th.throttled_high_share:
        key, category = "cpu.throttled", Category.CPU
        title = f"The job's CPU quota stops it {cpu.throttled_share:.0%} of the time: {lost}"
        fix = (
            "Raise the container's CPU limit (docker run --cpus, the pod's "
            "resources.limits.cpu), or use fewer threads than the quota allows "
            + ("(tf.config.threading.set_intra_op_parallelism_threads("
               f"{max(1, int(cores)) if cores else 'N'})"
               if view.framework == "tensorflow"
               else f"(torch.set_num_threads({_cores_str(cores)}), fewer DataLoader workers")
            + ") so the quota is not spent early in each period."
        )
    elif cpu.steal_pct is not None and cpu.steal_pct >= th.steal_high_pct:
        key, category = "contention.steal", Category.CONTENTION
        title = f"The hypervisor gives {cpu.steal_pct:.0f} % of the CPU to other machines: {lost}"
        fix = (
            "The virtual machine's host is oversubscribed: move to dedicated or larger "
            "instances (no burstable/shared-core types), or ask the provider; the steal "
            "shows in `top` as %st."
        )
    elif runnable is not None and cores is not None and (
        own_excess >= max(th.others_min_cores, 0.5 * cores)
        or (own_excess > 0 and others < max(th.others_min_cores, own_excess))
    ):
        key, category = "cpu.oversubscribed", Category.CPU
        title = f"The job keeps {runnable:.1f} threads busy on {_cores_str(cores)} cores: {lost}"
        fix = _fewer_threads_fix(view, max(1, int(cores) - (view.num_workers or 0)))
    elif others >= th.others_min_cores:
        key, category = "contention.cpu", Category.CONTENTION
        title = f"Other processes use {others:.1f} of the job's {_cores_str(cores)} cores: {lost}"
        fix = RESERVE_CORES
    elif severity is Severity.INFO:
        # Others use next to nothing and the job's own threads fit the cores: a
        # wait this small is the machine's ordinary scheduling (the job's helper
        # threads, trainmedic's own, the kernel's), with no one to blame for it.
        return []
    elif runnable is not None and cores is not None and runnable >= th.own_full_share * cores:
        # Others use next to nothing, and the job's own threads keep the cores full: it
        # is they that take the training thread's CPU, in bursts above their mean.
        key, category = "cpu.oversubscribed", Category.CPU
        title = (
            f"The job's own threads keep its {_cores_str(cores)} cores full "
            f"({runnable:.1f} busy on average): {lost}"
        )
        fix = _fewer_threads_fix(view, max(1, int(cores) - (view.num_workers or 0) - 1))
    elif unaccounted and wait < NO_CULPRIT_MIN_WAIT_FACTOR * th.cpu_wait_warning_share:
        # No one's load accounts for the wait and the job's own threads fit the cores:
        # a wait this small is the ordinary scheduling of a machine the job nearly fills
        # (its compute threads' bursts, trainmedic's own, the kernel's). A healthy job
        # of torch's two threads on 2 cores waited 5-6 % with others at 0.01 cores.
        return []
    elif unaccounted and runnable is not None and cores is not None:
        # By elimination, the job's own threads: they take the training thread's CPU
        # in bursts above their mean, though on average they fit the cores.
        key, category = "cpu.oversubscribed", Category.CPU
        title = (
            f"The job's own threads take the training thread's CPU in bursts ({runnable:.1f} "
            f"busy on average on {_cores_str(cores)} cores, others {others:.2f}): {lost}"
        )
        fix = _fewer_threads_fix(view, max(1, int(cores) - (view.num_workers or 0) - 1))
    else:
        key, category = "contention.cpu", Category.CONTENTION
        title = f"Other processes take CPU time the job needs: {lost}"
        fix = RESERVE_CORES
    if (
        cause == "cpu"
        and key in ("cpu.oversubscribed", "contention.cpu")
        and _loading_fills_the_cores(view, th)
    ):
        return []
    return [
        Finding(
            id=key,
            category=category,
            severity=severity,
            title=title,
            evidence=ev,
            fix=fix,
            impact=wait,
            subject="host",
        )
    ]


def _fewer_threads_fix(view: RunView, threads: int) -> str:
    """The fix of a job whose own threads take the training thread's CPU: ``threads``
    compute threads in the training process."""
    if view.framework == "tensorflow":
        return (
            "Run no more busy threads than cores: "
            f"tf.config.threading.set_intra_op_parallelism_threads({threads}) and "
            "set_inter_op_parallelism_threads(1) before the first op (or "
            f"OMP_NUM_THREADS={threads}), and num_parallel_calls=tf.data.AUTOTUNE "
            "rather than a fixed count above the cores in the tf.data pipeline."
        )
    return (
        "Run no more busy threads than cores: torch.set_num_threads("
        f"{threads}) (or OMP_NUM_THREADS={threads}) in the training process, "
        "leaving cores to the DataLoader workers, which use one thread each, and to "
        "any threads of its own that prepare data."
    )


def _loading_fills_the_cores(view: RunView, th: Thresholds) -> bool:
    """Whether the training thread waits behind the job's own data loading.

    Called when the input rule named the cores as the cause (``input.cpu``):
    with others using less than ``others_min_cores`` and the training
    process's helper threads doing less than that much work, the only threads
    that take the training thread's CPU are the loader's. That is the input
    rule's finding; ``torch.set_num_threads`` would shed nothing.
    """
    others = view.summary.others_cpu_mean_cores or 0.0
    if others >= th.others_min_cores:
        return False
    helpers = view.cpu.helper_useful_cores(view.summary.compute_share, view.usable_cores)
    return helpers is None or helpers < th.others_min_cores


def _legacy_cpu_contention(view: RunView, th: Thresholds) -> list[Finding]:
    """Without thread measurements: others use ``others_cpu_share`` of the usable cores
    (and one core) while the machine is at ``system_cpu_busy_pct``."""
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
            fix=RESERVE_CORES,
            impact=impact,
            subject="host",
        )
    ]


def _cores_str(cores: float | None) -> str:
    return "?" if cores is None else f"{cores:g}"


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
