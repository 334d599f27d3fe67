"""One truth about GPU faults: doctor, the run diagnosis and the failure classifier
agree on every Xid code and every clock event reason, and the Xid table agrees
with NVIDIA's published catalogue (``tests/gpu/data/xid_catalogue.csv``)."""

from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from support.builders import T0, make_event, make_gpu, make_gpu_series, make_record, make_steps
from trainmedic.diagnose.hardware import hardware_faults
from trainmedic.diagnose.memory import memory_pressure
from trainmedic.diagnose.thermal import throttling
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.doctor.checks.hardware import check_xids
from trainmedic.doctor.checks.thermal import check_clock_events
from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import ClockEventReason, GpuSample
from trainmedic.resilience.classify import FailureClass, FailureEvidence, classify_failure

CATALOGUE = Path(__file__).resolve().parents[1] / "gpu" / "data" / "xid_catalogue.csv"
BUS = "0000:3b:00.0"
CODES = [*range(1, faults.XID_CATALOGUE_LAST + 1), 173, 200]  # and two the catalogue lacks
STATED_154 = {
    "0x0 (None)": faults.XidAction.IGNORE,
    "0x1 (GPU Reset Required)": faults.XidAction.RESET_GPU,
    "0x2 (Node Reboot Required)": faults.XidAction.DRAIN_NODE,
    "0x3 (Drain P2P)": faults.XidAction.RESET_GPU,
    "0x4 (Drain and Reset)": faults.XidAction.RESET_GPU,
    # NVML 595 and 615 (nvidia-ml-py's NVML_GPU_RECOVERY_ACTION_*); the texts in
    # parentheses are ours, only the number is read.
    "0x5 (Recover IMEX Domain)": faults.XidAction.DRAIN_NODE,
    "0x6 (Bus Reset)": faults.XidAction.RESET_GPU,
    "0x7 (System Reboot)": faults.XidAction.DRAIN_NODE,
    "0x9 (a value NVML does not define yet)": faults.XidAction.RESET_GPU,
}


def catalogue() -> list[dict[str, str]]:
    with CATALOGUE.open(encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def xid_line(code: int, detail: str = "pid=4242, name=python3, test") -> str:
    return f"[ 1234.5] NVRM: Xid (PCI:0000:3b:00): {code}, {detail}"


def doctor_finding(line: str) -> Finding:
    gpu = GpuSample(0.0, 0, "NVIDIA H100", "GPU-0000", pci_bus_id=BUS)
    facts = MachineFacts(
        host=None,  # type: ignore[arg-type]  # the GPU checks never read the host
        gpu=GpuFacts(backend="nvml", driver=None, samples=(gpu,), kernel_log=(line,)),
        torch=None,
    )
    (finding,) = check_xids(facts)
    return finding


def run_finding(line: str) -> Finding:
    gpus = make_gpu_series(5, pci_bus_id=BUS)
    record = make_record(make_steps(50), gpu=gpus, events=[make_event("xid", line)])
    (finding,) = [f for f in hardware_faults(RunView.of(record), Thresholds()) if "xid" in f.id]
    return finding


def classify(line: str, **kw: Any) -> Any:
    gpu = GpuSample(0.0, 0, "NVIDIA H100", "GPU-0000", pci_bus_id=BUS)
    return classify_failure(
        FailureEvidence.from_stderr_text(
            kw.pop("exit_code", 1),
            "RuntimeError: CUDA error: unspecified launch failure",
            kernel_log=(line,),
            gpus=(gpu,),
            **kw,
        )
    )


# ------------------------------------------------------------------------------- Xids


def test_the_xid_table_is_nvidias_catalogue() -> None:
    rows = catalogue()
    assert [int(r["code"]) for r in rows] == list(range(1, faults.XID_CATALOGUE_LAST + 1))
    no_action = set()
    for row in rows:
        code, bucket = int(row["code"]), row["immediate_action"]
        if not bucket:  # listed without an immediate action
            no_action.add(code)
            bucket = faults.INFERRED_BUCKET.get(code, faults.NO_ACTION_LISTED)
        assert faults.XID_BUCKET[code] == bucket, code
        if bucket != "XID_154":
            assert faults.xid_verdict(code).action is faults.BUCKET_ACTION[bucket], code
    # Only codes the catalogue leaves without an action are judged by their description.
    assert set(faults.INFERRED_BUCKET) <= no_action
    assert set(faults.XID_BUCKET) == set(range(1, faults.XID_CATALOGUE_LAST + 1))


def test_the_catalogue_edition_is_named() -> None:
    assert "analyzing-xid-catalog" in faults.XID_CATALOGUE_VERSION
    assert "1-172" in faults.XID_CATALOGUE_VERSION
    with CATALOGUE.open(encoding="utf-8") as f:
        assert "XID_CATALOGUE_VERSION" in f.read()


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (108, "NVLink remote translation error"),
        (167, "PCIe fatal timeout"),
        (169, "internal micro-controller halt (SEC2)"),
        (171, "uncorrectable DRAM error (detail of an Xid 48)"),
        (172, "uncorrectable SRAM error (detail of an Xid 48)"),
    ],
)
def test_new_codes_have_their_meanings(code: int, meaning: str) -> None:
    assert faults.xid_verdict(code).meaning == meaning


