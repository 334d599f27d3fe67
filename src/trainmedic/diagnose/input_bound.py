"""Input-bound training: the loop waits for batches. One finding, named by its cause.

The cause decides the fix, so :func:`input_cause` walks the evidence in a
fixed order (docs/diagnosis.md, "Input-bound training"):

1. no worker processes while cores sit idle -> ``framework_config``;
2. loader stacks mostly reading files -> ``io``; mostly on sockets -> ``network``;
3. no spare core: others' processes take a large share -> ``contention``,
   else the job's own workers -> ``cpu``;
4. stacks mostly in transforms (or unknown) while cores sit idle -> too few
   workers, ``framework_config``;
5. without stack samples: host iowait -> ``io``; network receive -> ``network``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.thresholds import MIB, Thresholds
from trainmedic.diagnose.view import BUSY_STATES, RunView, share_of
from trainmedic.findings.fixes import SHM_FIX_WITH_WORKERS, loader_remedies
from trainmedic.findings.model import Category, Finding, Severity


@dataclass(frozen=True)
class InputCause:
    """Why the loop waits for data: the finding's id suffix, category, title and fix."""

    key: str
    category: Category
    title: str
    fix: str
    evidence: Mapping[str, Any]


def exposed_wait_share(view: RunView, th: Thresholds) -> float | None:
    """Share of steady step time the wait for data costs.

    The wait is all lost time unless the job's GPUs stay busy meanwhile (work
    queued before the wait): when they are busy at least ``gpu_util_high_pct``,
    only their idle share can be lost to waiting.
    """
    wait = view.summary.data_wait_share
    if wait is None:
        return None
    util = view.gpu_util_pct
    if util is not None and util >= th.gpu_util_high_pct:
        return min(wait, max(0.0, 1.0 - util / 100.0))
    return wait


def is_input_bound(view: RunView, th: Thresholds) -> bool:
    exposed = exposed_wait_share(view, th)
    return (
        view.summary.steps_steady >= th.min_steady_steps
        and exposed is not None
        and exposed >= th.data_wait_warning_share
    )


def recommended_workers(view: RunView, th: Thresholds) -> int:
    """Workers per training process: the usable cores shared by the processes, one
    core kept for each main process, at least 2 and at most ``max_recommended_workers``."""
    cores = view.usable_cores or 4.0
    per_process = math.floor(cores / view.concurrent_processes) - 1
    return max(2, min(th.max_recommended_workers, per_process))


def input_bound(view: RunView, th: Thresholds) -> list[Finding]:
    """Data wait high: a warning from ``data_wait_warning_share``, an error from
    ``data_wait_error_share``."""
    if not is_input_bound(view, th):
        return []
    exposed = exposed_wait_share(view, th)
    assert exposed is not None
    s = view.summary
    cause = input_cause(view, th)
    severity = Severity.ERROR if exposed >= th.data_wait_error_share else Severity.WARNING
    evidence: dict[str, Any] = {
        "data_wait_share": s.data_wait_share,
        "data_wait_exposed_share": exposed,
        "data_wait_warning_share": th.data_wait_warning_share,
        "data_wait_error_share": th.data_wait_error_share,
        "step_time_median_s": s.step_time_median_s,
        "steady_steps": s.steps_steady,
    }
    if view.gpu_util_pct is not None:
        evidence["gpu_utilization_pct"] = view.gpu_util_pct
    evidence.update(cause.evidence)
    return [
        Finding(
            id=f"input.{cause.key}",
            category=cause.category,
            severity=severity,
            title=f"Training waits for data {exposed:.0%} of step time: {cause.title}",
            evidence=evidence,
            fix=f"{cause.fix} {loader_remedies(cause.category.value)}",
            impact=exposed,
            subject="dataloader",
            apply=loader_apply(view, th, cause),
        )
    ]


def loader_apply(view: RunView, th: Thresholds, cause: InputCause) -> dict[str, Any] | None:
    """The loader settings of the fix that ``run --apply-from`` may set: more workers
    where the cause is not a CPU already full (``cpu``, ``contention``)."""
    workers = view.num_workers
    n = recommended_workers(view, th)
    if cause.category in (Category.CPU, Category.CONTENTION) or workers is None or workers >= n:
        return None
    settings: dict[str, Any] = {"num_workers": n, "prefetch_factor": 4}
    if view.uses_gpu:
        settings["pin_memory"] = True
    return {"dataloader": settings}


