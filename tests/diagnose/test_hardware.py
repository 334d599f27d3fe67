"""Hardware faults during the run: ECC, row remapping, Xid events."""

from __future__ import annotations

from support.builders import T0, during, make_event, make_gpu_series, make_record, make_steps
from trainmedic.diagnose.hardware import hardware_faults
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import EccCounts, GpuSample, RemappedRows
from trainmedic.record.types import RunEvent

TH = Thresholds()


def faults(series: list[GpuSample], events: list[RunEvent] | None = None) -> list[Finding]:
    record = make_record(make_steps(100), gpu=series, events=events or [])
    return hardware_faults(RunView.of(record), TH)


def test_uncorrected_ecc_errors_growing_during_the_run() -> None:
    series = make_gpu_series(10, ecc=EccCounts(volatile_uncorrected=2))
    series = during(series, T0 + 6.0, T0 + 10.0, ecc=EccCounts(volatile_uncorrected=5))
    (f,) = faults(series)
    assert f.id == "hardware.ecc_uncorrected" and f.severity is Severity.ERROR
    assert f.category is Category.HARDWARE_FAULT and f.subject == "gpu0"
    assert f.evidence["ecc_uncorrected_added"] == 3
    assert "Drain" in f.fix


def test_old_ecc_errors_that_do_not_grow_are_doctors_business() -> None:
    assert faults(make_gpu_series(10, ecc=EccCounts(volatile_uncorrected=4))) == []


def test_row_remap_failure_and_pending() -> None:
    failed = during(
        make_gpu_series(10), T0 + 5, T0 + 10, remapped_rows=RemappedRows(pending=True, failure=True)
    )
    assert [(f.id, f.severity) for f in faults(failed)] == [
        ("hardware.row_remap_failure", Severity.ERROR)
    ]
    pending = during(make_gpu_series(10), T0 + 5, T0 + 10, remapped_rows=RemappedRows(pending=True))
    (f,) = faults(pending)
    assert f.id == "hardware.memory_repair_pending" and f.severity is Severity.WARNING
    (g,) = faults(make_gpu_series(10, retired_pages_pending=True))
    assert g.id == "hardware.memory_repair_pending"


def test_xid_events_by_code() -> None:
    events = [
        make_event("xid", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", gpu=0),
        make_event("xid", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", gpu=0),
        make_event("xid", "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception", gpu=0),
        make_event("xid", "Xid 999 from the future"),
    ]
    found = {f.id: f for f in faults(make_gpu_series(10), events)}
    assert set(found) == {"hardware.xid.79", "hardware.xid.13", "hardware.xid.999"}
    assert found["hardware.xid.79"].severity is Severity.ERROR
    assert found["hardware.xid.79"].evidence["events"] == 2
    assert found["hardware.xid.79"].subject == "gpu0"
    assert found["hardware.xid.13"].severity is Severity.WARNING
    assert "compute-sanitizer" in found["hardware.xid.13"].fix
    assert found["hardware.xid.999"].subject is None


def test_healthy_gpu_has_no_faults() -> None:
    assert faults(make_gpu_series(10, ecc=EccCounts(0, 0, 0, 0))) == []
