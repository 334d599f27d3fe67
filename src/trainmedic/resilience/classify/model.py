"""The vocabulary of failure classification: what the supervisor gathers about
an ended attempt (:class:`FailureEvidence`), the classes it can end in
(:class:`FailureClass`) and the verdict (:class:`Classification`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from trainmedic.findings.model import Category
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuRef, GpuSample
from trainmedic.ostext import signal_name
from trainmedic.resilience.errorfile import ErrorReport

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
        xids: the Xids reported as data during the attempt (the Xid watch's: NVML
            events, which any user can read where the kernel log is closed, and the
            kernel log's own); judged with the kernel log's.
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
    xids: tuple[faults.XidEvent, ...] = ()
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
        return None if self.signal is None else signal_name(self.signal)


@dataclass(frozen=True)
class Base:
    """What every classification of one attempt shares: its exit status and the
    signal that ended it (from the status or a launcher's summary)."""

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
        """A classification of this attempt; blank evidence lines are dropped, the
        others cut to :data:`MAX_LINE_CHARS` and only the last
        :data:`MAX_EVIDENCE_LINES` kept."""
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
