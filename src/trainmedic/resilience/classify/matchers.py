"""Matchers of specific failure messages (GPU OOM, collective timeout,
DataLoader worker death, host allocation failure, the Fabric Manager down, CUDA
error): the earliest line that names one decides, with the measured values it
carries."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trainmedic.findings.model import Category
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuRef
from trainmedic.gpu.visible import nvml_gpu_for_cuda_device
from trainmedic.resilience.classify.model import Base, Classification, FailureClass, FailureEvidence
from trainmedic.resilience.classify.patterns import (
    COLLECTIVE_RE,
    CONTENTION,
    CUDA_ERROR_RE,
    DEVICE_ASSERT_RE,
    DRIVER_MISMATCH,
    FD_LIMIT_RE,
    GLOO_TIMEOUT_MS_RE,
    HARDWARE_TEXT,
    HOST_ALLOC_BYTES_RE,
    HOST_ALLOC_RE,
    LOADER_TIMEOUT_RE,
    NCCL_TIMEOUT_MS_RE,
    NCCL_WORK_RE,
    RANK_RE,
    SHM_RE,
    WORKER_RE,
)
from trainmedic.resilience.classify.text import clean, context, human, last_frame
from trainmedic.resilience.errorfile import ErrorReport


def specific_from_report(
    base: Base, report: ErrorReport, evidence: FailureEvidence
) -> Classification | None:
    """Match the root report's exception, then its chained tracebacks."""
    head = f"{report.exc_type}: {report.message}"
    text_lines = [head, *report.message.splitlines()[1:], *report.traceback.splitlines()]
    found = specific_from_lines(base, [clean(x) for x in text_lines], evidence)
    if found is None:
        return None
    loc = found.location or report.location
    return Classification(
        failure_class=found.failure_class,
        category=found.category,
        confidence="high",
        why=f"{found.why} (error file of pid {report.pid})",
        evidence_lines=found.evidence_lines,
        location=loc,
        exit_code=found.exit_code,
        signal=found.signal,
        details={
            **found.details,
            "pid": report.pid,
            **({"rank": report.rank} if report.rank is not None else {}),
        },
        gpu=found.gpu,
    )


def specific_from_lines(
    base: Base, lines: Sequence[str], evidence: FailureEvidence
) -> Classification | None:
    """The earliest line that names a specific failure decides."""
    for i, line in enumerate(lines):
        if DEVICE_ASSERT_RE.search(line):
            return base.make(
                FailureClass.USER_EXCEPTION,
                Category.TIMEOUT,
                "high",
                "a CUDA kernel assertion failed (device-side assert): usually an index out of "
                "range, e.g. a label >= the number of classes; a bug, not retried",
                context(lines, i),
                location=last_frame(lines[:i]),
            )
        if (tf := faults.parse_tf_oom(line)) is not None:
            return _tf_oom(base, lines, i, evidence, tf)
        if faults.CUDA_OOM_RE.search(line):
            return _cuda_oom(base, lines, i, evidence)
        if COLLECTIVE_RE.search(line):
            return _collective_timeout(base, lines, i)
        if WORKER_RE.search(line) or SHM_RE.search(line) or FD_LIMIT_RE.search(line):
            return _worker_died(base, lines, i, evidence)
        if HOST_ALLOC_RE.search(line):
            return _host_alloc(base, lines, i)
        if faults.is_fabric_manager_down(line):
            return _fabric_manager_down(base, lines, i)
        if CUDA_ERROR_RE.search(line):
            return _cuda_error(base, lines, i)
        if m := LOADER_TIMEOUT_RE.search(line):
            return base.make(
                FailureClass.HANG,
                Category.TIMEOUT,
                "high",
                f"no batch arrived within the DataLoader's own timeout ({m[1]} s): "
                "data loading stalled",
                context(lines, i, 0),
                location=last_frame(lines[:i]),
                details={"dataloader_timeout_s": int(m[1])},
            )
    return None


def _on_gpu(details: dict[str, Any], evidence: FailureEvidence) -> tuple[str, GpuRef | None]:
    """Where ``details["cuda_device"]`` (the process's CUDA ordinal, as torch and
    TensorFlow number it) is in NVML's numbering: words, and the GPU when known."""
    device = details["cuda_device"]
    env = {
        k: v
        for k, v in (
            ("CUDA_VISIBLE_DEVICES", evidence.visible_devices),
            ("CUDA_DEVICE_ORDER", evidence.device_order),
        )
        if v is not None
    }
    found = nvml_gpu_for_cuda_device(device, env, evidence.gpus)
    if found is None:
        return f"CUDA device {device}", None
    details["gpu_index"] = found.index
    where = f"GPU {found.index}"
    if device != found.index:
        where += f" (CUDA device {device})"
    return where, found.ref


