"""Failing GPU hardware: memory errors, degraded PCIe links, lost GPUs, Xids since boot.

docs/doctor-checks.md, "hardware_fault", explains each threshold.
"""

from __future__ import annotations

from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.gpu_faults import group_xids, unreachable_finding, xid_finding
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample

# The driver raises the link generation only when the GPU works hard (P0);
# an idle GPU drops to Gen1 to save power, so generation is judged under load.
LOADED_UTILIZATION_PCT = 50.0


def _memory_evidence(s: GpuSample) -> dict[str, Any]:
    return {
        "ecc_volatile_uncorrected": s.ecc.volatile_uncorrected,
        "ecc_volatile_corrected": s.ecc.volatile_corrected,
        "ecc_aggregate_uncorrected": s.ecc.aggregate_uncorrected,
        "ecc_aggregate_corrected": s.ecc.aggregate_corrected,
        "retired_pages_pending": s.retired_pages_pending,
        "remapped_rows_correctable": s.remapped_rows.correctable,
        "remapped_rows_uncorrectable": s.remapped_rows.uncorrectable,
        "remapped_rows_pending": s.remapped_rows.pending,
        "remapped_rows_failure": s.remapped_rows.failure,
    }


def _finding(
    s: GpuSample, id: str, severity: Severity, title: str, evidence: dict[str, Any], fix: str
) -> Finding:
    return Finding(
        id=id,
        category=Category.HARDWARE_FAULT,
        severity=severity,
        title=title,
        evidence=evidence,
        fix=fix,
        impact=None,
        subject=f"gpu{s.index}",
    )


def _reset_fix(s: GpuSample) -> str:
    return (
        f"Stop the jobs on GPU {s.index}, then reset it (sudo nvidia-smi -r -i {s.index}) or "
        "reboot the machine; until then, keep work off it "
        f"(CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=<the other GPUs>)."
    )


