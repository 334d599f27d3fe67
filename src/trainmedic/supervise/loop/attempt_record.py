"""What one attempt was and what is recorded of it.

:class:`Attempt` is the state of one attempt as the restart loop fills it in
(its job, the hang's forensics, how it was stopped); :func:`summarise` turns
it, its classification and the policy's decision into the
:class:`~trainmedic.resilience.incidents.AttemptSummary` that becomes the
``attempt_end`` event and ``attempts/<n>/attempt.json``
(:func:`write_attempt_file`, atomic and private); :func:`finding_for` adds
what a person needs to act (the traceback of a bug, the stacks of a hang).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmedic.atomicfile import write_atomic
from trainmedic.findings.model import Finding
from trainmedic.record.events import EventKind
from trainmedic.record.payloads import HangDetected
from trainmedic.record.types import RunEvent
from trainmedic.resilience.classify import Classification, classification_to_finding
from trainmedic.resilience.errorfile import ErrorReport, read_error_reports
from trainmedic.resilience.group import StoppedRank
from trainmedic.resilience.incidents import HANG_DETECTED, AttemptSummary
from trainmedic.resilience.policy import Decision
from trainmedic.resilience.silence_evidence import JobEvidence
from trainmedic.resilience.timeouts import StepTimeout, TimeoutVerdict
from trainmedic.supervise.hang.forensics import HangForensics
from trainmedic.supervise.hang.watchdog import AttemptObservations
from trainmedic.supervise.launch.launcher import Job
from trainmedic.supervise.launch.stop import StopReport
from trainmedic.supervise.loop.resume import ResumePoint

ATTEMPTS_DIR = "attempts"
ATTEMPT_FILE = "attempt.json"
STACKS_FILE = "stacks.txt"


@dataclass
class Attempt:
    """One attempt, as the restart loop learns about it."""

    number: int
    argv: tuple[str, ...]
    env: dict[str, str]
    timeout: StepTimeout
    resume: ResumePoint | None
    started_wall: float
    started_mono: float
    job: Job | None = None
    launch_error: str | None = None
    hang: HangForensics | None = None
    verdict: TimeoutVerdict | None = None
    evidence: JobEvidence | None = None
    detected_wall: float | None = None
    first_stopped: StoppedRank | None = None
    stop: StopReport | None = None
    stopped_by_us: bool = False


def summarise(
    attempt: Attempt,
    c: Classification,
    decision: Decision,
    obs: AttemptObservations,
    returncode: int,
    ended_wall: float,
    *,
    finding: Finding | None,
    directory: Path,
    run_dir: Path,
) -> AttemptSummary:
    """The attempt's summary: its class, the decision taken, its steps, hang and stop.

    Args:
        finding: the failure's finding (``None`` for a success).
        directory: the attempt's directory, inside ``run_dir``.
    """
    remedies = [
        {
            "name": r.name,
            "reason": r.reason,
            "set_env": dict(r.set_env),
            "unset_env": list(r.unset_env),
        }
        for r in decision.remedies
    ]
    resume_step = obs.resume_step
    if resume_step is None and attempt.resume is not None:
        resume_step = attempt.resume.step
    return AttemptSummary(
        number=attempt.number,
        started_at=attempt.started_wall,
        ended_at=max(ended_wall, attempt.started_wall),
        failure_class=c.failure_class.value,
        category=c.category.value,
        why=c.why,
        action=decision.reason,
        restarted=decision.restart,
        exit_code=None if attempt.job is None else returncode,
        finding=None if finding is None else finding.to_dict(),
        wait_s=round(decision.wait_s, 3),
        remedies=tuple(remedies),
        steps=obs.steps,
        resume_step=resume_step,
        first_step_start=obs.first_step_start,
        last_step_end=obs.last_step_end,
        hang_started_at=None
        if attempt.verdict is None or attempt.detected_wall is None
        else attempt.detected_wall - attempt.verdict.quiet_s,
        detected_at=attempt.detected_wall,
        hang=_hang_data(attempt, directory, run_dir),
        resumed_from=None if attempt.resume is None else str(attempt.resume.path),
        stop=_stop_data(attempt.stop),
    )


def _hang_data(attempt: Attempt, directory: Path, run_dir: Path) -> dict[str, Any] | None:
    if attempt.hang is None or attempt.verdict is None:
        return None
    hang = {
        "summary": attempt.hang.summary,
        "location": attempt.hang.location,
        "directory": str(directory.relative_to(run_dir)),
        "files": list(attempt.hang.files),
        "bound_s": round(attempt.verdict.bound_s, 3),
        "basis": attempt.verdict.basis,
        "detected_after_s": round(attempt.verdict.quiet_s, 3),
        "reason": attempt.verdict.reason,
        **{k.removeprefix("hang_"): v for k, v in hang_evidence(attempt).items()},
    }
    if attempt.first_stopped is not None:
        hang["first_stopped"] = attempt.first_stopped.to_data()
    return hang


def _stop_data(s: StopReport | None) -> dict[str, Any]:
    if s is None:
        return {}
    return {
        "took_s": round(s.took_s, 3),
        "terminated": list(s.terminated),
        "killed": list(s.killed),
        "survivors": list(s.survivors),
    }


def job_start_event(attempt: Attempt, pid: int, t: float) -> RunEvent:
    """The ``job_start`` event: the attempt's command line, checkpoint and timeout growth."""
    number = attempt.number
    return RunEvent(
        t=t,
        kind=EventKind.JOB_START,
        message=f"job started as pid {pid}" + (f" (attempt {number})" if number > 1 else ""),
        pid=pid,
        data={
            "attempt": number,
            "argv": list(attempt.argv),
            "resume": None if attempt.resume is None else str(attempt.resume.path),
            "timeout_growth": round(attempt.timeout.growth, 3),
        },
    )


