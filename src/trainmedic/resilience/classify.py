"""Why did the attempt end? Failure classes from the evidence an exit leaves.

The supervisor gathers a :class:`FailureEvidence` after each attempt (exit
status, the last lines of stderr, the probe's error files, the cgroup's
``oom_kill`` count, whether its watchdog declared a hang, kernel log lines)
and :func:`classify_failure` names the :class:`FailureClass`, the root-cause
:class:`~trainmedic.findings.model.Category`, how sure it is and the lines
that prove it. Pure: no I/O, no clock.

How the evidence is weighed (docs/restarts.md, "Failure classes"):

1. Exit status 0 without a declared hang is :attr:`FailureClass.SUCCESS`.
2. A command that never ran (exit 126/127, a launch error) is ``BAD_COMMAND``.
3. The watchdog's hang verdict is ``HANG`` — unless NCCL/gloo's own watchdog
   reported a collective timeout (``COLLECTIVE_TIMEOUT``) or the kernel logged
   a hardware Xid (``CUDA_ERROR``), which explain the hang.
4. A specific message (CUDA OOM, collective timeout, DataLoader worker death,
   host allocation failure, CUDA error) in the earliest error file, else the
   earliest such line in stderr: the earliest failure is the root cause,
   later ones are other ranks reacting to it.
5. Hardware Xid / ECC evidence with no specific message: ``CUDA_ERROR``.
6. The exit signal: SIGKILL with OOM-killer evidence is ``HOST_OOM_KILL``;
   SIGTERM/SIGINT/SIGHUP ``PREEMPTED``; SIGSEGV/SIGBUS/SIGILL/SIGFPE
   ``SEGFAULT``; SIGABRT ``ABORT``.
7. A distributed communication error (a lost peer) is ``UNKNOWN`` with
   category ``network``; any other Python exception is ``USER_EXCEPTION``;
   exit 2 with a usage message is ``BAD_COMMAND``; the rest is ``UNKNOWN``.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from trainmedic.findings.fixes import SHM_FIX_WITH_WORKERS
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.resilience.errorfile import ErrorReport, is_user_code

STDERR_TAIL_LINES = 200
"""How many of the last stderr lines the supervisor keeps for classification."""

MAX_EVIDENCE_LINES = 8
MAX_LINE_CHARS = 300

Confidence = Literal["high", "medium", "low"]


class FailureClass(str, Enum):
    """How an attempt ended. The value is the stable name used in findings and JSON."""

    HANG = "hang"
    CUDA_OOM = "cuda_oom"
    HOST_ALLOC_FAILURE = "host_alloc_failure"
    HOST_OOM_KILL = "host_oom_kill"
    CUDA_ERROR = "cuda_error"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    DATALOADER_WORKER_DIED = "dataloader_worker_died"
    SEGFAULT = "segfault"
    ABORT = "abort"
    USER_EXCEPTION = "user_exception"
    BAD_COMMAND = "bad_command"
    PREEMPTED = "preempted"
    SUCCESS = "success"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GpuRef:
    """A GPU named by any of its identities (whichever the evidence gives).

    Attributes:
        index: NVML index (``nvidia-smi`` order, PCI bus order).
        uuid: ``GPU-...`` UUID.
        pci_bus_id: PCI address, normalised to ``0000:3b:00.0`` form, lower case.
    """

    index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None

    def __str__(self) -> str:
        if self.index is not None:
            return f"gpu{self.index}"
        return self.uuid or self.pci_bus_id or "gpu?"

    def same_gpu(self, other: GpuRef) -> bool:
        """True when any identity both sides know is equal."""
        if self.uuid and other.uuid:
            return self.uuid.lower() == other.uuid.lower()
        if self.pci_bus_id and other.pci_bus_id:
            return normalize_pci_bus_id(self.pci_bus_id) == normalize_pci_bus_id(other.pci_bus_id)
        return self.index is not None and self.index == other.index


def normalize_pci_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML), ``0000:3b:00`` (Xid) -> ``0000:3b:00.0``."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:  # bus:device.function without a domain
        parts.insert(0, "0000")
    domain = parts[0][-4:].rjust(4, "0")
    bus = parts[1].rjust(2, "0")
    device_function = parts[2] if len(parts) > 2 else "00"
    if "." not in device_function:
        device_function += ".0"
    return f"{domain}:{bus}:{device_function}"


@dataclass(frozen=True)
class GpuFault:
    """A hardware fault the supervisor's GPU sampler saw during the attempt.

    Attributes:
        gpu: the GPU.
        reason: what was seen, e.g. ``"volatile uncorrected ECC errors +2"``,
            ``"row remap failure"``.
    """

    gpu: GpuRef
    reason: str


@dataclass(frozen=True)
class FailureEvidence:
    """Everything known about how one attempt ended.

    Attributes:
        exit_code: the job's exit status as ``subprocess`` gives it (negative:
            killed by that signal), ``None`` when unknown.
        stderr_tail: the last lines of the job's stderr (about
            :data:`STDERR_TAIL_LINES`), oldest first.
        error_reports: the probe's error files of this attempt (any order).
        oom_kill_delta: increase of the job cgroup's ``memory.events``
            ``oom_kill`` counter during the attempt; ``None`` when unreadable.
        hang_declared: the supervisor's watchdog declared a hang and stopped the job.
        hang_location: the main thread's innermost frame when the hang was
            declared (``file:line in function``), when the probe could tell.
        hang_silence: the evidence's class of the hang (``blocked``, ``spinning``,
            ``peer_wait``, ``source_wait``, ``unclear``), when known.
        hang_source: for ``source_wait``: what the job waited on
            (``network: socket 10.0.0.5:9000``, ``filesystem: /mnt/data``).
        hang_evidence: the deciding process's evidence, one sentence.
        kernel_log: kernel log lines (``dmesg``) from the attempt, when readable.
        terminated_by_supervisor: the supervisor itself sent the stop signal.
        launch_error: why the command could not be started (``FileNotFoundError``).
        job_pids: process ids of the job's tree, to tell its OOM kills from others'.
        num_workers: the largest DataLoader ``num_workers`` seen in the attempt.
        gpu_faults: hardware faults the GPU sampler saw during the attempt.
    """

    exit_code: int | None
    stderr_tail: tuple[str, ...] = ()
    error_reports: tuple[ErrorReport, ...] = ()
    oom_kill_delta: int | None = None
    hang_declared: bool = False
    hang_location: str | None = None
    hang_silence: str | None = None
    hang_source: str | None = None
    hang_evidence: str | None = None
    kernel_log: tuple[str, ...] = ()
    terminated_by_supervisor: bool = False
    launch_error: str | None = None
    job_pids: frozenset[int] = frozenset()
    num_workers: int | None = None
    gpu_faults: tuple[GpuFault, ...] = ()

    @classmethod
    def from_stderr_text(cls, exit_code: int | None, text: str, **kwargs: Any) -> FailureEvidence:
        """Evidence from a whole stderr text, keeping its last :data:`STDERR_TAIL_LINES`."""
        lines = tuple(text.splitlines()[-STDERR_TAIL_LINES:])
        return cls(exit_code=exit_code, stderr_tail=lines, **kwargs)


@dataclass(frozen=True)
class Classification:
    """The verdict on one attempt.

    Attributes:
        failure_class: how the attempt ended.
        category: the root cause in the catalogue.
        confidence: ``high`` (a message or measurement names it), ``medium``
            (inferred from a signal with corroboration), ``low`` (exit status only).
        why: one sentence naming the evidence.
        evidence_lines: the key lines (stderr, error file, kernel log), oldest first.
        location: where it happened (``file:line in function``), when known.
        exit_code / signal: as observed (``signal`` may come from a torchrun
            summary or a shell's 128+N exit status).
        details: class-specific measured values, units in the keys
            (``requested_bytes``, ``xid``, ``timeout_ms``, ``worker_signal``, ...).
        gpu: the GPU at fault, for hardware errors.
    """

    failure_class: FailureClass
    category: Category
    confidence: Confidence
    why: str
    evidence_lines: tuple[str, ...] = ()
    location: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    gpu: GpuRef | None = None

    @property
    def signal_name(self) -> str | None:
        return None if self.signal is None else _signal_name(self.signal)


# ------------------------------------------------------------------ patterns

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX_RE = re.compile(r"^(?:\[(?:rank\d+|default\d+|[\w-]*\d+)\]:\s?)+")
_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|[KMGTP]i?B)"
_UNITS = {"bytes": 1, "B": 1}
for _i, _p in enumerate("KMGTP", start=1):
    _UNITS[f"{_p}iB"] = 1024**_i
    _UNITS[f"{_p}B"] = 1024**_i  # torch < 2.1 printed "GB" for GiB values

_OOM_RE = re.compile(
    r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|CUDA error: out of memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED|Cuda failure 'out of memory'|HIP out of memory"
)
_OOM_NEW_RE = re.compile(
    rf"Tried to allocate {_SIZE}\. GPU (\d+) has a total capacity of {_SIZE} "
    rf"of which {_SIZE} is free"
)
_OOM_OLD_RE = re.compile(
    rf"Tried to allocate {_SIZE} \(GPU (\d+); {_SIZE} total capacity; {_SIZE} already allocated; "
    rf"{_SIZE} free; {_SIZE} reserved in total by PyTorch"
)
_OOM_UNALLOCATED_RE = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")
_OOM_ALLOCATED_RE = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch")

_COLLECTIVE_RE = re.compile(
    r"Watchdog caught collective operation timeout"
    r"|ran for \d+ milliseconds before timing out"
    r"|Timed out waiting \d+ ?ms for (?:recv|send) operation to complete"
    r"|[Hh]eartbeat monitor timed out"
    r"|DistStoreError: .*[Tt]imed out"
    r"|Timed out after \d+ seconds waiting for clients"
)
_NCCL_WORK_RE = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)")
_NCCL_TIMEOUT_MS_RE = re.compile(r"Timeout\(ms\)=(\d+)")
_GLOO_TIMEOUT_MS_RE = re.compile(r"Timed out waiting (\d+) ?ms for (recv|send)")
_RANK_RE = re.compile(r"\[Rank (\d+)\]")

_WORKER_RE = re.compile(
    r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([A-Za-z][A-Za-z ]*)"
    r"|exited unexpectedly(?: with exit code (-?\d+))?)"
)
_SHM_RE = re.compile(
    r"insufficient shared memory|out of shared memory|raise your shared memory limit"
    r"|No space left on device.*(?:/dev/shm|torch_\d+|shm)"
    r"|(?:/dev/shm|torch_\d+|shm).*No space left on device"
)
_FD_LIMIT_RE = re.compile(r"Too many open files|received \d+ items of ancdata")
_LOADER_TIMEOUT_RE = re.compile(r"DataLoader timed out after (\d+) seconds")

_HOST_ALLOC_RE = re.compile(
    r"std::bad_alloc|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"
    r"|Cannot allocate memory|Unable to allocate .* for an array|^(?:\w+\.)*\w*MemoryError\b"
)
_HOST_ALLOC_BYTES_RE = re.compile(r"you tried to allocate (\d+) bytes")

_CUDA_ERROR_RE = re.compile(
    r"CUDA error: (.+?)\.?\s*$"
    r"|(an illegal memory access was encountered)"
    r"|(uncorrectable ECC error encountered)"
    r"|cuDNN error: (CUDNN_STATUS_\w+)"
    r"|(CUBLAS_STATUS_EXECUTION_FAILED|CUBLAS_STATUS_INTERNAL_ERROR)"
    r"|NCCL error.*(unhandled cuda error)"
    r"|(CUDA driver version is insufficient)"
)
_DEVICE_ASSERT_RE = re.compile(r"device-side assert triggered|Assertion `.*` failed")
_DRIVER_MISMATCH = (
    "no kernel image is available",
    "driver version is insufficient",
    "invalid device function",
)
_CONTENTION = ("busy or unavailable",)
_HARDWARE_TEXT = ("uncorrectable ECC", "ECC error", "fallen off the bus", "unrecoverable")

_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f.]+)\): (\d+)"
)
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
"""Xid codes that point at the GPU itself (NVIDIA's Xid catalogue): double-bit
ECC (48), internal micro-controller faults (61, 62), row remapping events and
failures (63, 64), NVLink errors (74), fallen off the bus (79), high
single-bit ECC rate (92), contained/uncontained ECC (94, 95), GSP errors
(119, 120), unrecovered ECC (140). Xids 13, 31 and 43 usually mean an
application bug and are not on the list."""

_KERNEL_OOM_RE = re.compile(
    r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+)|oom-kill:.*task_memcg"
)
_KERNEL_OOM_PID_RE = re.compile(r"Killed process (\d+)|oom-kill:.*,pid=(\d+)")

_COMM_ERROR_TYPE_RE = re.compile(r"(?:^|\.)Dist(?:Backend|Network|Store)?Error$")
_COMM_ERROR_RE = re.compile(
    r"Connection (?:reset|closed) by peer|NCCL error|remote process exited"
    r"|network error|Broken pipe|ProcessGroup\w* is (?:aborted|shut ?down)"
)
_TORCHRUN_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_TRACEBACK_START = "Traceback (most recent call last):"
_EXC_LINE_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
# Python tracebacks say `line 12, in f`; faulthandler dumps say `line 12 in f`.
_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+),? in (\S+)')
_USAGE_RE = re.compile(
    r"^usage: |error: unrecognized arguments|error: the following arguments are required"
)
_CANT_OPEN_RE = re.compile(
    r"can't open file .*\[Errno 2\]|No such file or directory: '.*'$|command not found"
)


# ------------------------------------------------------------- classifier


_MEMORY_CLASSES = frozenset(
    {
        FailureClass.HOST_OOM_KILL,
        FailureClass.HOST_ALLOC_FAILURE,
        FailureClass.DATALOADER_WORKER_DIED,
    }
)


def classify_failure(evidence: FailureEvidence) -> Classification:
    """Name the failure class of one attempt from its evidence (see module docstring)."""
    c = _classify(evidence)
    if evidence.num_workers is not None and c.failure_class in _MEMORY_CLASSES:
        # The worker count is what the fewer-workers remedy halves.
        details = {**c.details, "num_workers": evidence.num_workers}
        c = dataclasses.replace(c, details=details)
    return c


def _classify(evidence: FailureEvidence) -> Classification:
    lines = [_clean(line) for line in evidence.stderr_tail]
    signum, signal_source = _exit_signal(evidence.exit_code, lines)
    base = _Base(evidence.exit_code, signum)

    if evidence.exit_code == 0 and not evidence.hang_declared:
        return base.make(
            FailureClass.SUCCESS, Category.TIMEOUT, "high", "the job exited with status 0"
        )
    if evidence.launch_error or evidence.exit_code in (126, 127):
        return _bad_command(base, evidence, lines)

    hardware = _hardware_evidence(evidence, lines)
    root = _root_report(evidence.error_reports)
    specific = _specific_from_report(base, root, evidence) if root else None
    if specific is None:
        specific = _specific_from_lines(base, lines, evidence)

    if evidence.hang_declared:
        if specific is not None and specific.failure_class is FailureClass.COLLECTIVE_TIMEOUT:
            return specific
        if hardware is not None:
            return _with_hardware(base, None, hardware, "the job hung")
        return _hang(base, evidence, specific)

    if specific is not None:
        if hardware is not None and specific.failure_class in (
            FailureClass.CUDA_ERROR,
            FailureClass.COLLECTIVE_TIMEOUT,
        ):
            return _with_hardware(base, specific, hardware, specific.why)
        return specific
    if hardware is not None:
        return _with_hardware(base, None, hardware, _signal_phrase(signum, signal_source))

    from_signal = _from_signal(base, evidence, lines, signum, signal_source)
    if from_signal is not None:
        return from_signal
    exception = _user_exception(base, root, lines)
    if exception is not None:
        return exception
    if evidence.exit_code == 2 and any(
        _USAGE_RE.search(line) or _CANT_OPEN_RE.search(line) for line in lines
    ):
        return _bad_command(base, evidence, lines)
    code = "unknown" if evidence.exit_code is None else str(evidence.exit_code)
    return base.make(
        FailureClass.UNKNOWN,
        Category.TIMEOUT,
        "low",
        f"exit status {code} with no error message, signal or hang to explain it",
        _tail(lines, 5),
    )


@dataclass(frozen=True)
class _Base:
    exit_code: int | None
    signal: int | None

    def make(
        self,
        failure_class: FailureClass,
        category: Category,
        confidence: Confidence,
        why: str,
        evidence_lines: Iterable[str] = (),
        *,
        location: str | None = None,
        details: Mapping[str, Any] | None = None,
        gpu: GpuRef | None = None,
    ) -> Classification:
        kept = tuple(line[:MAX_LINE_CHARS] for line in evidence_lines if line.strip())
        return Classification(
            failure_class=failure_class,
            category=category,
            confidence=confidence,
            why=why,
            evidence_lines=kept[-MAX_EVIDENCE_LINES:],
            location=location,
            exit_code=self.exit_code,
            signal=self.signal,
            details=dict(details or {}),
            gpu=gpu,
        )


def _clean(line: str) -> str:
    return _PREFIX_RE.sub("", _ANSI_RE.sub("", line)).rstrip()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _exit_signal(exit_code: int | None, lines: Sequence[str]) -> tuple[int | None, str]:
    """The signal that ended the job (or its failing worker) and where that came from."""
    if exit_code is not None and exit_code < 0:
        return -exit_code, "exit status"
    for line in lines:  # torchrun's summary names the worker's exit code
        m = _TORCHRUN_EXIT_RE.search(line)
        if m and int(m[1]) < 0:
            return -int(m[1]), "torchrun summary"
    if exit_code is not None and 128 < exit_code <= 128 + 64:
        return exit_code - 128, "exit status 128+N"
    return None, ""


def _signal_phrase(signum: int | None, source: str) -> str:
    if signum is None:
        return "the job failed"
    return f"the job was ended by {_signal_name(signum)} ({source})"


def _root_report(reports: Sequence[ErrorReport]) -> ErrorReport | None:
    """The earliest report: later ones are usually other ranks reacting to it."""
    return min(reports, key=lambda r: r.t) if reports else None


def _tail(lines: Sequence[str], n: int) -> list[str]:
    return [line for line in lines if line.strip()][-n:]


def _context(lines: Sequence[str], index: int, after: int = 2) -> list[str]:
    return list(lines[index : index + 1 + after])


# ------------------------------------------------------ specific detectors


def _specific_from_report(
    base: _Base, report: ErrorReport, evidence: FailureEvidence
) -> Classification | None:
    """Match the root report's exception, then its chained tracebacks."""
    head = f"{report.exc_type}: {report.message}"
    text_lines = [head, *report.message.splitlines()[1:], *report.traceback.splitlines()]
    found = _specific_from_lines(base, [_clean(x) for x in text_lines], evidence)
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


def _specific_from_lines(
    base: _Base, lines: Sequence[str], evidence: FailureEvidence
) -> Classification | None:
    """The earliest line that names a specific failure decides."""
    for i, line in enumerate(lines):
        if _DEVICE_ASSERT_RE.search(line):
            return base.make(
                FailureClass.USER_EXCEPTION,
                Category.TIMEOUT,
                "high",
                "a CUDA kernel assertion failed (device-side assert): usually an index out of "
                "range, e.g. a label >= the number of classes; a bug, not retried",
                _context(lines, i),
                location=_last_frame(lines[:i]),
            )
        if _OOM_RE.search(line):
            return _cuda_oom(base, lines, i)
        if _COLLECTIVE_RE.search(line):
            return _collective_timeout(base, lines, i)
        if _WORKER_RE.search(line) or _SHM_RE.search(line) or _FD_LIMIT_RE.search(line):
            return _worker_died(base, lines, i, evidence)
        if _HOST_ALLOC_RE.search(line):
            return _host_alloc(base, lines, i)
        if _CUDA_ERROR_RE.search(line):
            return _cuda_error(base, lines, i)
        if m := _LOADER_TIMEOUT_RE.search(line):
            return base.make(
                FailureClass.HANG,
                Category.TIMEOUT,
                "high",
                f"no batch arrived within the DataLoader's own timeout ({m[1]} s): "
                "data loading stalled",
                _context(lines, i, 0),
                location=_last_frame(lines[:i]),
                details={"dataloader_timeout_s": int(m[1])},
            )
    return None


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def _cuda_oom(base: _Base, lines: Sequence[str], i: int) -> Classification:
    text = " ".join(lines[i : i + 3])
    details: dict[str, Any] = {}
    if m := _OOM_NEW_RE.search(text):
        details.update(
            requested_bytes=_bytes(m[1], m[2]),
            gpu_index=int(m[3]),
            total_bytes=_bytes(m[4], m[5]),
            free_bytes=_bytes(m[6], m[7]),
        )
    elif m := _OOM_OLD_RE.search(text):
        details.update(
            requested_bytes=_bytes(m[1], m[2]),
            gpu_index=int(m[3]),
            total_bytes=_bytes(m[4], m[5]),
            allocated_bytes=_bytes(m[6], m[7]),
            free_bytes=_bytes(m[8], m[9]),
            reserved_bytes=_bytes(m[10], m[11]),
        )
    if m := _OOM_UNALLOCATED_RE.search(text):
        details["reserved_unallocated_bytes"] = _bytes(m[1], m[2])
    if m := _OOM_ALLOCATED_RE.search(text):
        details["allocated_bytes"] = _bytes(m[1], m[2])
    why = "CUDA ran out of memory"
    if "requested_bytes" in details:
        why += (
            f" allocating {_human(details['requested_bytes'])} on GPU {details['gpu_index']} "
            f"with {_human(details['free_bytes'])} free of {_human(details['total_bytes'])}"
        )
    gpu = GpuRef(index=details["gpu_index"]) if "gpu_index" in details else None
    return base.make(
        FailureClass.CUDA_OOM,
        Category.GPU_MEMORY,
        "high",
        why,
        _context(lines, i, 0),
        location=_last_frame(lines[:i]),
        details=details,
        gpu=gpu,
    )


def _collective_timeout(base: _Base, lines: Sequence[str], i: int) -> Classification:
    text = " ".join(lines[i : i + 2])
    details: dict[str, Any] = {}
    if m := _NCCL_WORK_RE.search(text):
        details.update(seq_num=int(m[1]), op_type=m[2], backend="nccl")
    if m := _NCCL_TIMEOUT_MS_RE.search(text):
        details["timeout_ms"] = int(m[1])
    if m := _GLOO_TIMEOUT_MS_RE.search(text):
        details.update(timeout_ms=int(m[1]), op_type=m[2], backend="gloo")
    if m := _RANK_RE.search(text):
        details["rank"] = int(m[1])
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
        _context(lines, i, 1),
        details=details,
    )


def _worker_died(
    base: _Base, lines: Sequence[str], i: int, evidence: FailureEvidence
) -> Classification:
    window = lines[max(0, i - 3) : i + 3]
    text = " ".join(window)
    details: dict[str, Any] = {}
    m = _WORKER_RE.search(text)
    if m:
        details["worker_pids"] = [int(p) for p in re.split(r"[, ]+", m[1].strip()) if p]
        if m[2]:
            details["worker_signal"] = m[2].strip()
        if m[3]:
            details["worker_exit_code"] = int(m[3])
    worker_signal = details.get("worker_signal", "")
    if _SHM_RE.search(text) or worker_signal == "Bus error":
        cause, category = "shm", Category.FRAMEWORK_CONFIG
        why = "a DataLoader worker died because shared memory (/dev/shm) ran out"
    elif _FD_LIMIT_RE.search(text):
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
        _context(lines, i, 1),
        details=details,
    )