def check_memory_errors(facts: MachineFacts) -> list[Finding]:
    """ECC errors, page retirement and row remapping, one finding per condition."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        ev = _memory_evidence(s)
        volatile = s.ecc.volatile_uncorrected or 0
        if volatile > 0:
            out.append(
                _finding(
                    s,
                    "hardware.ecc.volatile_uncorrectable",
                    Severity.ERROR,
                    f"GPU {s.index} had {volatile} uncorrectable ECC memory error(s) since "
                    "the driver loaded; CUDA work on it crashes or computes on corrupt data",
                    ev,
                    _reset_fix(s)
                    + " If uncorrectable errors come back after the reset, drain the node "
                    "and have the GPU replaced (RMA).",
                )
            )
        aggregate = s.ecc.aggregate_uncorrected or 0
        if aggregate > 0 and volatile == 0:
            out.append(
                _finding(
                    s,
                    "hardware.ecc.aggregate_uncorrectable",
                    Severity.INFO,
                    f"GPU {s.index} has had {aggregate} uncorrectable ECC error(s) over its "
                    "lifetime, none since the driver loaded",
                    ev,
                    "Nothing to do now: the affected memory was retired or remapped. If the "
                    "lifetime count keeps growing, plan to have the GPU replaced.",
                )
            )
        if s.retired_pages_pending:
            out.append(
                _finding(
                    s,
                    "hardware.retired_pages_pending",
                    Severity.WARNING,
                    f"GPU {s.index} has memory pages waiting to be retired; they stay in use "
                    "until the GPU is reset",
                    ev,
                    _reset_fix(s),
                )
            )
        if s.remapped_rows.failure:
            out.append(
                _finding(
                    s,
                    "hardware.remapped_rows_failed",
                    Severity.ERROR,
                    f"GPU {s.index} failed to remap a faulty memory row: it has no spare "
                    "rows left for its failing memory",
                    ev,
                    f"Drain this GPU (or the node) and have it replaced (RMA); "
                    f"nvidia-smi -q -d ROW_REMAPPER -i {s.index} shows the state to report.",
                )
            )
        if s.remapped_rows.pending:
            out.append(
                _finding(
                    s,
                    "hardware.remapped_rows_pending",
                    Severity.WARNING,
                    f"GPU {s.index} has a memory row remapping pending; it takes effect "
                    "only after a GPU reset",
                    ev,
                    _reset_fix(s),
                )
            )
    return out


def _pcie_evidence(s: GpuSample) -> dict[str, Any]:
    p = s.pcie
    return {
        "pcie_gen_current": p.gen_current,
        "pcie_gen_max": p.gen_max,
        "pcie_gen_gpu_max": p.gen_gpu_max,
        "pcie_width_current_lanes": p.width_current,
        "pcie_width_max_lanes": p.width_max,
        "utilization_gpu_pct": s.utilization_gpu_pct,
    }


_RESEAT_FIX = (
    "Power the machine down and reseat the GPU (and its riser cable, if any); check the "
    "slot is wired for the full width and the BIOS does not force a lower PCIe speed; "
    "lspci -vv shows LnkSta against LnkCap. On a rented machine, report the node."
)


def check_pcie_link(facts: MachineFacts) -> list[Finding]:
    """A PCIe link running narrower or slower than the GPU and slot allow."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        p = s.pcie
        ev = _pcie_evidence(s)
        if (
            p.width_current is not None
            and p.width_max is not None
            and p.width_current < p.width_max
        ):
            out.append(
                _finding(
                    s,
                    "hardware.pcie.width_degraded",
                    Severity.WARNING,
                    f"GPU {s.index}'s PCIe link runs at x{p.width_current} of "
                    f"x{p.width_max} lanes: host-GPU copies get "
                    f"{p.width_current / p.width_max:.0%} of the bandwidth",
                    ev,
                    _RESEAT_FIX,
                )
            )
        loaded = (
            s.utilization_gpu_pct is not None and s.utilization_gpu_pct >= LOADED_UTILIZATION_PCT
        )
        if (
            loaded
            and p.gen_current is not None
            and p.gen_max is not None
            and p.gen_current < p.gen_max
        ):
            out.append(
                _finding(
                    s,
                    "hardware.pcie.gen_degraded",
                    Severity.WARNING,
                    f"GPU {s.index}'s PCIe link runs at Gen{p.gen_current} under load "
                    f"although Gen{p.gen_max} is possible",
                    ev,
                    _RESEAT_FIX,
                )
            )
        if p.gen_max is not None and p.gen_gpu_max is not None and p.gen_max < p.gen_gpu_max:
            out.append(
                _finding(
                    s,
                    "hardware.pcie.slot_below_gpu_max",
                    Severity.WARNING,
                    f"GPU {s.index} supports PCIe Gen{p.gen_gpu_max} but its slot allows "
                    f"only Gen{p.gen_max}",
                    ev,
                    "Move the GPU to a slot (or host) that supports "
                    f"Gen{p.gen_gpu_max}, or check that the BIOS PCIe speed setting is not "
                    "forced lower (often done for unreliable risers).",
                )
            )
    return out


def check_unreachable(facts: MachineFacts) -> list[Finding]:
    """A GPU the driver lists but cannot reach (fallen off the bus, lost, needs a reset)."""
    return [
        unreachable_finding(s, Severity.ERROR, "when doctor read it")
        for s in facts.gpu.samples
        if s.unreachable is not None
    ]


def check_xids(facts: MachineFacts) -> list[Finding]:
    """Xids the driver logged since boot, judged by NVIDIA's catalogue."""
    lines = facts.gpu.kernel_log or ()
    events = [e for line in lines if (e := faults.parse_xid_line(line)) is not None]
    return [xid_finding(g, "since boot") for g in group_xids(events, facts.gpu.samples)]


CHECKS = (check_memory_errors, check_pcie_link, check_unreachable, check_xids)
