"""Incidents: the attempts of a run as the record keeps them, and the findings they give.

The supervisor writes one ``attempt_end`` event per attempt into the run
record (docs/run-record.md, "Attempts"); its ``data`` is
:meth:`AttemptSummary.to_data`. Everything here reads those events back, so
``trainmedic report`` shows the same incidents and goodput as the run did:

* :func:`attempts_from_events` — the attempts, in order;
* :func:`goodput_of` — :class:`~trainmedic.resilience.goodput.Goodput` of the run;
* :func:`incident_findings` — one finding per failed attempt (its class's
  category, evidence, the action taken) and, once the job was restarted, one
  for the run's restarts and goodput. A run that succeeded at the first
  attempt gets none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent
from trainmedic.resilience.goodput import AttemptTimes, Goodput, compute_goodput

ATTEMPT_START = "attempt_start"
ATTEMPT_END = EventKind.ATTEMPT_END
HANG_DETECTED = EventKind.HANG_DETECTED
REMEDY = EventKind.REMEDY
SUCCESS = "success"


@dataclass(frozen=True)
class AttemptSummary:
    """One attempt as the run record keeps it (times in Unix seconds).

    Attributes:
        number: 1-based attempt number.
        failure_class: the class of :mod:`~trainmedic.resilience.classify`
            (``success`` for a clean exit).
        category: the root cause's category.
        why: one sentence of evidence.
        finding: the failure's finding (:meth:`Finding.to_dict`), ``None`` on success.
        action: what the restart policy decided, in words.
        restarted: whether another attempt followed.
        wait_s: backoff before the next attempt.
        remedies: ``{"name", "reason", "set_env", "unset_env"}`` for the next attempt.
        exit_code: the job's return code (negative: signal).
        steps: training steps completed; ``resume_step`` where it resumed.
        hang: the hang's summary, location, files and verdict, when it hung.
        resumed_from: the checkpoint given to the attempt (``--resume-args``).
    """

    number: int
    started_at: float
    ended_at: float
    failure_class: str
    category: str
    why: str
    action: str
    restarted: bool
    exit_code: int | None = None
    finding: Mapping[str, Any] | None = None
    wait_s: float = 0.0
    remedies: tuple[Mapping[str, Any], ...] = ()
    steps: int = 0
    resume_step: int | None = None
    first_step_start: float | None = None
    last_step_end: float | None = None
    hang_started_at: float | None = None
    detected_at: float | None = None
    hang: Mapping[str, Any] | None = None
    resumed_from: str | None = None
    stop: Mapping[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.failure_class == SUCCESS

    def times(self) -> AttemptTimes:
        return AttemptTimes(
            started_at=self.started_at,
            ended_at=self.ended_at,
            first_step_start=self.first_step_start,
            last_step_end=self.last_step_end,
            hang_started_at=self.hang_started_at,
            detected_at=self.detected_at,
            steps=self.steps,
            resume_step=self.resume_step,
            wait_s=self.wait_s,
            succeeded=self.succeeded,
        )

    def to_data(self) -> dict[str, Any]:
        """The event's ``data`` (JSON-ready; ``None`` fields left out)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is None or value == () or value == {}:
                continue
            if isinstance(value, tuple):
                value = [dict(v) if isinstance(v, Mapping) else v for v in value]
            elif isinstance(value, Mapping):
                value = dict(value)
            out[name] = value
        return out

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> AttemptSummary:
        """Inverse of :meth:`to_data`; raises ``KeyError``/``TypeError``/``ValueError``."""

        def opt_float(key: str) -> float | None:
            v = data.get(key)
            return None if v is None else float(v)

        def opt_int(key: str) -> int | None:
            v = data.get(key)
            return None if v is None else int(v)

        return cls(
            number=int(data["number"]),
            started_at=float(data["started_at"]),
            ended_at=float(data["ended_at"]),
            failure_class=str(data["failure_class"]),
            category=str(data.get("category", Category.TIMEOUT.value)),
            why=str(data.get("why", "")),
            action=str(data.get("action", "")),
            restarted=bool(data.get("restarted", False)),
            exit_code=opt_int("exit_code"),
            finding=data.get("finding"),
            wait_s=float(data.get("wait_s", 0.0)),
            remedies=tuple(dict(r) for r in data.get("remedies", ())),
            steps=int(data.get("steps", 0)),
            resume_step=opt_int("resume_step"),
            first_step_start=opt_float("first_step_start"),
            last_step_end=opt_float("last_step_end"),
            hang_started_at=opt_float("hang_started_at"),
            detected_at=opt_float("detected_at"),
            hang=data.get("hang"),
            resumed_from=data.get("resumed_from"),
            stop=dict(data.get("stop") or {}),
        )


