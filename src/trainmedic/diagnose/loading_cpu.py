"""The CPU the data loading has: cores, the job's useful CPU, spare room, starvation.

The input rule's causes (:mod:`trainmedic.diagnose.input_causes`,
:mod:`trainmedic.diagnose.handoff_causes`) and the contention rule weigh the
same CPU facts, measured once here from :attr:`RunView.cpu
<trainmedic.diagnose.view.RunView.cpu>` and the run summary (docs/diagnosis.md,
"The job's CPU and its threads' waits").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView


@dataclass(frozen=True)
class LoadingCpu:
    """The CPU facts the cause depends on (cores; ``None``: not measured)."""

    usable: float | None
    job: float | None
    others: float | None
    useful: float | None
    spare: float | None
    loading_wait: float | None
    throttled: float | None

    def room(self, th: Thresholds) -> bool:
        """Whether another loader process has a core: spare cores at least
        ``spare_min_cores`` (and the share a saturated machine leaves)."""
        if self.spare is None or self.usable is None:
            return True  # nothing says the cores are full
        return self.spare >= full_bar(self.usable, th)


def full_bar(usable: float, th: Thresholds) -> float:
    """Spare cores under which another loader process has no room, cores."""
    # Job CPU is averaged over seconds and includes idle moments: on a big
    # machine, less than (1 - cpu_saturated_share) of it spare is full.
    return max(th.spare_min_cores, (1.0 - th.cpu_saturated_share) * usable)


def loading_cpu(view: RunView, th: Thresholds, workers: int | None) -> LoadingCpu:
    """The CPU facts of the loading: with ``workers``, the workers are the loading
    threads; without, the training thread."""
    s = view.summary
    cpu = view.cpu
    usable = view.usable_cores
    useful = cpu.useful_cores(s.job_cpu_mean_cores, s.compute_share, usable)
    loading_wait = cpu.loader_wait_share if workers else cpu.train_wait_share
    others = s.others_cpu_mean_cores or 0.0
    waits = [w for w in (cpu.train_wait_share, cpu.loader_wait_share) if w is not None]
    if waits and max(waits) < th.cpu_wait_warning_share:
        # The job's threads got a CPU whenever they wanted one: others only used
        # what the job left (idle moments, lower priority), so they take no room.
        others = 0.0
    spare = None
    if usable is not None and useful is not None:
        spare = usable - useful - others
    return LoadingCpu(
        usable, s.job_cpu_mean_cores, s.others_cpu_mean_cores, useful, spare, loading_wait,
        cpu.throttled_share,
    )  # fmt: skip


def cpu_evidence(cpu: LoadingCpu, view: RunView) -> dict[str, Any]:
    """The CPU measurements every input cause shows (cores, waits for a CPU)."""
    ev: dict[str, Any] = {
        "usable_cores": cpu.usable,
        "job_cpu_cores": cpu.job,
        "others_cpu_cores": cpu.others,
        "job_useful_cpu_cores": cpu.useful,
        "spare_cores": cpu.spare,
        "loading_cpu_wait_share": cpu.loading_wait,
        "train_cpu_wait_share": view.cpu.train_wait_share,
        "cgroup_throttled_share": cpu.throttled or None,
    }
    return {k: v for k, v in ev.items() if v is not None}


def others_crowd(view: RunView, th: Thresholds) -> bool:
    """Without thread measurements: others take a large share of the cores and the
    machine is full."""
    s = view.summary
    cores = view.usable_cores
    others = s.others_cpu_mean_cores
    if cores is None or others is None or s.system_cpu_mean_pct is None:
        return False
    return (
        others >= max(1.0, th.others_cpu_share * cores)
        and s.system_cpu_mean_pct >= th.system_cpu_busy_pct
    )
