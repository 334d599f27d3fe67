"""Failing GPU hardware seen during the run (``hardware_fault``).

Counters judged by their change during the run (what existed before is
doctor's business): volatile uncorrected ECC errors, row-remapping state,
pending page retirement; and Xid events the supervisor recorded (kind ``xid``,
``data["xid"]`` the code, ``data["gpu"]`` the index when known).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.types import RunEvent

#: Xid codes that mean failing hardware (NVIDIA's Xid catalogue): the GPU should be drained.
XID_HARDWARE = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    140: "unrecovered ECC error",
}
#: Xid codes usually caused by the application (bad address, killed context).
XID_APPLICATION = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    63: "ECC page retirement or row remapping event",
    94: "contained ECC error",
}

_DRAIN = (
    "Drain the GPU: move the job to another GPU or node (CUDA_VISIBLE_DEVICES / the "
    "scheduler's exclude list), reset it (nvidia-smi -r) when idle, and report it to the "
    "provider if it repeats."
)
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..." or "Xid 79"
_XID_IN_TEXT = re.compile(r"\bxid\b(?:\s*\([^)]*\))?\s*:?\s*(\d+)", re.IGNORECASE)


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
    findings += _xid_findings(view.record.events)
    return findings


def _xid_findings(events: list[RunEvent]) -> list[Finding]:
    groups: dict[tuple[int | None, int | None], list[RunEvent]] = {}
    for e in events:
        if e.kind != "xid":
            continue
        groups.setdefault((_int(e.data, "gpu", "index"), _xid_code(e)), []).append(e)
    findings = []
    for (gpu, code), evs in sorted(groups.items(), key=lambda kv: (kv[0][0] or -1, kv[0][1] or -1)):
        where = f"GPU {gpu}" if gpu is not None else "a GPU"
        if code in XID_HARDWARE:
            severity, meaning, fix = Severity.ERROR, XID_HARDWARE[code], _DRAIN
        elif code in XID_APPLICATION:
            severity, meaning = Severity.WARNING, XID_APPLICATION[code]
            fix = (
                "Usually the application: run once with CUDA_LAUNCH_BLOCKING=1 and "
                "compute-sanitizer to find the faulting kernel; drain the GPU if it repeats "
                "with code known to be good."
            )
        else:
            severity, meaning = Severity.WARNING, "see NVIDIA's Xid catalogue"
            fix = "Look the code up in NVIDIA's Xid catalogue; drain the GPU if it repeats."
        ev: dict[str, Any] = {"xid": code, "events": len(evs), "first_message": evs[0].message}
        findings.append(
            Finding(
                id=f"hardware.xid.{code if code is not None else 'unknown'}",
                category=Category.HARDWARE_FAULT,
                severity=severity,
                title=f"Xid {code if code is not None else '?'} on {where}: {meaning}",
                evidence=ev,
                fix=fix,
                subject=f"gpu{gpu}" if gpu is not None else None,
            )
        )
    return findings


def _xid_code(e: RunEvent) -> int | None:
    code = _int(e.data, "xid", "code")
    if code is None:
        m = _XID_IN_TEXT.search(e.message)
        if m:
            code = int(m.group(1))
    return code


def _int(data: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = data.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, str) and v.isdigit():
            return int(v)
    return None
