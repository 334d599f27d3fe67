"""A classification as a finding: title, evidence with units and the fix for its class."""

from __future__ import annotations

from typing import Any

from trainmedic.findings.fixes import SHM_FIX_WITH_WORKERS
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.resilience.classify.catalogue import CLASSES
from trainmedic.resilience.classify.model import Classification, FailureClass

FIXES: dict[FailureClass, str] = {fc: info.fix for fc, info in CLASSES.items()}
TITLES: dict[FailureClass, str] = {fc: info.title for fc, info in CLASSES.items()}


_LEAVE_OUT = (
    " trainmedic leaves it out of CUDA_VISIBLE_DEVICES on the next attempt when it knows "
    "which GPU it is."
)


_NOT_HERE = (
    " trainmedic does not restart it on this machine: every attempt here would fail the same way."
)


TENSORFLOW_FIXES: dict[FailureClass, str] = {
    FailureClass.CUDA_OOM: (
        "Lower the batch size (trainmedic sets TRAINMEDIC_MICRO_BATCH_DIVISOR on a restart; "
        "read it with trainmedic.micro_batch_plan(batch_size)) or use the mixed_float16 "
        "policy (keras.mixed_precision.set_global_policy('mixed_float16')). TensorFlow "
        "takes all of a GPU's memory at start by default: where other processes share the "
        "GPU, set TF_FORCE_GPU_ALLOW_GROWTH=true (or "
        "tf.config.experimental.set_memory_growth) so that each takes what it uses."
    ),
    FailureClass.HOST_ALLOC_FAILURE: (
        "Host memory ran short: keep tf.data's buffers small (shuffle(buffer_size), "
        "prefetch(tf.data.AUTOTUNE) rather than a large fixed count), cache to a file "
        "(dataset.cache(filename)) rather than to memory, or run where more memory is "
        "available."
    ),
}
"""Fixes for TensorFlow's (and XLA's) failures where they differ from torch's."""


def _fix(c: Classification) -> str:
    d = c.details
    if d.get("framework") in ("tensorflow", "xla") and c.failure_class in TENSORFLOW_FIXES:
        return TENSORFLOW_FIXES[c.failure_class]
    if c.failure_class is FailureClass.HANG and d.get("source"):
        return (
            f"The job waited on {d['source']} and nothing arrived: check that the data "
            "store or filesystem is reachable and answering (a restart cannot fix it; "
            "trainmedic backs off before the next attempt). Set timeouts on remote reads "
            "so a stalled source raises an error instead of hanging."
        )
    if c.failure_class is FailureClass.DATALOADER_WORKER_DIED:
        cause = d.get("cause")
        if cause == "shm":
            return SHM_FIX_WITH_WORKERS
        if cause == "fd_limit":
            return (
                "Call torch.multiprocessing.set_sharing_strategy('file_system') before creating "
                "the DataLoader, or raise the open-file limit (ulimit -n 65536)."
            )
        if cause == "killed":
            return FIXES[FailureClass.HOST_OOM_KILL]
    if c.failure_class is FailureClass.CUDA_ERROR:
        if d.get("cause") == "fabric_manager":
            return faults.FABRIC_MANAGER_FIX + _NOT_HERE
        xid = d.get("xid")
        if isinstance(xid, int) and c.category is Category.HARDWARE_FAULT:
            fix = faults.xid_verdict(xid, str(d.get("xid_detail", ""))).fix
            if d.get("hardware"):
                fix += _LEAVE_OUT
            return fix
        if d.get("hardware"):
            gpu = c.gpu or "the GPU"
            return (
                f"Drain {gpu}: check nvidia-smi -q -d ECC,ROW_REMAPPER, reset it "
                "(nvidia-smi -r) or have it replaced;" + _LEAVE_OUT
            )
        if c.category is Category.DRIVER:
            return (
                "Install a torch build compiled for this GPU and supported by the driver "
                "(trainmedic doctor shows both)."
            )
        if c.category is Category.CONTENTION:
            return (
                "Another process holds the GPU in exclusive-process mode: find it with "
                "nvidia-smi and stop it, or pick another GPU."
            )
    return FIXES[c.failure_class]


def classification_to_finding(
    c: Classification, *, attempt: int | None = None, action: str | None = None
) -> Finding:
    """The classification as a finding: evidence with units and a concrete fix.

    Args:
        attempt: 1-based attempt number the classification belongs to.
        action: what the restart policy did about it (``"restarted after 12 s"``).
    """
    evidence: dict[str, Any] = {"failure_class": c.failure_class.value, "confidence": c.confidence}
    if c.exit_code is not None:
        evidence["exit_code"] = c.exit_code
    if c.signal is not None:
        evidence["signal"] = c.signal_name
    if c.location:
        evidence["location"] = c.location
    if attempt is not None:
        evidence["attempt"] = attempt
    evidence.update(c.details)
    if c.evidence_lines:
        evidence["lines"] = list(c.evidence_lines)
    if action:
        evidence["action"] = action
    severity = Severity.INFO if c.failure_class is FailureClass.SUCCESS else Severity.ERROR
    subject = str(c.gpu) if c.gpu is not None and c.details.get("hardware") else None
    return Finding(
        id=f"failure.{c.failure_class.value}",
        category=c.category,
        severity=severity,
        title=f"{TITLES[c.failure_class]}: {c.why}",
        evidence=evidence,
        fix=_fix(c),
        impact=None,
        subject=subject,
    )