def hang_event(
    attempt: Attempt, verdict: Mapping[str, Any], directory: Path, run_dir: Path, pid: int
) -> RunEvent:
    """The ``hang_detected`` event: the verdict, where the job hung and the forensics taken
    (``verdict``: :func:`verdict_data`, with ``first_stopped`` in a distributed job)."""
    assert attempt.hang is not None and attempt.detected_wall is not None
    v = attempt.verdict
    payload = HangDetected(
        attempt=attempt.number,
        reason=None if v is None else v.reason,
        basis=None if v is None else v.basis,
        bound_s=None if v is None else v.bound_s,
        silent_s=None if v is None else v.silent_s,
        quiet_s=None if v is None else v.quiet_s,
        extended=v is not None and v.extended,
        silence=None if v is None else v.silence,
        location=attempt.hang.location,
        directory=str(directory.relative_to(run_dir)),
        files=tuple(attempt.hang.files),
        notes=tuple(attempt.hang.notes),
        forensics_s=attempt.hang.took_s,
        evidence=verdict.get("evidence"),
        first_stopped=verdict.get("first_stopped"),
    )
    return RunEvent(
        t=attempt.detected_wall,
        kind=HANG_DETECTED,
        message=f"attempt {attempt.number} {attempt.hang.summary}",
        pid=pid,
        data=payload.to_data(),
    )


def finding_for(
    c: Classification, attempt: Attempt, action: str, directory: Path, run_dir: Path
) -> Finding:
    """The failure's finding, with the policy's action and the detail to act on."""
    finding = classification_to_finding(c, attempt=attempt.number, action=action)
    return _with_detail(finding, c, attempt, directory, run_dir)


def write_attempt_file(directory: Path, summary: AttemptSummary) -> None:
    """Write ``attempt.json`` (atomic, private); drop an empty stacks file."""
    stacks = directory / STACKS_FILE
    if stacks.exists() and stacks.stat().st_size == 0:
        stacks.unlink()  # no process was asked for its stacks
    write_atomic(directory / ATTEMPT_FILE, _json(summary.to_data()))


def _json(data: Mapping[str, Any]) -> str:
    return json.dumps(dict(data), indent=1, default=repr) + "\n"


def steps_reached(number: int, obs: AttemptObservations, resume: ResumePoint | None) -> int | None:
    """The furthest step of the run the attempt reached (see ``AttemptRecord``);
    ``None`` when a later attempt's starting step is unknown (its own count of
    steps says nothing about how far the run got)."""
    start = obs.resume_step
    if start is None and resume is not None:
        start = resume.step
    if start is None and number == 1:
        start = 0
    if start is None:
        return None
    return obs.steps + start


def verdict_data(v: TimeoutVerdict, evidence: JobEvidence | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "reason": v.reason,
        "basis": v.basis,
        "bound_s": round(v.bound_s, 3),
        "silent_s": round(v.silent_s, 3),
        "quiet_s": round(v.quiet_s, 3),
        "extended": v.extended,
        "silence": v.silence,
    }
    if evidence is not None:
        data["evidence"] = evidence.to_data()
    return data


def hang_evidence(attempt: Attempt) -> dict[str, Any]:
    """The hang's class, source and deciding evidence (:class:`FailureEvidence` fields)."""
    if attempt.verdict is None:
        return {}
    e = attempt.evidence
    silence = attempt.verdict.silence
    return {
        "hang_silence": silence,
        "hang_source": e.source if e is not None and silence == e.silence.value else None,
        "hang_evidence": e.why if e is not None and silence == e.silence.value else None,
    }


def trained_s(obs: AttemptObservations) -> float | None:
    if obs.first_step_start is None or obs.last_step_end is None:
        return None
    return max(0.0, obs.last_step_end - obs.first_step_start)


def _with_detail(
    finding: Finding, c: Classification, attempt: Attempt, directory: Path, run_dir: Path
) -> Finding:
    """Add what a person needs to act: the traceback of a bug, the stacks of a hang."""
    rel = directory.relative_to(run_dir)
    evidence = dict(finding.evidence)
    detail = finding.detail
    if attempt.hang is not None:
        evidence["hang_summary"] = attempt.hang.summary
        evidence["forensics"] = [str(rel / f) for f in attempt.hang.files]
        notes = "; ".join(attempt.hang.notes)
        detail = attempt.hang.summary + (f" ({notes})" if notes else "")
        stopped = attempt.first_stopped
        if stopped is not None:
            # A distributed job hangs as a group: the rank the others wait on.
            evidence["rank"] = stopped.rank
            evidence["first_stopped"] = stopped.to_data()
            detail += (
                f"; the group waited on rank {stopped.rank} (pid {stopped.pid}), which "
                f"stopped first: {stopped.why}"
            )
    else:
        trace = _traceback(c, attempt, directory)
        if trace:
            detail = trace
    return dataclasses.replace(finding, evidence=evidence, detail=detail)


def _traceback(c: Classification, attempt: Attempt, directory: Path) -> str | None:
    """The root error file's traceback (last 40 lines), for exceptions."""
    reports: list[ErrorReport] = read_error_reports(directory / "errors")
    if not reports:
        return None
    pid = c.details.get("pid")
    chosen = next((r for r in reports if r.pid == pid), reports[0])
    if not chosen.traceback:
        return None
    return "\n".join(chosen.traceback.rstrip().splitlines()[-40:])
