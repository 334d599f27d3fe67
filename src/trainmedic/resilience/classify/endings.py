"""Endings without a specific message: a declared hang, a command that never
ran, an exit signal (OOM kill, preemption, crash, abort) and an uncaught
exception."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

from trainmedic.findings.model import Category
from trainmedic.ostext import signal_name
from trainmedic.resilience.classify.model import (
    Base,
    Classification,
    FailureClass,
    FailureEvidence,
)
from trainmedic.resilience.classify.patterns import (
    COMM_ERROR_RE,
    COMM_ERROR_TYPE_RE,
    KERNEL_OOM_PID_RE,
    KERNEL_OOM_RE,
)
from trainmedic.resilience.classify.text import first_line, last_frame, root_traceback, tail
from trainmedic.resilience.errorfile import ErrorReport

_HANG_WHAT = {
    "blocked": "every process was blocked (off the CPU, nothing moving)",
    "spinning": "the job spun in place (CPU busy, no work)",
    "peer_wait": "the job waited in a collective or a device synchronisation",
    "source_wait": "the job waited on a data source with nothing arriving",
    "unclear": "the evidence could not tell work from a hang",
}


def hang(base: Base, evidence: FailureEvidence, specific: Classification | None) -> Classification:
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


def bad_command(base: Base, evidence: FailureEvidence, lines: Sequence[str]) -> Classification:
    if evidence.launch_error:
        why = f"the command could not be started: {evidence.launch_error}"
        shown: list[str] = [evidence.launch_error]
    else:
        meaning = {126: "found but not executable", 127: "not found"}.get(
            evidence.exit_code or 0, "rejected its arguments"
        )
        why = f"the command was {meaning} (exit status {evidence.exit_code})"
        shown = tail(lines, 3)
    return base.make(FailureClass.BAD_COMMAND, Category.TIMEOUT, "high", why, shown)


def _kernel_oom(evidence: FailureEvidence) -> tuple[list[str], bool]:
    """OOM-killer lines in the kernel log, and whether one names a process of the job."""
    found, ours = [], False
    for line in evidence.kernel_log:
        if KERNEL_OOM_RE.search(line):
            found.append(line.strip())
            m = KERNEL_OOM_PID_RE.search(line)
            pid = next((int(g) for g in (m.groups() if m else ()) if g), None)
            if pid is not None and pid in evidence.job_pids:
                ours = True
    return found, ours


def from_signal(
    base: Base,
    evidence: FailureEvidence,
    lines: Sequence[str],
    signum: int | None,
    source: str,
) -> Classification | None:
    if signum is None:
        return None
    name = signal_name(signum)
    last = tail(lines, 3)
    if signum == signal.SIGKILL:
        oom_lines, ours = _kernel_oom(evidence)
        if evidence.oom_kill_delta:
            return base.make(
                FailureClass.HOST_OOM_KILL,
                Category.TIMEOUT,
                "high",
                f"SIGKILL ({source}) while the job's cgroup counted {evidence.oom_kill_delta} "
                "OOM kill(s): host memory ran out",
                [*oom_lines, *last],
                details={"oom_kill_delta": evidence.oom_kill_delta},
            )
        if oom_lines and (ours or not evidence.job_pids):
            return base.make(
                FailureClass.HOST_OOM_KILL,
                Category.TIMEOUT,
                "high" if ours else "medium",
                f"SIGKILL ({source}) and the kernel OOM killer logged a kill"
                + (" of a job process" if ours else ""),
                [*oom_lines, *last],
            )
        if evidence.terminated_by_supervisor:
            return base.make(
                FailureClass.PREEMPTED, Category.TIMEOUT, "high", "trainmedic stopped the job", last
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
            last,
        )
    if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        who = "trainmedic" if evidence.terminated_by_supervisor else "something outside the job"
        return base.make(
            FailureClass.PREEMPTED,
            Category.TIMEOUT,
            "high" if evidence.terminated_by_supervisor else "medium",
            f"{who} stopped the job with {name} ({source})",
            last,
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
            last,
            location=last_frame(lines),
        )
    if signum == signal.SIGABRT:
        return base.make(
            FailureClass.ABORT,
            Category.TIMEOUT,
            "medium",
            f"the process aborted with {name} ({source}): a C++ library called abort()",
            [line for line in lines if "terminate called" in line or "what():" in line] or last,
        )
    return None


def user_exception(
    base: Base, report: ErrorReport | None, lines: Sequence[str]
) -> Classification | None:
    if report is not None:
        exc_type, message = report.exc_type, report.message
        shown = [f"{exc_type}: {first_line(message)}"]
        location, confidence, pid = report.location, "high", report.pid
    else:
        block = root_traceback(lines)
        if block is None:
            return None
        exc_type, message, frames = block
        shown = [*frames[-2:], f"{exc_type}: {message}" if message else exc_type]
        location, confidence, pid = last_frame(frames), "medium", None
    details: dict[str, Any] = {"exception_type": exc_type}
    if pid is not None:
        details["pid"] = pid
    if exc_type.rsplit(".", 1)[-1] == "KeyboardInterrupt":
        # Ctrl-C (SIGINT) reached the job where Python raises it instead of dying by it
        # (during an import, in a child): a person stopped it - no bug, no restart.
        return base.make(
            FailureClass.PREEMPTED,
            Category.TIMEOUT,
            "medium",
            "the job was interrupted (SIGINT, Ctrl-C): its uncaught KeyboardInterrupt",
            shown,
            location=location,
            details=details,
        )
    if _is_broken_pipe(exc_type, message):
        # Its own stdout's reader went away (`| head`), or a pipe or socket it
        # wrote to: a local fact, never evidence of another rank.
        return base.make(
            FailureClass.USER_EXCEPTION,
            Category.TIMEOUT,
            "high" if confidence == "high" else "medium",
            f"uncaught {exc_type}: {first_line(message)} (the process wrote to a pipe or "
            "socket whose reader had gone, such as its output piped into `head`)",
            shown,
            location=location,
            details=details,
        )
    if COMM_ERROR_TYPE_RE.search(exc_type) or COMM_ERROR_RE.search(message):
        # A lost peer is not a bug in this process: usually another rank failed
        # first (its error file, when there is one, is the root cause).
        return base.make(
            FailureClass.UNKNOWN,
            Category.NETWORK,
            "medium",
            f"a distributed communication error ({exc_type}: {first_line(message)}); "
            "usually another rank failed first or the network between ranks dropped",
            shown,
            location=location,
            details=details,
        )
    return base.make(
        FailureClass.USER_EXCEPTION,
        Category.TIMEOUT,
        "high" if confidence == "high" else "medium",
        f"uncaught {exc_type}: {first_line(message)}",
        shown,
        location=location,
        details=details,
    )


def _is_broken_pipe(exc_type: str, message: str) -> bool:
    """``BrokenPipeError``, or an ``OSError`` with errno 32 (EPIPE)."""
    return exc_type.rsplit(".", 1)[-1] == "BrokenPipeError" or (
        exc_type.rsplit(".", 1)[-1] in ("OSError", "IOError") and message.startswith("[Errno 32]")
    )