def _host_alloc(base: _Base, lines: Sequence[str], i: int) -> Classification:
    details: dict[str, Any] = {}
    if m := _HOST_ALLOC_BYTES_RE.search(" ".join(lines[i : i + 2])):
        details["requested_bytes"] = int(m[1])
    why = "a host (CPU) memory allocation failed"
    if "requested_bytes" in details:
        why += f" ({_human(details['requested_bytes'])} requested)"
    return base.make(
        FailureClass.HOST_ALLOC_FAILURE,
        Category.TIMEOUT,
        "high",
        why,
        _context(lines, i, 1),
        location=_last_frame(lines[:i]),
        details=details,
    )


def _cuda_error(base: _Base, lines: Sequence[str], i: int) -> Classification:
    line = lines[i]
    m = _CUDA_ERROR_RE.search(line)
    assert m is not None
    error = next(g for g in m.groups() if g).strip().rstrip(".")
    details: dict[str, Any] = {"error": error}
    lowered = line.lower()
    if any(t.lower() in lowered for t in _HARDWARE_TEXT):
        category, details["hardware"] = Category.HARDWARE_FAULT, True
    elif any(t in lowered for t in _DRIVER_MISMATCH):
        category = Category.DRIVER
    elif any(t in lowered for t in _CONTENTION):
        category = Category.CONTENTION
    else:
        category = Category.TIMEOUT
    return base.make(
        FailureClass.CUDA_ERROR,
        category,
        "high",
        f"CUDA reported an error: {error}",
        _context(lines, i, 1),
        location=_last_frame(lines[:i]),
        details=details,
    )