def input_cause(view: RunView, th: Thresholds) -> InputCause:
    """The cause of the wait for data, by the order in the module docstring."""
    s = view.summary
    cores = view.usable_cores
    job = s.job_cpu_mean_cores
    others = s.others_cpu_mean_cores
    workers = view.num_workers
    n = recommended_workers(view, th)
    activity = view.activity()
    busy = sum(activity[k] for k in BUSY_STATES)
    shares = {k: share_of(activity, k, BUSY_STATES) for k in BUSY_STATES}
    dominant = None
    if busy >= th.activity_min_samples:
        top = max(BUSY_STATES, key=lambda k: shares[k])
        if shares[top] >= th.activity_dominant_share:
            dominant = top

    ev: dict[str, Any] = {
        "num_workers": workers,
        "recommended_num_workers": n,
        "usable_cores": cores,
        "job_cpu_cores": job,
        "others_cpu_cores": others,
    }
    if busy:
        ev.update({f"loader_{k}_share": round(v, 4) for k, v in shares.items()})
        ev["loader_stack_samples"] = busy
    for key, value in (
        ("iowait_pct", s.iowait_mean_pct),
        ("disk_read_mib_per_s", _mib(s.disk_read_mean_bytes_per_s)),
        ("net_recv_mib_per_s", _mib(s.net_recv_mean_bytes_per_s)),
    ):
        if value is not None:
            ev[key] = value
    storage = view.machine.storage if view.machine is not None else None
    if storage is not None:
        ev["data_dir_fs_type"] = storage.fs_type
        ev["data_dir_read_mib_per_s"] = storage.seq_read_mib_per_s
    ev = {k: v for k, v in ev.items() if v is not None}

    saturated = cores is not None and job is not None and job >= th.cpu_saturated_share * cores
    crowded = others_crowd(view, th)
    idle = cores is None or job is None or job <= th.cpu_idle_share * cores
    loader_fix = (
        f"DataLoader(..., num_workers={n}, pin_memory=True, persistent_workers=True, "
        "prefetch_factor=4)"
    )

    if workers == 0 and not saturated and not crowded:
        return InputCause(
            "workers",
            Category.FRAMEWORK_CONFIG,
            "the DataLoader has num_workers=0, so the training process loads every batch itself",
            f"Load in parallel: {loader_fix}; {n} workers fit the {_cores(cores)} usable cores.",
            ev,
        )
    if dominant == "file_read":
        return InputCause(
            "io",
            Category.IO,
            "the loader spends its time reading files",
            "Make reads cheaper: copy the data set to local NVMe/SSD (or /dev/shm), cache "
            "decoded samples, pack small files into sharded formats (WebDataset, "
            "TFRecord, LMDB) and read them sequentially" + _more_workers(workers, n, loader_fix),
            ev,
        )
    if dominant == "socket_wait":
        return InputCause(
            "network",
            Category.NETWORK,
            "the loader spends its time waiting on network sockets",
            "Hide or remove the network: copy or cache the data on local disk before "
            "training, prefetch more batches (prefetch_factor=4+), and keep the data in "
            "the GPU's region" + _more_workers(workers, n, loader_fix),
            ev,
        )
    if crowded:
        return InputCause(
            "contention",
            Category.CONTENTION,
            "other processes take the CPU the data loader needs",
            "Give the job dedicated cores: stop or move the other processes, or run them "
            "in a container/cgroup with a CPU limit (docker run --cpus, taskset).",
            ev,
        )
    if saturated:
        return InputCause(
            "cpu",
            Category.CPU,
            "the data loader has used every usable core",
            "Make each sample cheaper or add cores: decode and augment on the GPU (NVIDIA "
            "DALI, torchvision.transforms.v2 on CUDA tensors), pre-process the data set "
            "once (resize, decode) and store the result, or run on a machine with more "
            "cores.",
            ev,
        )
    if dominant is None and busy < th.activity_min_samples:
        if s.iowait_mean_pct is not None and s.iowait_mean_pct >= th.iowait_high_pct:
            return InputCause(
                "io",
                Category.IO,
                f"the host waits on storage ({s.iowait_mean_pct:.0f} % iowait)",
                "Make reads cheaper: copy the data set to local NVMe/SSD, cache decoded "
                "samples, pack small files into sharded formats"
                + _more_workers(workers, n, loader_fix),
                ev,
            )
        net = s.net_recv_mean_bytes_per_s
        disk = s.disk_read_mean_bytes_per_s or 0.0
        if net is not None and net >= th.net_recv_high_bytes_per_s and net > disk:
            return InputCause(
                "network",
                Category.NETWORK,
                f"data arrives over the network ({net / MIB:.0f} MiB/s received)",
                "Copy or cache the data on local disk before training and prefetch "
                "more batches" + _more_workers(workers, n, loader_fix),
                ev,
            )
    if idle and (workers is None or workers < n):
        what = (
            "the loader has too few workers while cores sit idle"
            if workers is not None
            else "data is prepared in too few processes while cores sit idle"
        )
        return InputCause(
            "workers",
            Category.FRAMEWORK_CONFIG,
            what,
            f"Load in parallel: {loader_fix}; {n} workers fit the {_cores(cores)} usable cores.",
            ev,
        )
    return InputCause(
        "cpu",
        Category.CPU,
        "preparing batches is slower than the training step",
        "Make each sample cheaper: decode and augment on the GPU (NVIDIA DALI, "
        "torchvision.transforms.v2 on CUDA tensors) or pre-process the data set once; "
        "profile the Dataset's __getitem__ to find the slow transform.",
        ev,
    )