@pytest.mark.parametrize(
    ("code", "action", "hardware"),
    [
        (94, faults.XidAction.RESTART_APP, False),  # contained ECC error: restart, no reset
        (63, faults.XidAction.IGNORE, False),  # row remap recorded
        (92, faults.XidAction.IGNORE, False),  # excessive single-bit ECC
        (121, faults.XidAction.IGNORE, False),  # C2C link error (GB200), corrected
        (46, faults.XidAction.RESET_GPU, True),
        (109, faults.XidAction.RESET_GPU, True),
        (48, faults.XidAction.RESET_GPU, True),  # double-bit ECC: the Xid 48 workflow
        (95, faults.XidAction.RESET_GPU, True),
        (79, faults.XidAction.DRAIN_NODE, True),  # fallen off the bus: restart bare metal
        (13, faults.XidAction.RESTART_APP, False),
        (31, faults.XidAction.RESTART_APP, False),
        (108, faults.XidAction.IGNORE, False),  # NVLink remote translation error
        (160, faults.XidAction.IGNORE, False),  # channel retirement event
        # H100/H200 codes the catalogue lists with no action, judged by their description:
        (167, faults.XidAction.RESET_GPU, True),  # PCIe fatal timeout, like 158
        (169, faults.XidAction.RESET_GPU, True),  # SEC2 halt, like 62 (PMU halt)
        (171, faults.XidAction.RESET_GPU, True),  # uncorrectable DRAM: the Xid 48 workflow
        (172, faults.XidAction.RESET_GPU, True),  # uncorrectable SRAM: the Xid 48 workflow
        (162, faults.XidAction.UNKNOWN, False),  # power smoothing re-engaged: no action listed
        (173, faults.XidAction.UNKNOWN, False),  # beyond the catalogue
        (200, faults.XidAction.UNKNOWN, False),
    ],
)
def test_named_codes(code: int, action: faults.XidAction, hardware: bool) -> None:
    verdict = faults.xid_verdict(code)
    assert (verdict.action, verdict.hardware) == (action, hardware)


@pytest.mark.parametrize(("stated", "action"), sorted(STATED_154.items()))
def test_xid_154_takes_the_drivers_stated_action(stated: str, action: faults.XidAction) -> None:
    detail = f"GPU recovery action changed from 0x0 (None) to {stated}"
    assert faults.xid_verdict(154, detail).action is action


@pytest.mark.parametrize("code", CODES)
def test_doctor_diagnosis_and_classifier_agree_on_every_xid(code: int) -> None:
    line = xid_line(code)
    verdict = faults.xid_verdict(code)
    doc, run = doctor_finding(line), run_finding(line)
    assert doc.id == run.id == f"hardware.xid.{code}"
    assert doc.severity == run.severity == Severity(verdict.level)
    assert doc.category is run.category is Category.HARDWARE_FAULT
    assert doc.subject == run.subject == "gpu0"
    assert doc.fix == run.fix
    assert doc.evidence["catalogue_action"] == run.evidence["catalogue_action"]
    c = classify(line)
    explains = verdict.hardware or code in faults.HARDWARE_RESTART_CODES
    assert (c.category is Category.HARDWARE_FAULT) is explains, code
    if explains:
        assert c.failure_class is FailureClass.CUDA_ERROR
        assert c.details["xid"] == code
        assert c.details["xid_action"] == verdict.action.value
        assert c.details["hardware"] is verdict.hardware
        assert str(c.gpu) == "gpu0"
    # Only an Xid that needs the GPU reset or drained turns a hang into a hardware fault.
    hang = classify(line, exit_code=-9, hang_declared=True)
    assert (hang.failure_class is FailureClass.HANG) is (not explains)