# ------------------------------------------------------------------ hardware


@dataclass(frozen=True)
class _Hardware:
    gpu: GpuRef | None
    xid: int | None
    lines: tuple[str, ...]
    reason: str


def _hardware_evidence(evidence: FailureEvidence, lines: Sequence[str]) -> _Hardware | None:
    """Hardware Xids in the kernel log (or stderr), or faults the GPU sampler saw."""
    for line in [*evidence.kernel_log, *lines]:
        m = _XID_RE.search(line)
        if m and int(m[2]) in HARDWARE_XIDS:
            text = line.strip()[:MAX_LINE_CHARS]
            reason = text.split(f"): {m[2]},", 1)[-1].strip() if "):" in text else text
            return _Hardware(
                gpu=GpuRef(pci_bus_id=normalize_pci_bus_id(m[1])),
                xid=int(m[2]),
                lines=(text,),
                reason=f"Xid {m[2]}: {reason}",
            )
    if evidence.gpu_faults:
        fault = evidence.gpu_faults[0]
        return _Hardware(gpu=fault.gpu, xid=None, lines=(), reason=fault.reason)
    return None


def _with_hardware(
    base: _Base, specific: Classification | None, hw: _Hardware, what: str
) -> Classification:
    details: dict[str, Any] = dict(specific.details) if specific else {}
    details["hardware"] = True
    if hw.xid is not None:
        details["xid"] = hw.xid
    if hw.gpu is not None and hw.gpu.pci_bus_id:
        details["gpu_pci_bus_id"] = hw.gpu.pci_bus_id
    lines = [*(specific.evidence_lines if specific else ()), *hw.lines]
    return base.make(
        FailureClass.CUDA_ERROR,
        Category.HARDWARE_FAULT,
        "high",
        f"{what}; GPU {hw.gpu or '?'} reported a hardware fault ({hw.reason})",
        lines,
        location=specific.location if specific else None,
        details=details,
        gpu=hw.gpu,
    )


