"""Failing GPU hardware seen during the run (``hardware_fault``).

Counters judged by their change during the run (what existed before is
doctor's business): volatile uncorrected ECC errors, row-remapping state,
pending page retirement; GPUs that stopped answering the driver; and Xid
events the supervisor recorded (kind ``xid``: the kernel log line as message,
``data["xid"]`` the code, ``data["pci_bus_id"]`` / ``data["gpu"]`` the GPU
when known). Xids are judged by NVIDIA's catalogue (:mod:`trainmedic.gpu.faults`),
exactly as doctor and the failure classifier judge them.
"""

from __future__ import annotations

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.gpu_faults import group_xids, unreachable_finding, xid_finding
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent

_DRAIN = (
    "Drain the GPU: move the job to another GPU or node (CUDA_VISIBLE_DEVICES / the "
    "scheduler's exclude list), reset it (nvidia-smi -r) when idle, and report it to the "
    "provider if it repeats."
)


def hardware_faults(view: RunView, th: Thresholds) -> list[Finding]:
    findings: list[Finding] = []
    for index in view.job_gpu_indices:
        series = view.gpu_series(index, steady_only=False)
        subject = f"gpu{index}"
        ecc = [g.ecc.volatile_uncorrected for g in series if g.ecc.volatile_uncorrected is not None]
        if len(ecc) >= 2 and max(ecc) > ecc[0]:
            findings.append(
                Finding(
                    id="hardware.ecc_uncorrected",
                    category=Category.HARDWARE_FAULT,
                    severity=Severity.ERROR,
                    title=f"GPU {index} had {max(ecc) - ecc[0]} uncorrected ECC errors "
                    "during the run",
                    evidence={
                        "ecc_uncorrected_added": max(ecc) - ecc[0],
                        "ecc_uncorrected_start": ecc[0],
                    },
                    fix=_DRAIN,
                    subject=subject,
                )
            )
        if any(g.remapped_rows.failure for g in series):
            findings.append(
                Finding(
                    id="hardware.row_remap_failure",
                    category=Category.HARDWARE_FAULT,
                    severity=Severity.ERROR,
                    title=f"GPU {index} failed to remap a bad memory row",
                    evidence={"remapped_rows_failure": True},
                    fix=_DRAIN,
                    subject=subject,
                )
            )
        elif any(g.remapped_rows.pending for g in series) or any(
            g.retired_pages_pending for g in series
        ):
            findings.append(
                Finding(
                    id="hardware.memory_repair_pending",
                    category=Category.HARDWARE_FAULT,
                    severity=Severity.WARNING,
                    title=f"GPU {index} has bad memory waiting for a reset to be repaired",
                    evidence={
                        "remapped_rows_pending": any(g.remapped_rows.pending for g in series),
                        "retired_pages_pending": any(g.retired_pages_pending for g in series),
                    },
                    fix="Reset the GPU when no job runs on it (nvidia-smi -r, or reboot) so "
                    "the repair takes effect; drain it if errors repeat.",
                    subject=subject,
                )
            )
    findings += _unreachable(view)
    findings += _xid_findings(view.record.events, view.record.gpu)
    return findings


def _unreachable(view: RunView) -> list[Finding]:
    """GPUs that stopped answering: an error on the job's GPUs, a warning on others."""
    out = []
    for index in sorted({g.index for g in view.record.gpu}):
        series = view.gpu_series(index, steady_only=False)
        lost = next((g for g in series if g.unreachable is not None), None)
        if lost is None:
            continue
        known = next((g for g in reversed(series) if g.unreachable is None), None)
        if known is not None:  # name it as it was last seen
            lost = GpuSample(
                timestamp=lost.timestamp,
                index=index,
                name=known.name,
                uuid=lost.uuid or known.uuid,
                pci_bus_id=lost.pci_bus_id or known.pci_bus_id,
                unreachable=lost.unreachable,
            )
        job = index in view.job_gpu_indices or not view.job_gpu_indices
        out.append(
            unreachable_finding(lost, Severity.ERROR if job else Severity.WARNING, "during the run")
        )
    return out


def _xid_findings(events: list[RunEvent], gpus: list[GpuSample]) -> list[Finding]:
    found: list[faults.XidEvent] = []
    indices: list[int | None] = []
    for e in events:
        if e.kind == EventKind.XID and (x := _xid_event(e)) is not None:
            found.append(x)
            indices.append(faults.xid_report_gpu(e.data))
    groups = group_xids(found, gpus, indices)
    return [xid_finding(group, "during the run") for group in groups]


def _xid_event(e: RunEvent) -> faults.XidEvent | None:
    """The event as a parsed Xid: from its kernel line, else from its data."""
    return faults.xid_from_report(e.message, e.data)

