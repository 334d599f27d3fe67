"""The GPUs a watched job uses, and their readings over the window (NVML, or a simulation).

A :class:`GpuWatch` reads every GPU of the backend through the supervisor's own
sampler (:class:`~trainmedic.supervise.observe.samplers.GpuSampler`: once a second,
stretched when a reading costs more) on a thread of its own while the stacks
are sampled. The job's GPUs are those whose NVML process list holds one of its
pids; inside a container NVML may list the host's pids instead, so the GPU
device files its processes hold open (``/dev/nvidiaN``) name them then. Nothing
here touches the job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import RunEvent
from trainmedic.supervise.observe.samplers import GpuSampler, SamplerThread

_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class GpuWindow:
    """What the GPUs showed during the window.

    Attributes:
        backend: ``nvml``, ``simulated`` or ``none``.
        absent: why there are no readings (no driver, no GPU), else ``None``.
        samples: every reading, in time order.
        job_gpus: NVML indices of the GPUs the job uses.
        matched_by: how they were told: ``processes`` (NVML's process lists),
            ``device files`` (``/dev/nvidiaN`` held open), or ``""`` (not told).
        problems: readings that failed (one line each).
    """

    backend: str
    absent: str | None
    samples: tuple[GpuSample, ...] = ()
    job_gpus: tuple[int, ...] = ()
    matched_by: str = ""
    problems: tuple[str, ...] = ()


def device_files(pids: Iterable[int]) -> set[int]:
    """GPU minor numbers whose ``/dev/nvidiaN`` one of ``pids`` holds open."""
    found: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                m = _DEVICE.match(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if m:
                found.add(int(m.group(1)))
    return found


def job_gpus(
    samples: Iterable[GpuSample], pids: Iterable[int], files: set[int]
) -> tuple[tuple[int, ...], str]:
    """The job's GPUs and how they were told (:class:`GpuWindow`)."""
    wanted = set(pids)
    readings = list(samples)
    matched = {g.index for g in readings if any(p.pid in wanted for p in g.processes)}
    if matched:
        return tuple(sorted(matched)), "processes"
    indices = {g.index for g in readings}
    held = files & indices
    if held:
        return tuple(sorted(held)), "device files"
    return (), ""


class GpuWatch:
    """Reads every GPU during the window; :meth:`stop` returns what it saw."""

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend
        self._samples: list[GpuSample] = []
        self._problems: list[str] = []
        self._sampler = GpuSampler(backend, self._samples.append, self._event)
        self._thread = SamplerThread("attach-gpu", self._sampler.sample_once, self._error)

    def _event(self, event: RunEvent) -> None:
        self._problems.append(event.message)

    def _error(self, exc: BaseException) -> None:
        self._problems.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> GpuWatch:
        if self._backend.absent_reason is None:
            self._thread.start()
        return self

    def stop(self, pids: Iterable[int]) -> GpuWindow:
        """Stop reading; the job's GPUs are told by ``pids``, its processes."""
        self._thread.stop()
        if self._backend.absent_reason is None and not self._samples:
            self._sampler.sample_once()  # a window shorter than one period
        job = list(pids)
        samples = tuple(sorted(self._samples, key=lambda g: (g.timestamp, g.index)))
        gpus, how = job_gpus(samples, job, device_files(job) if samples else set())
        return GpuWindow(
            backend=self._backend.kind,
            absent=self._backend.absent_reason,
            samples=samples,
            job_gpus=gpus,
            matched_by=how,
            problems=tuple(self._problems),
        )


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def readings(window: GpuWindow, pids: Iterable[int]) -> list[dict[str, Any]]:
    """Each GPU's readings over the window, summed up: the job's flagged, with the GPU
    memory each job process holds (NVML per process)."""
    job = set(pids)
    out = []
    for index in sorted({g.index for g in window.samples}):
        series = [g for g in window.samples if g.index == index]
        last = series[-1]
        util = [g.utilization_gpu_pct for g in series if g.utilization_gpu_pct is not None]
        used = [g.memory_used_bytes for g in series if g.memory_used_bytes is not None]
        temps = [g.temperature_c for g in series if g.temperature_c is not None]
        power = [g.power_draw_w for g in series if g.power_draw_w is not None]
        out.append(
            {
                "index": index,
                "name": last.name,
                "uuid": last.uuid,
                "job": index in window.job_gpus,
                "readings": len(series),
                "utilization_pct_mean": _mean(util),
                "utilization_pct_min": min(util) if util else None,
                "memory_used_bytes_max": max(used) if used else None,
                "memory_total_bytes": last.memory_total_bytes,
                "temperature_c_max": max(temps) if temps else None,
                "power_w_mean": _mean(power),
                "processes": [
                    {"pid": p.pid, "job": p.pid in job, "used_memory_bytes": p.used_memory_bytes}
                    for p in last.processes
                ],
                "processes_unreadable": last.processes_unreadable,
                "unreachable": last.unreachable,
            }
        )
    return out
