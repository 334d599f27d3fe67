"""What the run record keeps about where the job ran: the machine's facts
(for diagnosis), the environment summary in ``meta.json``, and the probe
bootstraps that failed to load."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.framework.torch_build import TorchBuild, parse_cuda_version, read_torch_build
from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample
from trainmedic.host.types import HostFacts
from trainmedic.probe import env as probe_env
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent
from trainmedic.simulation import Simulation
from trainmedic.supervise.observe.processes import ProcessTable


def machine_facts(
    table: ProcessTable,
    backend: GpuBackend,
    simulation: Simulation | None,
    host: HostFacts | None,
    first_gpu: Mapping[int, GpuSample],
) -> MachineFacts | None:
    """The machine as diagnosis sees it; ``None`` when the host could not be read.

    ``first_gpu`` holds each GPU's first reading (by NVML index); the job's
    torch is the one its probe reported, else the installed one.
    """
    if host is None:
        return None
    try:
        driver = backend.driver()
    except Exception:
        driver = None
    gpus = GpuFacts(
        backend=backend.kind,
        driver=driver,
        samples=tuple(first_gpu[i] for i in sorted(first_gpu)),
        absent_reason=backend.absent_reason,
    )
    if simulation is not None and simulation.torch is not None:
        torch: TorchBuild | None = simulation.torch
    else:
        torch = _torch_build(table)
    return MachineFacts(host=host, gpu=gpus, torch=torch)


def _torch_build(table: ProcessTable) -> TorchBuild | None:
    """The job's torch as its probe saw it, else the installed one read from files."""
    info = table.torch_info()
    if info is None:
        return read_torch_build(import_torch=False)
    return TorchBuild(
        version=info.version,
        cuda_version=parse_cuda_version(info.cuda_version),
        arch_list=info.arch_list,
        cudnn_version=info.cudnn_version,
        cudnn_available=info.cudnn_version is not None,
        cuda_available=info.cuda_initialized,
        probed=info.cuda_initialized,
    )


def bootstrap_errors(run_dir: Path) -> list[RunEvent]:
    """Probe bootstraps that failed to load leave a line each; they become events."""
    path = run_dir / probe_env.BOOTSTRAP_ERRORS
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines[:100]:
        pid_text, _, message = line.partition(" ")
        events.append(
            RunEvent(
                t=path.stat().st_mtime,
                kind=EventKind.PROBE_ERROR,
                message=f"probe could not load: {message}",
                pid=int(pid_text) if pid_text.isdigit() else None,
                data={"part": "bootstrap"},
            )
        )
    return events


def environment(
    machine: MachineFacts | None, table: ProcessTable, simulate: str | None
) -> dict[str, Any]:
    """The machine and the job's torch, as JSON-ready data for meta.json."""
    env: dict[str, Any] = {"simulation": simulate}
    if machine is not None:
        host = machine.host
        env["host"] = {
            "hostname": host.hostname,
            "logical_cores": host.cpu.logical_cores,
            "usable_cores": host.cpu.usable_cores,
            "memory_total_bytes": host.memory.total_bytes,
        }
        env["gpu"] = {
            "backend": machine.gpu.backend,
            "driver": None if machine.gpu.driver is None else machine.gpu.driver.version,
            "absent_reason": machine.gpu.absent_reason,
            "gpus": [
                {
                    "index": s.index,
                    "name": s.name,
                    "uuid": s.uuid,
                    "memory_total_bytes": s.memory_total_bytes,
                }
                for s in machine.gpu.samples
            ],
        }
    info = table.torch_info()
    if info is not None:
        env["torch"] = {
            "version": info.version,
            "cuda_version": info.cuda_version,
            "cudnn_version": info.cudnn_version,
            "cuda_initialized": info.cuda_initialized,
            "devices": list(info.devices),
        }
    elif machine is not None and machine.torch is not None:
        env["torch"] = {
            "version": machine.torch.version,
            "cuda_version": machine.torch.cuda_version,
        }
    env["processes"] = len(table.snapshot())
    return env