def others_crowd(view: RunView, th: Thresholds) -> bool:
    """Others' processes take a large share of the cores and the machine is full."""
    s = view.summary
    cores = view.usable_cores
    others = s.others_cpu_mean_cores
    if cores is None or others is None or s.system_cpu_mean_pct is None:
        return False
    return (
        others >= max(1.0, th.others_cpu_share * cores)
        and s.system_cpu_mean_pct >= th.system_cpu_busy_pct
    )


def _more_workers(workers: int | None, n: int, loader_fix: str) -> str:
    if workers is not None and workers < n:
        return f"; meanwhile overlap the waits with more workers: {loader_fix}."
    return "."


def _cores(cores: float | None) -> str:
    return "?" if cores is None else f"{cores:g}"


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


# --- /dev/shm --------------------------------------------------------------------------------

_SHM_TEXT = re.compile(r"bus error|shared memory|/dev/shm|shm_open|sigbus", re.IGNORECASE)
_SIGBUS = 7


def shm_too_small(view: RunView, th: Thresholds) -> list[Finding]:
    """Workers pass batches through ``/dev/shm``: a bus error, or a ``/dev/shm`` under
    ``shm_min_bytes`` while workers run."""
    workers = max((lo.num_workers for lo in view.record.loaders), default=None)
    events = [
        e
        for e in view.record.events
        if e.kind in ("bus_error", "shm") or _SHM_TEXT.search(f"{e.message} {e.data}")
    ]
    sigbus = view.record.meta.exit_code == -_SIGBUS
    shm = view.machine.host.shm if view.machine is not None else None
    ev: dict[str, Any] = {"num_workers": workers}
    if shm is not None:
        ev["shm_path"] = shm.path
        ev["shm_total_bytes"] = shm.total_bytes
        ev["shm_free_bytes"] = shm.free_bytes
        ev["shm_min_bytes"] = th.shm_min_bytes
    fix = SHM_FIX_WITH_WORKERS
    if events or (sigbus and workers):
        ev["shm_events"] = len(events)
        ev["exit_code"] = view.record.meta.exit_code
        if events:
            ev["first_event"] = events[0].message[:200]
        return [
            Finding(
                id="input.shm_exhausted",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.ERROR,
                title="DataLoader workers ran out of shared memory (/dev/shm)",
                evidence=ev,
                fix=fix,
                impact=None,
                subject=shm.path if shm is not None else "/dev/shm",
            )
        ]
    if (
        workers
        and shm is not None
        and shm.total_bytes is not None
        and shm.total_bytes < th.shm_min_bytes
    ):
        return [
            Finding(
                id="input.shm_small",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.WARNING,
                title=(
                    f"/dev/shm holds only {shm.total_bytes / MIB:.0f} MiB for {workers} "
                    "DataLoader workers"
                ),
                evidence=ev,
                fix=fix,
                impact=None,
                subject=shm.path,
            )
        ]
    return []