def attempt_event(summary: AttemptSummary, t: float) -> RunEvent:
    """The ``attempt_end`` event of ``summary``."""
    return RunEvent(
        t=t,
        kind=ATTEMPT_END,
        message=f"attempt {summary.number}: {summary.failure_class} — {summary.action}",
        data=summary.to_data(),
    )


def attempts_from_events(events: Iterable[RunEvent]) -> list[AttemptSummary]:
    """The attempts recorded in ``events``, by number; unreadable ones are skipped."""
    out: dict[int, AttemptSummary] = {}
    for e in events:
        if e.kind != ATTEMPT_END:
            continue
        try:
            a = AttemptSummary.from_data(e.data)
        except (KeyError, TypeError, ValueError):
            continue
        out[a.number] = a
    return [out[n] for n in sorted(out)]


def goodput_of(
    attempts: Sequence[AttemptSummary], run_started_at: float, run_ended_at: float | None
) -> Goodput:
    end = run_ended_at if run_ended_at is not None else (attempts[-1].ended_at if attempts else 0)
    start = min([run_started_at, *(a.started_at for a in attempts)])
    return compute_goodput([a.times() for a in attempts], start, end)


def incident_findings(
    attempts: Sequence[AttemptSummary], run_started_at: float, run_ended_at: float | None
) -> list[Finding]:
    """The failed attempts' findings and the run's restart summary (see module docstring)."""
    failed = [a for a in attempts if not a.succeeded]
    if not failed:
        return []
    findings = [_attempt_finding(a, ended_the_job=a is attempts[-1]) for a in failed]
    if len(attempts) > 1:
        # One attempt that failed was never restarted: its own finding says why
        # (the policy's action), and "stopped restarting" would only repeat it.
        goodput = goodput_of(attempts, run_started_at, run_ended_at)
        findings.append(_summary_finding(attempts, goodput))
    return findings


def _attempt_finding(a: AttemptSummary, ended_the_job: bool = False) -> Finding:
    """``ended_the_job``: the run's last attempt, which failed: the job never got past it,
    so its failure costs the rest of the training (impact 1) and outranks any slowness
    measured before it (the slow steps of a job that then hung are the lesser matter)."""
    if a.finding is not None:
        try:
            base = Finding.from_dict(a.finding)
        except (KeyError, TypeError, ValueError):
            base = None
    else:
        base = None
    if base is None:
        base = Finding(
            id=f"failure.{a.failure_class}",
            category=_category(a.category),
            severity=Severity.ERROR,
            title=a.why,
        )
    evidence = dict(base.evidence)
    evidence["attempt"] = a.number
    evidence["action"] = a.action
    if a.remedies:
        evidence["remedies"] = [str(r.get("name")) for r in a.remedies]
    if a.hang is not None:
        for key in ("summary", "bound_s", "basis", "detected_after_s", "directory"):
            if a.hang.get(key) is not None:
                evidence[f"hang_{key}"] = a.hang[key]
    subject = (
        f"attempt {a.number}" if base.subject is None else f"{base.subject}, attempt {a.number}"
    )
    return Finding(
        id=base.id,
        category=base.category,
        severity=base.severity,
        title=base.title,
        evidence=evidence,
        fix=base.fix,
        impact=1.0 if ended_the_job and base.impact is None else base.impact,
        subject=subject,
        detail=base.detail,
    )


def _summary_finding(attempts: Sequence[AttemptSummary], g: Goodput) -> Finding:
    last = attempts[-1]
    restarts = len(attempts) - 1
    classes = ", ".join(a.failure_class for a in attempts if not a.succeeded)
    if last.succeeded:
        severity = Severity.INFO
        title = (
            f"The job finished after {restarts} restart(s) ({classes}); "
            f"goodput {g.share:.0%} of {g.wall_s:.0f} s"
        )
        fix = "Fix the root cause in the findings above; each restart cost time."
    else:
        severity = Severity.ERROR
        title = f"trainmedic stopped restarting after {len(attempts)} attempt(s): {last.action}"
        fix = (
            "Fix the root cause in the findings above, then run again: the job resumes "
            "from its last checkpoint."
        )
    evidence: dict[str, Any] = {"attempts": len(attempts), "restarts": restarts}
    evidence.update(g.as_evidence())
    cost = g.redone_s + g.lost_s + g.detect_s + g.restart_s + g.backoff_s
    lost = cost / g.wall_s if g.wall_s > 0 else None
    return Finding(
        id="restart.summary",
        category=Category.TIMEOUT,
        severity=severity,
        title=title,
        evidence=evidence,
        fix=fix,
        impact=None if lost is None else min(1.0, max(0.0, lost)),
    )


def _category(value: str) -> Category:
    try:
        return Category(value)
    except ValueError:
        return Category.TIMEOUT