# -------------------------------------------------------------- other classes


_HANG_WHAT = {
    "blocked": "every process was blocked (off the CPU, nothing moving)",
    "spinning": "the job spun in place (CPU busy, no work)",
    "peer_wait": "the job waited in a collective or a device synchronisation",
    "source_wait": "the job waited on a data source with nothing arriving",
    "unclear": "the evidence could not tell work from a hang",
}


def _hang(
    base: _Base, evidence: FailureEvidence, specific: Classification | None
) -> Classification:
    what = _HANG_WHAT.get(evidence.hang_silence or "", "the watchdog saw no progress")
    why = f"{what} past the step timeout and the watchdog stopped the job"
    if evidence.hang_evidence:
        why += f" ({evidence.hang_evidence})"
    elif evidence.hang_location:
        why += f"; the main thread was at {evidence.hang_location}"
    lines = list(specific.evidence_lines) if specific else []
    details: dict[str, Any] = {}
    if specific is not None:
        details["also_seen"] = specific.failure_class.value
    category = Category.TIMEOUT
    if evidence.hang_silence:
        details["silence"] = evidence.hang_silence
    source = evidence.hang_source
    if evidence.hang_silence == "source_wait" and source:
        details["source"] = source
        # A data source that stops answering is outside the job: a restart cannot fix it.
        category = Category.NETWORK if source.startswith("network") else Category.IO
        why += f"; the source: {source}"
    return base.make(
        FailureClass.HANG,
        category,
        "high",
        why,
        lines,
        location=evidence.hang_location,
        details=details,
    )