def _cuda_oom(
    base: Base, lines: Sequence[str], i: int, evidence: FailureEvidence
) -> Classification:
    details = faults.parse_cuda_oom(" ".join(lines[i : i + 3]))
    why = "CUDA ran out of memory"
    gpu: GpuRef | None = None
    if "requested_bytes" in details:
        where, gpu = _on_gpu(details, evidence)
        why += (
            f" allocating {human(details['requested_bytes'])} on {where} "
            f"with {human(details['free_bytes'])} free of {human(details['total_bytes'])}"
        )
    return base.make(
        FailureClass.CUDA_OOM,
        Category.GPU_MEMORY,
        "high",
        why,
        context(lines, i, 0),
        location=last_frame(lines[:i]),
        details=details,
        gpu=gpu,
    )


def _tf_oom(
    base: Base,
    lines: Sequence[str],
    i: int,
    evidence: FailureEvidence,
    details: dict[str, Any],
) -> Classification:
    """TensorFlow's (or XLA's) out-of-memory error: on a GPU, or the host's allocator."""
    text = " ".join(lines[i : i + 2])
    device = details.get("device")
    if device is None:
        # Older texts name no device: the CPU allocator says so; otherwise, where the
        # machine has GPUs, TensorFlow places tensors on them.
        device = "CPU" if "allocator cpu" in text.lower() or not evidence.gpus else "GPU"
        details["device"] = device
    if device == "GPU" and "cuda_device" not in details:
        # The allocator's warning before the error names the GPU and the size it wanted.
        for earlier in reversed(lines[max(0, i - 40) : i]):
            if bfc := faults.parse_bfc_oom(earlier):
                details.setdefault("requested_bytes", bfc["requested_bytes"])
                details["cuda_device"] = bfc["cuda_device"]
                break
    what = ""
    if "tensor_shape" in details:
        shape = "x".join(str(d) for d in details["tensor_shape"])
        what = f" (a {details['dtype']} tensor of shape [{shape}])"
    size = f" {human(details['requested_bytes'])}" if "requested_bytes" in details else ""
    if device == "CPU":
        return base.make(
            FailureClass.HOST_ALLOC_FAILURE,
            Category.TIMEOUT,
            "high",
            f"TensorFlow ran out of host (CPU) memory allocating{size}{what}",
            context(lines, i, 1),
            location=last_frame(lines[:i]),
            details=details,
        )
    gpu: GpuRef | None = None
    where = "a GPU"
    if "cuda_device" in details:
        where, gpu = _on_gpu(details, evidence)
    name = "XLA" if details["framework"] == "xla" else "TensorFlow"
    return base.make(
        FailureClass.CUDA_OOM,
        Category.GPU_MEMORY,
        "high",
        f"{name} ran out of GPU memory allocating{size}{what} on {where}",
        context(lines, i, 1),
        location=last_frame(lines[:i]),
        details=details,
        gpu=gpu,
    )


def _collective_timeout(base: Base, lines: Sequence[str], i: int) -> Classification:
    text = " ".join(lines[i : i + 2])
    details: dict[str, Any] = {}
    if m := NCCL_WORK_RE.search(text):
        details.update(seq_num=int(m[1]), op_type=m[2], backend="nccl")
    if m := NCCL_TIMEOUT_MS_RE.search(text):
        details["timeout_ms"] = int(m[1])
    if m := GLOO_TIMEOUT_MS_RE.search(text):
        details.update(timeout_ms=int(m[1]), op_type=m[2], backend="gloo")
    if m := RANK_RE.search(text):
        details["rank"] = int(m[1])
    if "Collective has timed out" in text:
        details["backend"] = "tensorflow"
    if "DistStoreError" in text or "waiting for clients" in text:
        details["stage"] = "rendezvous"
    what = details.get("op_type", "a collective operation")
    why = f"{what} did not complete on every rank within the process group timeout"
    if "timeout_ms" in details:
        why += f" ({details['timeout_ms'] / 1000:g} s)"
    if details.get("stage") == "rendezvous":
        why = "not every rank joined the rendezvous before the store timed out"
    return base.make(
        FailureClass.COLLECTIVE_TIMEOUT,
        Category.TIMEOUT,
        "high",
        why,
        context(lines, i, 1),
        details=details,
    )


