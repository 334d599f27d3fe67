"""Each side of a comparison: a run's facts (:class:`RunFacts`: its throughput from its
steady steps, their blocks for the bootstrap, and the readings a confounder is weighed
on), and a side's repeated runs merged into one. Pure; rates are samples (or steps) per
second, times the training processes that step side by side.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmedic.diagnose.view import RunView
from trainmedic.record.stats import RunSummary
from trainmedic.report.compare_stats import blocks_of, halves

OTHERS_MIN_CORES = 0.5
"""Others' CPU from which the training thread's waits are theirs (diagnosis's value)."""


@dataclass(frozen=True)
class RunFacts:
    """One side of the comparison.

    Attributes:
        name: the run directory's name (or run id).
        rate_unit: ``samples/s`` or ``steps/s``.
        rate: throughput of the job in that unit.
        blocks: (units, seconds) per block of consecutive steady steps, for the bootstrap.
    """

    name: str
    command: tuple[str, ...]
    summary: RunSummary
    steady_steps: int
    processes: int
    samples_known: bool
    rate: float | None
    rate_unit: str
    blocks: tuple[tuple[float, float], ...]
    train_cpu_wait_share: float | None
    others_wait_share: float
    others_cpu_cores: float | None
    gpu_sm_clock_mhz: float | None
    gpu_memory_used_max_gib: float | None
    usable_cores: float | None = None
    steal_pct: float | None = None
    throttled_share: float | None = None
    foreign_gpu_processes: int = 0
    host: str | None = None
    gpu_models: tuple[str, ...] = ()
    torch_version: str | None = None
    halves: tuple[float, float] | None = None
    """The rate of the first and of the second half of the steady blocks."""
    script: str | None = None
    """The training script's version as the run started: its name with its git commit
    (``+modified`` when the file differed from it) or the start of its hash."""


def samples_known(view: RunView) -> bool:
    """Whether the run has steady steps and each says how many samples it took."""
    return view.summary.steps_steady > 0 and all(s.samples is not None for s in view.steady)


def run_facts(view: RunView, name: str, samples: bool) -> RunFacts:
    """The facts of one run, called ``name``: its rate in samples/s when ``samples``
    (every run compared knows its batch), else in steps/s."""
    s = view.summary
    spans = sorted(view.steady, key=lambda x: x.t_end)
    processes = view.concurrent_processes
    blocks = blocks_of(spans, samples, processes)
    units = sum(u for u, _ in blocks)
    seconds = sum(t for _, t in blocks)
    gpus = [g for g in s.gpus if g.used_by_job or g.used_by_job is None]
    used = [g.memory_used_max_bytes for g in gpus if g.memory_used_max_bytes is not None]
    clocks = [g.sm_clock_mean_mhz for g in gpus if g.sm_clock_mean_mhz is not None]
    return RunFacts(
        name=name,
        command=tuple(view.record.meta.command),
        summary=s,
        steady_steps=s.steps_steady,
        processes=processes,
        samples_known=samples,
        rate=units / seconds if seconds > 0 else None,
        rate_unit="samples/s" if samples else "steps/s",
        blocks=tuple(blocks),
        train_cpu_wait_share=view.cpu.train_wait_share,
        others_wait_share=_others_wait_share(view),
        others_cpu_cores=s.others_cpu_mean_cores,
        gpu_sm_clock_mhz=statistics.fmean(clocks) if clocks else None,
        gpu_memory_used_max_gib=max(used) / 2**30 if used else None,
        usable_cores=view.usable_cores,
        steal_pct=view.cpu.steal_pct,
        throttled_share=view.cpu.throttled_share,
        foreign_gpu_processes=_foreign_gpu_processes(view),
        host=_env(view, "host", "hostname"),
        gpu_models=tuple(sorted({str(g.get("name")) for g in _gpus(view) if g.get("name")})),
        torch_version=_env(view, "torch", "version"),
        halves=halves(blocks),
        script=_script(view),
    )


def _script(view: RunView) -> str | None:
    found = view.record.meta.environment.get("script")
    if not isinstance(found, dict) or not found.get("path"):
        return None
    name = Path(str(found["path"])).name
    digest = f"sha256 {str(found['sha256'])[:12]}" if found.get("sha256") else ""
    if found.get("git_commit"):
        at = f"{name} at {str(found['git_commit'])[:10]}"
        # A file changed since the commit is told apart by its bytes.
        return f"{at}+modified ({digest})" if found.get("git_modified") and digest else at
    return f"{name} ({digest})" if digest else None


def _env(view: RunView, part: str, key: str) -> str | None:
    found = view.record.meta.environment.get(part)
    value = found.get(key) if isinstance(found, dict) else None
    return str(value) if value else None


def _gpus(view: RunView) -> list[dict[str, Any]]:
    gpu = view.record.meta.environment.get("gpu")
    devices = gpu.get("gpus") if isinstance(gpu, dict) else None
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


def _foreign_gpu_processes(view: RunView) -> int:
    """Processes not the job's seen on the job's GPUs."""
    jobs = view.pids
    indices = set(view.job_gpu_indices)
    return len({p.pid for g in view.record.gpu if g.index in indices
                for p in g.processes if p.pid not in jobs})  # fmt: skip


def merged(runs: Sequence[RunFacts]) -> RunFacts:
    """One side's runs as one: its rate the mean of the runs' rates, its measures the
    means of theirs (the first run's summary stands for the step-time details)."""
    if len(runs) == 1:
        return runs[0]

    def mean_of(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None

    first = runs[0]
    rates = [r.rate for r in runs]
    return dataclasses.replace(
        first,
        name=f"{first.name} +{len(runs) - 1}",
        steady_steps=sum(r.steady_steps for r in runs),
        rate=None if None in rates else statistics.fmean([r for r in rates if r is not None]),
        blocks=tuple(b for r in runs for b in r.blocks),
        train_cpu_wait_share=mean_of([r.train_cpu_wait_share for r in runs]),
        others_wait_share=statistics.fmean(r.others_wait_share for r in runs),
        others_cpu_cores=mean_of([r.others_cpu_cores for r in runs]),
        gpu_sm_clock_mhz=mean_of([r.gpu_sm_clock_mhz for r in runs]),
        gpu_memory_used_max_gib=max((r.gpu_memory_used_max_gib for r in runs
                                     if r.gpu_memory_used_max_gib is not None), default=None),
        steal_pct=mean_of([r.steal_pct for r in runs]),
        throttled_share=mean_of([r.throttled_share for r in runs]),
        foreign_gpu_processes=max(r.foreign_gpu_processes for r in runs),
        halves=None,
    )  # fmt: skip


def _others_wait_share(view: RunView) -> float:
    """The training thread's wait for a CPU that other processes caused (0 when its own
    threads outnumbering the cores explain it better: the contention rule's attribution)."""
    cpu = view.cpu
    wait = cpu.train_wait_share
    others = view.summary.others_cpu_mean_cores or 0.0
    if wait is None or others < OTHERS_MIN_CORES:
        return 0.0
    cores = view.usable_cores
    own_excess = max(0.0, (cpu.job_runnable_cores or 0.0) - (cores or float("inf")))
    return min(0.95, wait) if others >= own_excess else 0.0