def _bad_command(base: _Base, evidence: FailureEvidence, lines: Sequence[str]) -> Classification:
    if evidence.launch_error:
        why = f"the command could not be started: {evidence.launch_error}"
        shown: list[str] = [evidence.launch_error]
    else:
        meaning = {126: "found but not executable", 127: "not found"}.get(
            evidence.exit_code or 0, "rejected its arguments"
        )
        why = f"the command was {meaning} (exit status {evidence.exit_code})"
        shown = _tail(lines, 3)
    return base.make(FailureClass.BAD_COMMAND, Category.TIMEOUT, "high", why, shown)


def _kernel_oom(evidence: FailureEvidence) -> tuple[list[str], bool]:
    """OOM-killer lines in the kernel log, and whether one names a process of the job."""
    found, ours = [], False
    for line in evidence.kernel_log:
        if _KERNEL_OOM_RE.search(line):
            found.append(line.strip())
            m = _KERNEL_OOM_PID_RE.search(line)
            pid = next((int(g) for g in (m.groups() if m else ()) if g), None)
            if pid is not None and pid in evidence.job_pids:
                ours = True
    return found, ours


def _from_signal(
    base: _Base,
    evidence: FailureEvidence,
    lines: Sequence[str],
    signum: int | None,
    source: str,
) -> Classification | None:
    if signum is None:
        return None
    name = _signal_name(signum)
    tail = _tail(lines, 3)
    if signum == signal.SIGKILL:
        oom_lines, ours = _kernel_oom(evidence)
        if evidence.oom_kill_delta:
            return base.make(
                FailureClass.HOST_OOM_KILL,
                Category.TIMEOUT,
                "high",
                f"SIGKILL ({source}) while the job's cgroup counted {evidence.oom_kill_delta} "
                "OOM kill(s): host memory ran out",
                [*oom_lines, *tail],
                details={"oom_kill_delta": evidence.oom_kill_delta},
            )
        if oom_lines and (ours or not evidence.job_pids):
            return base.make(
                FailureClass.HOST_OOM_KILL,
                Category.TIMEOUT,
                "high" if ours else "medium",
                f"SIGKILL ({source}) and the kernel OOM killer logged a kill"
                + (" of a job process" if ours else ""),
                [*oom_lines, *tail],
            )
        if evidence.terminated_by_supervisor:
            return base.make(
                FailureClass.PREEMPTED, Category.TIMEOUT, "high", "trainmedic stopped the job", tail
            )
        unread = (
            " (the cgroup's memory.events was unreadable)"
            if evidence.oom_kill_delta is None
            else ""
        )
        return base.make(
            FailureClass.UNKNOWN,
            Category.TIMEOUT,
            "low",
            f"SIGKILL ({source}) from outside with no OOM-killer evidence{unread}; the host "
            "OOM killer and schedulers enforcing limits are the usual senders",
            tail,
        )
    if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        who = "trainmedic" if evidence.terminated_by_supervisor else "something outside the job"
        return base.make(
            FailureClass.PREEMPTED,
            Category.TIMEOUT,
            "high" if evidence.terminated_by_supervisor else "medium",
            f"{who} stopped the job with {name} ({source})",
            tail,
        )
    if signum in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
        why = f"the process crashed with {name} ({source}) in native code"
        if signum == signal.SIGBUS:
            why += "; with DataLoader workers this is usually /dev/shm running out"
        return base.make(
            FailureClass.SEGFAULT,
            Category.TIMEOUT,
            "medium",
            why,
            tail,
            location=_last_frame(lines),
        )
    if signum == signal.SIGABRT:
        return base.make(
            FailureClass.ABORT,
            Category.TIMEOUT,
            "medium",
            f"the process aborted with {name} ({source}): a C++ library called abort()",
            [line for line in lines if "terminate called" in line or "what():" in line] or tail,
        )
    return None