def _worker_died(
    base: Base, lines: Sequence[str], i: int, evidence: FailureEvidence
) -> Classification:
    window = lines[max(0, i - 3) : i + 3]
    text = " ".join(window)
    details: dict[str, Any] = {}
    m = WORKER_RE.search(text)
    if m:
        details["worker_pids"] = [int(p) for p in re.split(r"[, ]+", m[1].strip()) if p]
        if m[2]:
            details["worker_signal"] = m[2].strip()
        if m[3]:
            details["worker_exit_code"] = int(m[3])
    worker_signal = details.get("worker_signal", "")
    if SHM_RE.search(text) or worker_signal == "Bus error":
        cause, category = "shm", Category.FRAMEWORK_CONFIG
        why = "a DataLoader worker died because shared memory (/dev/shm) ran out"
    elif FD_LIMIT_RE.search(text):
        cause, category = "fd_limit", Category.FRAMEWORK_CONFIG
        why = "DataLoader workers ran out of file descriptors sharing tensors"
    elif worker_signal == "Killed":
        cause, category = "killed", Category.TIMEOUT
        why = "a DataLoader worker was killed (SIGKILL), usually by the host OOM killer"
        if evidence.oom_kill_delta:
            why = (
                "the host OOM killer killed a DataLoader worker "
                f"(oom_kill +{evidence.oom_kill_delta})"
            )
    elif worker_signal:
        cause, category = "crashed", Category.TIMEOUT
        why = f"a DataLoader worker crashed ({worker_signal}) in the dataset or a transform"
    else:
        cause, category = "exited", Category.TIMEOUT
        why = "a DataLoader worker exited unexpectedly"
    details["cause"] = cause
    return base.make(
        FailureClass.DATALOADER_WORKER_DIED,
        category,
        "high",
        why,
        context(lines, i, 1),
        details=details,
    )


def _host_alloc(base: Base, lines: Sequence[str], i: int) -> Classification:
    details: dict[str, Any] = {}
    if m := HOST_ALLOC_BYTES_RE.search(" ".join(lines[i : i + 2])):
        details["requested_bytes"] = int(m[1])
    why = "a host (CPU) memory allocation failed"
    if "requested_bytes" in details:
        why += f" ({human(details['requested_bytes'])} requested)"
    return base.make(
        FailureClass.HOST_ALLOC_FAILURE,
        Category.TIMEOUT,
        "high",
        why,
        context(lines, i, 1),
        location=last_frame(lines[:i]),
        details=details,
    )


def _fabric_manager_down(base: Base, lines: Sequence[str], i: int) -> Classification:
    # A fault of the machine, not of the job or of one GPU: leaving a GPU out does not
    # help, and an attempt on this node fails the same way until the service runs.
    return base.make(
        FailureClass.CUDA_ERROR,
        Category.DRIVER,
        "high",
        "CUDA could not start (error 802, system not yet initialized): the machine is not "
        "ready for CUDA, on an NVSwitch machine because its Fabric Manager is not running",
        context(lines, i, 1),
        location=last_frame(lines[:i]),
        details={
            "error": "system not yet initialized",
            "cuda_error_code": 802,
            "cause": "fabric_manager",
            "node_fault": True,
        },
    )


def _cuda_error(base: Base, lines: Sequence[str], i: int) -> Classification:
    line = lines[i]
    m = CUDA_ERROR_RE.search(line)
    assert m is not None
    error = next(g for g in m.groups() if g).strip().rstrip(".")
    details: dict[str, Any] = {"error": error}
    lowered = line.lower()
    if any(t.lower() in lowered for t in HARDWARE_TEXT):
        category, details["hardware"] = Category.HARDWARE_FAULT, True
    elif any(t in lowered for t in DRIVER_MISMATCH):
        category = Category.DRIVER
    elif any(t in lowered for t in CONTENTION):
        category = Category.CONTENTION
    else:
        category = Category.TIMEOUT
    return base.make(
        FailureClass.CUDA_ERROR,
        category,
        "high",
        f"CUDA reported an error: {error}",
        context(lines, i, 1),
        location=last_frame(lines[:i]),
        details=details,
    )
