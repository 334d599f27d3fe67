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

from trainmedic.findings.fixes import MICRO_BATCH_FIX, RESILIENT_DATA_FIX, SHM_FIX_WITH_WORKERS
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuRef as GpuRef
from trainmedic.gpu.types import GpuSample
from trainmedic.gpu.types import normalize_pci_bus_id as normalize_pci_bus_id
from trainmedic.gpu.visible import nvml_gpu_for_cuda_device, visible_entries
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
        visible_devices / device_order: the attempt's ``CUDA_VISIBLE_DEVICES``
            and ``CUDA_DEVICE_ORDER`` (``None``: unset), to tell which GPU a
            CUDA device ordinal in a message is.
        gpus: the machine's GPUs as last read (identities: index, UUID, PCI bus id).
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
    visible_devices: str | None = None
    device_order: str | None = None
    gpus: tuple[GpuSample, ...] = ()

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
        if faults.CUDA_OOM_RE.search(line):
            return _cuda_oom(base, lines, i, evidence)
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


def _cuda_oom(
    base: _Base, lines: Sequence[str], i: int, evidence: FailureEvidence
) -> Classification:
    details = faults.parse_cuda_oom(" ".join(lines[i : i + 3]))
    why = "CUDA ran out of memory"
    gpu: GpuRef | None = None
    if "requested_bytes" in details:
        # torch names the process's CUDA device; NVML and nvidia-smi number GPUs otherwise.
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
        where = f"CUDA device {device}"
        if found is not None:
            gpu = found.ref
            details["gpu_index"] = found.index
            where = f"GPU {found.index}"
            if device != found.index:
                where += f" (CUDA device {device})"
        why += (
            f" allocating {_human(details['requested_bytes'])} on {where} "
            f"with {_human(details['free_bytes'])} free of {_human(details['total_bytes'])}"
        )
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
    xid: faults.XidEvent | None
    lines: tuple[str, ...]
    reason: str

    @property
    def needs_attention(self) -> bool:
        """The GPU must be reset or drained (not only the job restarted)."""
        return self.xid is None or self.xid.verdict.hardware


_XID_RANK = {
    faults.XidAction.DRAIN_NODE: 3,
    faults.XidAction.RESET_GPU: 2,
    faults.XidAction.RESTART_APP: 1,
}


def _is_hardware_xid(event: faults.XidEvent) -> bool:
    """An Xid that explains a failure by the GPU: one the catalogue says needs a
    reset or a drained node, or a contained memory error (Xid 94). Informational
    codes (63, 92) and application faults (13, 31, 43) never do."""
    verdict = event.verdict
    return verdict.hardware or event.code in faults.HARDWARE_RESTART_CODES


def _hardware_evidence(evidence: FailureEvidence, lines: Sequence[str]) -> _Hardware | None:
    """Hardware Xids in the kernel log (or stderr), or faults the GPU sampler saw."""
    found: list[tuple[faults.XidEvent, str]] = []
    visible = _visible_buses(evidence)
    for line in [*evidence.kernel_log, *lines]:
        event = faults.parse_xid_line(line)
        if event is None or not _is_hardware_xid(event):
            continue
        if visible is not None and event.pci_bus_id is not None and event.pci_bus_id not in visible:
            continue  # a GPU the attempt could not see: not its failure
        found.append((event, line.strip()[:MAX_LINE_CHARS]))
    if found:
        # The most serious wins; among equals, the earliest.
        event, text = max(found, key=lambda f: _XID_RANK.get(f[0].verdict.action, 0))
        verdict = event.verdict
        gpu = _resolve_gpu(GpuRef(pci_bus_id=event.pci_bus_id), evidence.gpus)
        reason = f"Xid {event.code}: {event.detail or verdict.meaning}"
        return _Hardware(gpu=gpu, xid=event, lines=(text,), reason=reason)
    if evidence.gpu_faults:
        fault = evidence.gpu_faults[0]
        return _Hardware(gpu=fault.gpu, xid=None, lines=(), reason=fault.reason)
    return None


def _visible_buses(evidence: FailureEvidence) -> set[str] | None:
    """PCI bus ids of the GPUs the attempt could see; ``None`` when that cannot be told."""
    if evidence.visible_devices is None or not evidence.gpus:
        return None
    env = {"CUDA_VISIBLE_DEVICES": evidence.visible_devices}
    if evidence.device_order is not None:
        env["CUDA_DEVICE_ORDER"] = evidence.device_order
    count = len(visible_entries(env) or [])
    buses = set()
    for ordinal in range(count):
        found = nvml_gpu_for_cuda_device(ordinal, env, evidence.gpus)
        if found is None or found.pci_bus_id is None:
            return None
        buses.add(found.pci_bus_id)
    return buses


def _resolve_gpu(ref: GpuRef, gpus: Sequence[GpuSample]) -> GpuRef | None:
    """``ref`` with every identity the machine's GPUs know; ``None`` for an empty ref."""
    if ref.pci_bus_id is None and ref.uuid is None and ref.index is None:
        return None
    return next((g.ref for g in gpus if g.ref.same_gpu(ref)), ref)


def _with_hardware(
    base: _Base, specific: Classification | None, hw: _Hardware, what: str
) -> Classification:
    details: dict[str, Any] = dict(specific.details) if specific else {}
    details["hardware"] = hw.needs_attention
    if hw.xid is not None:
        details["xid"] = hw.xid.code
        details["xid_action"] = hw.xid.verdict.action.value
        details["xid_detail"] = hw.xid.detail[:MAX_LINE_CHARS]
        if hw.xid.gpu_instance is not None:
            details["mig_gpu_instance"] = hw.xid.gpu_instance
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
    if _is_broken_pipe(exc_type, message):
        # Its own stdout's reader went away (`| head`), or a pipe or socket it
        # wrote to: a local fact, never evidence of another rank.
        return base.make(
            FailureClass.USER_EXCEPTION,
            Category.TIMEOUT,
            "high" if confidence == "high" else "medium",
            f"uncaught {exc_type}: {_first_line(message)} (the process wrote to a pipe or "
            "socket whose reader had gone, such as its output piped into `head`)",
            shown,
            location=location,
            details=details,
        )
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


def _is_broken_pipe(exc_type: str, message: str) -> bool:
    """``BrokenPipeError``, or an ``OSError`` with errno 32 (EPIPE)."""
    return exc_type.rsplit(".", 1)[-1] == "BrokenPipeError" or (
        exc_type.rsplit(".", 1)[-1] in ("OSError", "IOError") and message.startswith("[Errno 32]")
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
        "is large. " + MICRO_BATCH_FIX
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
        "Reproduce with num_workers=0 to see the dataset's own error. " + RESILIENT_DATA_FIX
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


_LEAVE_OUT = (
    " trainmedic leaves it out of CUDA_VISIBLE_DEVICES on the next attempt when it knows "
    "which GPU it is."
)


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
