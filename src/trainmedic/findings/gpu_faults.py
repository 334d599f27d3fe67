"""Findings about GPU faults that doctor and the run diagnosis both give.

doctor reads Xids from the kernel log since boot; the run diagnosis from the
``xid`` events of the run; both see GPUs that stopped answering. They build
the finding here, from :mod:`trainmedic.gpu.faults`, so the same Xid or lost
GPU gets the same id, severity, meaning and fix wherever it is seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample, normalize_pci_bus_id


@dataclass(frozen=True)
class XidGroup:
    """Xid events of one code on one GPU.

    Attributes:
        gpu_index: NVML index when the GPU is known, else ``None``.
        pci_bus_id: the bus id the lines named, normalised.
        count: how many events.
        first: the first event's log line.
        detail: the text after the code of the last event (Xid 154's action).
        gpu_instances: MIG GPU instances the lines named.
    """

    code: int
    gpu_index: int | None
    pci_bus_id: str | None
    count: int
    first: str
    detail: str
    gpu_instances: tuple[int, ...] = ()


def gpu_index_for_bus(bus: str | None, gpus: Sequence[GpuSample]) -> int | None:
    """The NVML index of the GPU at PCI address ``bus`` among ``gpus``."""
    if not bus:
        return None
    wanted = normalize_pci_bus_id(bus)
    return next((g.index for g in gpus if g.pci_bus_id == wanted), None)


def group_xids(
    events: Sequence[faults.XidEvent],
    gpus: Sequence[GpuSample],
    indices: Sequence[int | None] | None = None,
) -> list[XidGroup]:
    """Events grouped by (GPU, code); a GPU is found by its PCI bus id, else by
    ``indices[i]``, the NVML index the source of event ``i`` gave."""
    groups: dict[tuple[int | None, str | None, int], list[faults.XidEvent]] = {}
    for i, e in enumerate(events):
        index = gpu_index_for_bus(e.pci_bus_id, gpus)
        if index is None and indices is not None:
            index = indices[i]
        groups.setdefault((index, e.pci_bus_id if index is None else None, e.code), []).append(e)
    out = [
        XidGroup(
            code=code,
            gpu_index=index,
            pci_bus_id=next((e.pci_bus_id for e in evs if e.pci_bus_id), bus),
            count=len(evs),
            first=evs[0].line,
            detail=evs[-1].detail,
            gpu_instances=_instances(evs),
        )
        for (index, bus, code), evs in groups.items()
    ]
    return sorted(out, key=lambda g: (g.gpu_index if g.gpu_index is not None else -1, g.code))


def _instances(events: Sequence[faults.XidEvent]) -> tuple[int, ...]:
    return tuple(sorted({e.gpu_instance for e in events if e.gpu_instance is not None}))


def xid_finding(group: XidGroup, when: str) -> Finding:
    """The finding for ``group``; ``when`` says over what time ("since boot", "during the run")."""
    verdict = faults.xid_verdict(group.code, group.detail)
    if group.gpu_index is not None:
        where, subject = f"GPU {group.gpu_index}", f"gpu{group.gpu_index}"
    elif group.pci_bus_id:
        where, subject = f"the GPU at {group.pci_bus_id}", group.pci_bus_id
    else:
        where, subject = "a GPU", None
    times = f"{group.count} time{'s' if group.count != 1 else ''} {when}"
    evidence: dict[str, Any] = {
        "xid": group.code,
        "events": group.count,
        "catalogue_action": verdict.action.value,
        "first_message": group.first,
    }
    if group.pci_bus_id:
        evidence["pci_bus_id"] = group.pci_bus_id
    if group.gpu_instances:
        evidence["mig_gpu_instances"] = list(group.gpu_instances)
    return Finding(
        id=f"hardware.xid.{group.code}",
        category=Category.HARDWARE_FAULT,
        severity=Severity(verdict.level),
        title=f"Xid {group.code} on {where} ({times}): {verdict.meaning}",
        evidence=evidence,
        fix=verdict.fix if group.gpu_index is None else verdict.fix.replace(
            "<index>", str(group.gpu_index)
        ),
        impact=None,
        subject=subject,
    )


def unreachable_finding(s: GpuSample, severity: Severity, when: str) -> Finding:
    """A GPU the driver lists but cannot reach (lost from the bus, needs a reset).

    Names the GPU only by identities the driver gave before it was lost.
    """
    evidence: dict[str, Any] = {"nvml_error": s.unreachable}
    if s.uuid:
        evidence["uuid"] = s.uuid
    if s.pci_bus_id:
        evidence["pci_bus_id"] = s.pci_bus_id
    return Finding(
        id="hardware.gpu_unreachable",
        category=Category.HARDWARE_FAULT,
        severity=severity,
        title=f"GPU {s.index} stopped answering the driver {when} ({s.unreachable})",
        evidence=evidence,
        fix=(
            "Check the kernel log for the Xid that explains it (sudo dmesg | grep -i xid): "
            f"{faults.lost_gpu_xid_hint()}. Drain the node, then "
            f"reset the GPU (sudo nvidia-smi -r -i {s.index}) or reboot; if it recurs, reseat "
            "or replace it. Until then keep work off it (CUDA_VISIBLE_DEVICES without it)."
        ),
        impact=None,
        subject=f"gpu{s.index}",
    )


def hidden_by_mig(s: GpuSample) -> list[str]:
    """The readings this MIG-mode GPU does not give (NVML answers NotSupported or NoPermission)."""
    hidden = []
    if s.utilization_gpu_pct is None:
        hidden.append("GPU utilization")
    if s.remapped_rows.pending is None and s.remapped_rows.failure is None:
        hidden.append("row remapping")
    if s.known_processes is None:
        hidden.append("the process list")
    elif any(p.used_memory_bytes is None for p in s.processes):
        hidden.append("per-process memory")
    return hidden


def mig_finding(s: GpuSample, when: str) -> Finding:
    """A GPU in MIG mode, named with what MIG hides from trainmedic."""
    hidden = hidden_by_mig(s)
    instances = [
        {
            "uuid": m.uuid,
            "gpu_instance_id": m.gpu_instance_id,
            "memory_total_gib": None
            if m.memory_total_bytes is None
            else round(m.memory_total_bytes / (1 << 30), 1),
        }
        for m in s.mig_devices
    ]
    blind = []
    if "GPU utilization" in hidden:
        blind.append("whether the GPU is the bottleneck")
    if "the process list" in hidden:
        blind.append("other tenants on it and when its memory is released")
    if "row remapping" in hidden:
        blind.append("pending memory repairs")
    n = len(s.mig_devices)
    title = f"GPU {s.index} is in MIG mode ({n} instance{'' if n == 1 else 's'} read)"
    if when != "now":
        title += f" {when}"
    if hidden:
        title += f": NVML hides {_and(hidden)}"
    evidence: dict[str, Any] = {"mig_instances": instances, "hidden_readings": hidden}
    if s.processes_unreadable:
        evidence["processes_unreadable"] = s.processes_unreadable
    return Finding(
        id="gpu.mig_mode",
        category=Category.GPU_CAPACITY,
        severity=Severity.INFO,
        title=title,
        evidence=evidence,
        detail=(
            "A job on a MIG instance gets that slice of the GPU, not the whole GPU."
            + (f" trainmedic cannot judge {_and(blind)}." if blind else "")
        ),
        fix=(
            "Nothing is wrong with MIG itself. To see per-instance load use DCGM's profiling "
            "metrics (dcgmi dmon -e 1001,1002); run trainmedic as root to read the whole GPU's "
            "processes; for a job that needs the whole GPU, disable MIG when no instance is in "
            f"use (sudo nvidia-smi -i {s.index} -mig 0, then reset the GPU)."
        ),
        impact=None,
        subject=f"gpu{s.index}",
    )


def processes_unknown_finding(s: GpuSample, when: str) -> Finding:
    """A GPU whose process list could not be read: other tenants are unknown, not absent."""
    used = s.memory_used_bytes
    return Finding(
        id="contention.gpu.processes_unknown",
        category=Category.CONTENTION,
        severity=Severity.INFO,
        title=(
            f"GPU {s.index}'s processes could not be read {when}: other users' work on it "
            "would not be seen"
        ),
        evidence={
            "processes_unreadable": s.processes_unreadable,
            "memory_used_gib": None if used is None else round(used / (1 << 30), 2),
            "utilization_gpu_pct": s.utilization_gpu_pct,
        },
        fix=(
            "Run trainmedic (or nvidia-smi) as root to see every process on the GPU, or ask "
            "the administrator whether the GPU is dedicated to you."
        ),
        impact=None,
        subject=f"gpu{s.index}",
    )


def _and(items: Sequence[str]) -> str:
    """``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
