"""The classifier on GPU faults real drivers log: MIG Xid lines, the catalogue's
actions, and torch's CUDA device numbers mapped to NVML's GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainmedic.findings.model import Category
from trainmedic.gpu.types import GpuSample, MigDevice
from trainmedic.resilience.classify import (
    FailureClass,
    FailureEvidence,
    GpuRef,
    classification_to_finding,
    classify_failure,
)
from trainmedic.resilience.remedies import plan_remedies

# NVIDIA's example of an Xid from a MIG GPU instance (docs.nvidia.com, Xid catalogue).
MIG_XID_94 = (
    "[1234567.890123] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=2451, name=python3, "
    "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x2c614"
)
XID_95 = "NVRM: Xid (PCI:0000:01:00): 95, pid=2451, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No"  # noqa: E501
XID_154_REBOOT = (
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
    "(Node Reboot Required)"
)
CRASH = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def gpu(index: int, bus: str, name: str = "NVIDIA H100 80GB HBM3", **kw: object) -> GpuSample:
    return GpuSample(
        timestamp=0.0,
        index=index,
        name=name,
        uuid=f"GPU-{index}{index}{index}{index}-aaaa",
        pci_bus_id=bus,
        **kw,  # type: ignore[arg-type]
    )


MACHINE = (
    gpu(0, "0000:01:00.0"),
    gpu(1, "0000:41:00.0"),
    gpu(2, "0000:81:00.0"),
    gpu(3, "0000:c1:00.0"),
)


def evidence(*kernel: str, stderr: str = CRASH, **kw: object) -> FailureEvidence:
    return FailureEvidence.from_stderr_text(1, stderr, kernel_log=kernel, gpus=MACHINE, **kw)  # type: ignore[arg-type]


def test_a_mig_xid_line_is_a_hardware_fault_on_an_identified_gpu() -> None:
    c = classify_failure(evidence(MIG_XID_94))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.category is Category.HARDWARE_FAULT
    assert c.gpu == GpuRef(index=0, uuid="GPU-0000-aaaa", pci_bus_id="0000:01:00.0")
    assert c.details["xid"] == 94
    assert c.details["mig_gpu_instance"] == 5
    assert c.details["xid_action"] == "restart_app"
    # A contained error: restart, the GPU stays in use (NVIDIA's catalogue).
    assert c.details["hardware"] is False
    assert plan_remedies(c, {}, gpus=[g.ref for g in MACHINE]) == []
    assert "Restart the job" in classification_to_finding(c).fix


def test_an_uncontained_error_leaves_the_gpu_out_of_the_next_attempt() -> None:
    c = classify_failure(evidence(XID_95))
    assert c.details["hardware"] is True and c.details["xid_action"] == "reset_gpu"
    assert str(c.gpu) == "gpu0"
    (remedy,) = plan_remedies(c, {}, gpus=[g.ref for g in MACHINE])
    assert remedy.name == "exclude_gpu"
    assert remedy.set_env["CUDA_VISIBLE_DEVICES"] == "GPU-1111-aaaa,GPU-2222-aaaa,GPU-3333-aaaa"


def test_xid_154_follows_the_drivers_stated_recovery_action() -> None:
    c = classify_failure(evidence(XID_154_REBOOT))
    assert c.details["xid_action"] == "drain_node" and c.details["hardware"] is True
    assert "Drain the node" in classification_to_finding(c).fix


def test_an_xid_on_a_gpu_the_attempt_could_not_see_is_not_its_failure() -> None:
    other = "NVRM: Xid (PCI:0000:c1:00): 79, pid=9, name=python3, GPU has fallen off the bus."
    launch = "RuntimeError: CUDA error: unspecified launch failure"
    c = classify_failure(evidence(other, stderr=launch, visible_devices="0,1"))
    assert c.failure_class is FailureClass.CUDA_ERROR and c.category is not Category.HARDWARE_FAULT
    seen = classify_failure(evidence(other, stderr=launch, visible_devices="2,3"))
    assert seen.category is Category.HARDWARE_FAULT and str(seen.gpu) == "gpu3"


def test_the_most_serious_xid_wins() -> None:
    c = classify_failure(evidence(MIG_XID_94, XID_95))
    assert c.details["xid"] == 95


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:01:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row (0x0000000000000000) Pending",  # noqa: E501
        "NVRM: Xid (PCI:0000:01:00): 92, pid='<unknown>', name=<unknown>, High single-bit ECC error rate",  # noqa: E501
        "NVRM: Xid (PCI:0000:01:00): 43, pid=2451, name=python3, Ch 00000010",
    ],
)
def test_informational_xids_never_turn_a_hang_into_a_hardware_fault(line: str) -> None:
    hang = FailureEvidence(exit_code=-9, hang_declared=True, kernel_log=(line,), gpus=MACHINE)
    assert classify_failure(hang).failure_class is FailureClass.HANG


def test_oom_gpu_number_is_mapped_through_cuda_visible_devices() -> None:
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
        "total capacity of 79.15 GiB of which 1.38 GiB is free."
    )
    c = classify_failure(evidence(stderr=oom, visible_devices="2,3"))
    assert c.failure_class is FailureClass.CUDA_OOM
    assert c.details["cuda_device"] == 1 and c.details["gpu_index"] == 3
    assert c.gpu == MACHINE[3].ref
    assert "on GPU 3 (CUDA device 1)" in c.why
    by_uuid = classify_failure(evidence(stderr=oom, visible_devices="GPU-2222,GPU-0000"))
    assert by_uuid.details["gpu_index"] == 0


def test_oom_gpu_number_is_not_guessed_when_cuda_orders_by_speed() -> None:
    mixed = (*MACHINE[:2], replace(MACHINE[2], name="NVIDIA A100-SXM4-80GB"))
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.38 GiB is free."  # noqa: E501
    ev = FailureEvidence.from_stderr_text(1, oom, gpus=mixed)
    assert classify_failure(ev).gpu is None
    ordered = FailureEvidence.from_stderr_text(1, oom, gpus=mixed, device_order="PCI_BUS_ID")
    assert classify_failure(ordered).details["gpu_index"] == 1


def test_oom_on_a_mig_instance_names_its_gpu() -> None:
    mig = replace(
        MACHINE[1],
        mig_mode=True,
        mig_devices=(MigDevice(uuid="MIG-5a5a5a5a-0000", gpu_instance_id=5),),
    )
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 9.50 GiB of which 1.38 GiB is free."  # noqa: E501
    ev = FailureEvidence.from_stderr_text(
        1, oom, gpus=(MACHINE[0], mig), visible_devices="MIG-5a5a5a5a-0000"
    )
    assert classify_failure(ev).details["gpu_index"] == 1


LAUNCH_FAILURE = "RuntimeError: CUDA error: unspecified launch failure"
# Xid 48 with its newer detail (Xid 172, the driver's GSP-RISCV message) on an H100.
XID_48 = "NVRM: Xid (PCI:0000:41:00): 48, pid=2451, name=python3, An uncorrectable ECC error has been detected on GPU in GSP-RISCV"  # noqa: E501
XID_172 = "NVRM: Xid (PCI:0000:41:00): 172, pid='<unknown>', name=<unknown>, GSP-RISCV, Uncorrectable SRAM error"  # noqa: E501


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:41:00): 167, pid='<unknown>', name=<unknown>, PCIE_FATAL_TIMEOUT",
        "NVRM: Xid (PCI:0000:41:00): 169, pid='<unknown>', name=<unknown>, SEC2 halted",
        "NVRM: Xid (PCI:0000:41:00): 171, pid=2451, name=python3, Uncorrectable DRAM error",
        XID_172,
    ],
)
def test_the_h100_codes_past_162_are_hardware_faults(line: str) -> None:
    c = classify_failure(evidence(line, stderr=LAUNCH_FAILURE))
    assert c.category is Category.HARDWARE_FAULT
    assert c.details["xid_action"] == "reset_gpu" and c.details["hardware"] is True
    assert str(c.gpu) == "gpu1"
    (remedy,) = plan_remedies(c, {}, gpus=[g.ref for g in MACHINE])
    assert remedy.name == "exclude_gpu"


def test_xid_154_asking_for_a_system_reboot_drains_the_node() -> None:
    reboot = (
        "NVRM: Xid (PCI:0000:41:00): 154, GPU recovery action changed from 0x0 (None) to 0x7 "
        "(System Reboot Required)"
    )
    c = classify_failure(evidence(XID_48, XID_172, reboot))
    # The driver's own action (a reboot) outranks the GPU reset the Xid 48 workflow asks for.
    assert c.details["xid"] == 154 and c.details["xid_action"] == "drain_node"
    assert "Drain the node" in classification_to_finding(c).fix


def test_a_channel_retirement_event_does_not_explain_a_crash() -> None:
    line = "NVRM: Xid (PCI:0000:41:00): 160, pid=2451, name=python3, Channel retirement event"
    c = classify_failure(evidence(line, stderr=LAUNCH_FAILURE))
    assert c.category is not Category.HARDWARE_FAULT and "xid" not in c.details
