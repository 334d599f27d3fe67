"""Hardware evidence: Xids in the kernel log (judged by :mod:`trainmedic.gpu.faults`)
and faults the GPU sampler saw, and how they turn a failure into a hardware fault."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.findings.model import Category
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuRef, GpuSample
from trainmedic.gpu.visible import nvml_gpu_for_cuda_device, visible_entries
from trainmedic.resilience.classify.model import (
    MAX_LINE_CHARS,
    Base,
    Classification,
    FailureClass,
    FailureEvidence,
)


@dataclass(frozen=True)
class _Hardware:
    gpu: GpuRef | None
    xid: faults.XidEvent | None
    lines: tuple[str, ...]
    reason: str

    @property
    def needs_attention(self) -> bool:
        """The GPU must be reset or drained (not only the job restarted)."""
        return self.xid is None or self.xid.verdict.hardware


_XID_RANK = {
    faults.XidAction.DRAIN_NODE: 3,
    faults.XidAction.RESET_GPU: 2,
    faults.XidAction.RESTART_APP: 1,
}


def _is_hardware_xid(event: faults.XidEvent) -> bool:
    """An Xid that explains a failure by the GPU: one the catalogue says needs a
    reset or a drained node, or a contained memory error (Xid 94). Informational
    codes (63, 92) and application faults (13, 31, 43) never do."""
    verdict = event.verdict
    return verdict.hardware or event.code in faults.HARDWARE_RESTART_CODES


def hardware_evidence(evidence: FailureEvidence, lines: Sequence[str]) -> _Hardware | None:
    """Hardware Xids in the kernel log (or stderr) or reported as data, or faults the GPU
    sampler saw."""
    found: list[tuple[faults.XidEvent, str]] = []
    visible = _visible_buses(evidence)
    parsed = [(faults.parse_xid_line(line), line) for line in [*evidence.kernel_log, *lines]]
    reported = [(x, x.line or f"Xid {x.code}") for x in evidence.xids]
    for event, line in [*parsed, *reported]:
        if event is None or not _is_hardware_xid(event):
            continue
        if visible is not None and event.pci_bus_id is not None and event.pci_bus_id not in visible:
            continue  # a GPU the attempt could not see: not its failure
        found.append((event, line.strip()[:MAX_LINE_CHARS]))
    if found:
        # The most serious wins; among equals, the earliest.
        event, text = max(found, key=lambda f: _XID_RANK.get(f[0].verdict.action, 0))
        verdict = event.verdict
        gpu = _resolve_gpu(GpuRef(pci_bus_id=event.pci_bus_id), evidence.gpus)
        reason = f"Xid {event.code}: {event.detail or verdict.meaning}"
        return _Hardware(gpu=gpu, xid=event, lines=(text,), reason=reason)
    if evidence.gpu_faults:
        fault = evidence.gpu_faults[0]
        return _Hardware(gpu=fault.gpu, xid=None, lines=(), reason=fault.reason)
    return None


def _visible_buses(evidence: FailureEvidence) -> set[str] | None:
    """PCI bus ids of the GPUs the attempt could see; ``None`` when that cannot be told."""
    if evidence.visible_devices is None or not evidence.gpus:
        return None
    env = {"CUDA_VISIBLE_DEVICES": evidence.visible_devices}
    if evidence.device_order is not None:
        env["CUDA_DEVICE_ORDER"] = evidence.device_order
    count = len(visible_entries(env) or [])
    buses = set()
    for ordinal in range(count):
        found = nvml_gpu_for_cuda_device(ordinal, env, evidence.gpus)
        if found is None or found.pci_bus_id is None:
            return None
        buses.add(found.pci_bus_id)
    return buses


def _resolve_gpu(ref: GpuRef, gpus: Sequence[GpuSample]) -> GpuRef | None:
    """``ref`` with every identity the machine's GPUs know; ``None`` for an empty ref."""
    if ref.pci_bus_id is None and ref.uuid is None and ref.index is None:
        return None
    return next((g.ref for g in gpus if g.ref.same_gpu(ref)), ref)


def with_hardware(
    base: Base, specific: Classification | None, hw: _Hardware, what: str
) -> Classification:
    details: dict[str, Any] = dict(specific.details) if specific else {}
    details["hardware"] = hw.needs_attention
    if hw.xid is not None:
        details["xid"] = hw.xid.code
        details["xid_action"] = hw.xid.verdict.action.value
        details["xid_detail"] = hw.xid.detail[:MAX_LINE_CHARS]
        if hw.xid.gpu_instance is not None:
            details["mig_gpu_instance"] = hw.xid.gpu_instance
    if hw.gpu is not None and hw.gpu.pci_bus_id:
        details["gpu_pci_bus_id"] = hw.gpu.pci_bus_id
    lines = [*(specific.evidence_lines if specific else ()), *hw.lines]
    return base.make(
        FailureClass.CUDA_ERROR,
        Category.HARDWARE_FAULT,
        "high",
        f"{what}; GPU {hw.gpu or '?'} reported a hardware fault ({hw.reason})",
        lines,
        location=specific.location if specific else None,
        details=details,
        gpu=hw.gpu,
    )