def test_a_mig_line_is_judged_like_the_plain_one() -> None:
    mig = "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 95, pid=2451, name=python3, Uncontained"
    assert doctor_finding(mig).evidence["mig_gpu_instances"] == [5]
    assert doctor_finding(mig).severity is run_finding(mig).severity is Severity.ERROR
    assert classify(mig).details["mig_gpu_instance"] == 5


# ------------------------------------------------------------------------ clock reasons

ALL_BITS = [flag for flag in ClockEventReason if flag is not ClockEventReason.NONE]


def masks() -> list[int]:
    """Every single reason and pair of reasons, and a fixed random sample of larger sets."""
    out = {int(a | b) for a, b in itertools.combinations_with_replacement(ALL_BITS, 2)}
    rng = random.Random(7)
    out |= {rng.randrange(1, 1 << len(ALL_BITS)) for _ in range(60)}
    return sorted(out)


LOADS = {
    "busy, clock held low": {"utilization_gpu_pct": 97.0, "sm_clock_mhz": 1000.0},
    "busy, near full clock": {"utilization_gpu_pct": 97.0, "sm_clock_mhz": 1900.0},
    "light load": {"utilization_gpu_pct": 20.0, "sm_clock_mhz": 1000.0},
}


@pytest.mark.parametrize("load", sorted(LOADS))
def test_doctor_and_diagnosis_agree_on_every_clock_reason(load: str) -> None:
    for mask in masks():
        fields = dict(LOADS[load], clock_event_reasons=mask, sm_clock_max_mhz=1980.0)
        sample = make_gpu(T0, **fields)
        facts = MachineFacts(
            host=None,  # type: ignore[arg-type]
            gpu=GpuFacts(backend="nvml", driver=None, samples=(sample,)),
            torch=None,
        )
        doc = check_clock_events(facts)
        # The same reading held for the whole run: the run's time share is 100 %.
        record = make_record(make_steps(100), gpu=make_gpu_series(12, **fields))
        run = [f for f in throttling(RunView.of(record), Thresholds()) if "throttle" in f.id]
        rule = faults.leading_rule(faults.active_reasons(sample))
        if rule is None:
            assert doc == [] and run == [], (load, hex(mask))
            continue
        (d,), (r,) = doc, run
        assert d.id == f"thermal.clock_event.{rule.key}", (load, hex(mask))
        assert r.id == f"thermal.throttle.{rule.key}", (load, hex(mask))
        assert d.severity == r.severity == Severity(rule.level), (load, hex(mask))
        assert d.evidence["active_reasons"] == r.evidence["reasons"], (load, hex(mask))
        assert d.detail == r.detail


# ------------------------------------------------------------------------- out of memory

OOM_MESSAGES = {
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.15 GiB of which 1.38 GiB is free.": True,
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB": True,
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 15.78 GiB total "
    "capacity; 14.21 GiB already allocated; 3.44 MiB free; 14.38 GiB reserved in total by "
    "PyTorch)": True,
    "RuntimeError: CUDA error: out of memory": True,
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(h)`": True,
    "MemoryError": False,
    "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
    "memory: you tried to allocate 1073741824 bytes.": False,
    "ValueError: the model ran out of patience": False,
}


@pytest.mark.parametrize(("message", "oom"), sorted(OOM_MESSAGES.items()))
def test_diagnosis_and_classifier_agree_on_out_of_memory_messages(message: str, oom: bool) -> None:
    record = make_record(make_steps(20), events=[make_event("exception", message)])
    diagnosed = [f.id for f in memory_pressure(RunView.of(record), Thresholds())]
    classified = classify_failure(FailureEvidence.from_stderr_text(1, message))
    assert (diagnosed == ["memory.oom"]) is oom
    assert (classified.failure_class is FailureClass.CUDA_OOM) is oom