def _user_exception(
    base: _Base, report: ErrorReport | None, lines: Sequence[str]
) -> Classification | None:
    if report is not None:
        exc_type, message = report.exc_type, report.message
        shown = [f"{exc_type}: {_first_line(message)}"]
        location, confidence, pid = report.location, "high", report.pid
    else:
        block = _root_traceback(lines)
        if block is None:
            return None
        exc_type, message, frames = block
        shown = [*frames[-2:], f"{exc_type}: {message}" if message else exc_type]
        location, confidence, pid = _last_frame(frames), "medium", None
    details: dict[str, Any] = {"exception_type": exc_type}
    if pid is not None:
        details["pid"] = pid
    if _COMM_ERROR_TYPE_RE.search(exc_type) or _COMM_ERROR_RE.search(message):
        # A lost peer is not a bug in this process: usually another rank failed
        # first (its error file, when there is one, is the root cause).
        return base.make(
            FailureClass.UNKNOWN,
            Category.NETWORK,
            "medium",
            f"a distributed communication error ({exc_type}: {_first_line(message)}); "
            "usually another rank failed first or the network between ranks dropped",
            shown,
            location=location,
            details=details,
        )
    return base.make(
        FailureClass.USER_EXCEPTION,
        Category.TIMEOUT,
        "high" if confidence == "high" else "medium",
        f"uncaught {exc_type}: {_first_line(message)}",
        shown,
        location=location,
        details=details,
    )


