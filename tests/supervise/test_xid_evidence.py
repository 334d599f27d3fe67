"""Xids NVML reported reach the failure classifier where the kernel log is unreadable."""

from __future__ import annotations

from trainmedic.gpu.faults import xid_from_report
from trainmedic.record.types import RunEvent
from trainmedic.resilience.classify import FailureEvidence, classify_failure
from trainmedic.supervise.hang.watchdog import Watchdog
from trainmedic.supervise.observe.processes import ProcessTable

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


def test_an_xid_event_is_read_back_as_data() -> None:
    nvml = xid_from_report(NVML_79.message, NVML_79.data)
    assert nvml is not None and nvml.code == 79
    assert nvml.pci_bus_id is not None and nvml.pci_bus_id.endswith("3b:00.0")
    kernel = xid_from_report(KERNEL_13.message, KERNEL_13.data)
    assert kernel is not None and (kernel.code, kernel.pid, kernel.process) == (13, 42, "python")
    assert kernel.line == KERNEL_13.message  # the driver's own line as it is
    mig = xid_from_report("x", {"xid": 48, "gpu": 0, "gpu_instance": 5})
    assert mig is not None and (mig.code, mig.gpu_instance) == (48, 5)
    assert xid_from_report("Xid 79 seen", {}) is not None
    assert xid_from_report("nothing", {"gpu": 1}) is None


def test_the_watchdog_keeps_xids_across_attempts_and_gives_those_since_a_time() -> None:
    dog = Watchdog(ProcessTable(), lambda: [])
    dog.add_event(NVML_79)  # no attempt running: an Xid may arrive after its attempt ended
    dog.add_event(KERNEL_13)
    assert [x.code for x in dog.xid_events(since_wall=101.5)] == [13]
    assert [x.code for x in dog.xid_events(since_wall=0.0)] == [79, 13]


def test_an_nvml_xid_makes_a_crash_a_hardware_fault_without_the_kernel_log() -> None:
    dog = Watchdog(ProcessTable(), lambda: [])
    dog.add_event(NVML_79)
    crash = "RuntimeError: CUDA error: unspecified launch failure"
    xids = dog.xid_events(since_wall=0.0)
    with_xid = classify_failure(FailureEvidence(exit_code=1, stderr_tail=crash, xids=xids))
    without = classify_failure(FailureEvidence(exit_code=1, stderr_tail=crash))
    assert with_xid.category.value == "hardware_fault"
    assert with_xid.details["xid"] == 79
    assert without.category.value != "hardware_fault"


def test_an_application_xid_reported_as_data_is_not_a_hardware_fault() -> None:
    """Xid 13 (an out-of-range access in a kernel) is the program's, not the GPU's."""
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    xid = xid_from_report(KERNEL_13.message, KERNEL_13.data)
    assert xid is not None
    judged = classify_failure(FailureEvidence(exit_code=1, stderr_tail=crash, xids=(xid,)))
    assert judged.category.value != "hardware_fault"
