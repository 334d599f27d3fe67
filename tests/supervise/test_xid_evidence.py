"""Xids NVML reported reach the failure classifier where the kernel log is unreadable."""

from __future__ import annotations

from pathlib import Path

from trainmedic.gpu.faults import parse_xid_line
from trainmedic.record.types import RunEvent
from trainmedic.resilience.classify import FailureEvidence, classify_failure
from trainmedic.supervise.evidence import kernel_log_with_xids
from trainmedic.supervise.processes import ProcessTable
from trainmedic.supervise.watchdog import Watchdog
from trainmedic.supervise.xid_watch import xid_line

NVML_79 = RunEvent(
    t=100.0,
    kind="xid",
    message="Xid 79 on GPU 1 (NVML event)",
    data={"xid": 79, "gpu": 1, "pci_bus_id": "00000000:3B:00.0", "source": "nvml"},
)
KERNEL_13 = RunEvent(
    t=101.0,
    kind="xid",
    message="NVRM: Xid (PCI:0000:3b:00): 13, pid=42, name=python, Graphics Exception",
    data={"xid": 13, "source": "kmsg"},
)


def test_an_nvml_event_becomes_a_line_the_kernel_log_parser_reads() -> None:
    event = parse_xid_line(xid_line(NVML_79))
    assert event is not None and event.code == 79
    assert event.pci_bus_id is not None and event.pci_bus_id.endswith("3b:00.0")
    assert xid_line(KERNEL_13) == KERNEL_13.message  # the driver's own line as it is
    mig = RunEvent(t=0.0, kind="xid", message="x", data={"xid": 48, "gpu": 0, "gpu_instance": 5})
    parsed = parse_xid_line(xid_line(mig))
    assert parsed is not None and (parsed.code, parsed.gpu_instance) == (48, 5)


def test_the_watchdog_keeps_xids_across_attempts_and_gives_those_since_a_time() -> None:
    dog = Watchdog(ProcessTable(), lambda: [])
    dog.add_event(NVML_79)  # no attempt running: an Xid may arrive after its attempt ended
    dog.add_event(KERNEL_13)
    assert dog.xid_lines(since_wall=101.5) == (KERNEL_13.message,)
    assert len(dog.xid_lines(since_wall=0.0)) == 2


def test_an_nvml_xid_makes_a_crash_a_hardware_fault_without_the_kernel_log(
    tmp_path: Path,
) -> None:
    unreadable = str(tmp_path / "no-kmsg")
    lines = kernel_log_with_xids(0.0, [xid_line(NVML_79)], kmsg=unreadable)
    assert lines == (xid_line(NVML_79),)
    crash = "RuntimeError: CUDA error: unspecified launch failure"
    with_xid = classify_failure(FailureEvidence(exit_code=1, stderr_tail=crash, kernel_log=lines))
    without = classify_failure(FailureEvidence(exit_code=1, stderr_tail=crash))
    assert with_xid.category.value == "hardware_fault"
    assert with_xid.details["xid"] == 79
    assert without.category.value != "hardware_fault"