def _root_traceback(lines: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """The first traceback whose exception is not a launcher's wrapper (ChildFailedError)."""
    blocks: list[tuple[str, str, list[str]]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != _TRACEBACK_START:
            i += 1
            continue
        frames: list[str] = []
        i += 1
        while i < len(lines):
            # The exception line is the first unindented line after the frames.
            if lines[i] and not lines[i][0].isspace():
                m = _EXC_LINE_RE.match(lines[i])
                exc_type, message = (m[1], m[2] or "") if m else ("Exception", lines[i])
                blocks.append((exc_type, message, frames))
                break
            frames.append(lines[i])
            i += 1
        i += 1
    for block in blocks:
        if not block[0].endswith("ChildFailedError"):
            return block
    return None


def _last_frame(lines: Sequence[str]) -> str | None:
    """The innermost frame among ``lines`` as ``file:N in f``, preferring the user's code."""
    frames = [m for line in lines if (m := _FRAME_RE.match(line))]
    if not frames:
        return None
    user = [m for m in frames if is_user_code(m[1])]
    m = (user or frames)[-1]
    return f"{m[1]}:{m[2]} in {m[3]}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:MAX_LINE_CHARS] if text.strip() else ""


def _human(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} bytes" if unit == "bytes" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ findings

_FIXES: dict[FailureClass, str] = {
    FailureClass.HANG: (
        "Read the main thread's stack in the hang report: a collective that one rank never "
        "reached, a DataLoader worker blocked on a lock, or a deadlock between threads are the "
        "usual causes. If a step or an unmarked evaluation really takes that long, pass "
        "--timeout SECONDS."
    ),
    FailureClass.CUDA_OOM: (
        "Lower the micro-batch and accumulate gradients to keep the effective batch "
        "(trainmedic sets TRAINMEDIC_MICRO_BATCH_DIVISOR; read it with "
        "trainmedic.micro_batch_plan(batch_size)); use bf16 autocast; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when memory reserved but unallocated "
        "is large."
    ),
    FailureClass.HOST_ALLOC_FAILURE: (
        "Host memory ran short: lower DataLoader num_workers and prefetch_factor (each worker "
        "holds a copy of the dataset object), memory-map data instead of loading it into RAM, "
        "or run where more memory is available."
    ),
    FailureClass.HOST_OOM_KILL: (
        "The kernel OOM killer ended the job: raise the memory limit of the container or job, "
        "lower DataLoader num_workers and prefetch_factor, and memory-map large datasets."
    ),
    FailureClass.CUDA_ERROR: (
        "Rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel; check custom CUDA "
        "extensions and the torch build against the driver (trainmedic doctor)."
    ),
    FailureClass.COLLECTIVE_TIMEOUT: (
        "Find the rank that did not reach the collective (its stack differs from the others'): "
        "uneven batches across ranks (use DistributedSampler with drop_last=True), one rank "
        "loading data much slower, or a rank that crashed first. Raise "
        "init_process_group(timeout=...) only if the operation is legitimately slow; "
        "NCCL_DEBUG=WARN logs NCCL's view."
    ),
    FailureClass.DATALOADER_WORKER_DIED: (
        "Reproduce with num_workers=0 to see the dataset's own error."
    ),
    FailureClass.SEGFAULT: (
        "Run with PYTHONFAULTHANDLER=1 to get the Python stack at the crash; suspect native "
        "extensions and mismatched builds (trainmedic doctor)."
    ),
    FailureClass.ABORT: (
        "The line after 'terminate called' names the C++ exception; run with "
        "PYTHONFAULTHANDLER=1 for the Python stack."
    ),
    FailureClass.USER_EXCEPTION: (
        "Fix the exception at the location shown; trainmedic does not restart a bug, "
        "because it would fail the same way again."
    ),
    FailureClass.BAD_COMMAND: "Check the command line: the program, its path and its arguments.",
    FailureClass.PREEMPTED: (
        "The job was stopped from outside; run it again with trainmedic run to resume "
        "from the last checkpoint."
    ),
    FailureClass.SUCCESS: "",
    FailureClass.UNKNOWN: (
        "Look at the job's full log; run with PYTHONFAULTHANDLER=1 and check the kernel log "
        "(dmesg) for OOM kills."
    ),
}

_TITLES: dict[FailureClass, str] = {
    FailureClass.HANG: "The job hung",
    FailureClass.CUDA_OOM: "The job ran out of GPU memory",
    FailureClass.HOST_ALLOC_FAILURE: "A host memory allocation failed",
    FailureClass.HOST_OOM_KILL: "The host OOM killer killed the job",
    FailureClass.CUDA_ERROR: "A CUDA error ended the job",
    FailureClass.COLLECTIVE_TIMEOUT: "A collective operation timed out",
    FailureClass.DATALOADER_WORKER_DIED: "A DataLoader worker died",
    FailureClass.SEGFAULT: "The job crashed in native code",
    FailureClass.ABORT: "The job aborted",
    FailureClass.USER_EXCEPTION: "The job raised an exception",
    FailureClass.BAD_COMMAND: "The command could not run",
    FailureClass.PREEMPTED: "The job was stopped from outside",
    FailureClass.SUCCESS: "The job finished",
    FailureClass.UNKNOWN: "The job failed for an unknown reason",
}


def _fix(c: Classification) -> str:
    d = c.details
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
            return _FIXES[FailureClass.HOST_OOM_KILL]
    if c.failure_class is FailureClass.CUDA_ERROR:
        if d.get("hardware"):
            gpu = c.gpu or "the GPU"
            return (
                f"Drain {gpu}: check nvidia-smi -q -d ECC,ROW_REMAPPER, reset it "
                "(nvidia-smi -r) or have it replaced; trainmedic leaves it out of "
                "CUDA_VISIBLE_DEVICES on the next attempt when it knows which GPU it is."
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
    return _FIXES[c.failure_class]


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
        title=f"{_TITLES[c.failure_class]}: {c.why}",
        evidence=evidence,
        fix=_fix(c),
        impact=None,
        subject=subject,
    )
