"""Incidents: attempts kept as run-record events, and the findings they give."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainmedic.findings.model import Category, Finding, Severity, rank_findings
from trainmedic.record.types import RunEvent
from trainmedic.resilience.incidents import (
    AttemptSummary,
    attempt_event,
    attempts_from_events,
    incident_findings,
)


def make_attempt(number: int, failure_class: str = "hang", **changes: Any) -> AttemptSummary:
    fields: dict[str, Any] = {
        "number": number,
        "started_at": 100.0 * number,
        "ended_at": 100.0 * number + 50.0,
        "failure_class": failure_class,
        "category": "timeout",
        "why": f"attempt {number} {failure_class}",
        "action": "restart 1 after hang in 5 s" if failure_class != "success" else "finished",
        "restarted": failure_class != "success",
        "first_step_start": 100.0 * number + 5.0,
        "last_step_end": 100.0 * number + 30.0,
        "steps": 30,
    }
    if failure_class == "hang":
        fields |= {
            "hang_started_at": 100.0 * number + 30.0,
            "detected_at": 100.0 * number + 45.0,
            "hang": {"summary": "hung in `time.sleep` called from train.py:88 in main"},
            "finding": {
                "id": "failure.hang",
                "category": "timeout",
                "severity": "error",
                "title": "The job hung",
                "evidence": {"failure_class": "hang"},
                "fix": "Read the stacks.",
                "impact": None,
            },
        }
    fields.update(changes)
    return AttemptSummary(**fields)


def test_an_attempt_survives_the_trip_through_an_event() -> None:
    a = make_attempt(
        1,
        remedies=({"name": "micro_batch", "reason": "OOM", "set_env": {"X": "2"}},),
        resume_step=20,
    )
    event = attempt_event(a, t=160.0)
    assert event.kind == "attempt_end"
    assert attempts_from_events([event]) == [a]


def test_attempts_come_back_in_order_and_bad_ones_are_skipped() -> None:
    events = [
        attempt_event(make_attempt(2, "success"), 300.0),
        RunEvent(t=1.0, kind="attempt_end", message="broken", data={"number": "x"}),
        attempt_event(make_attempt(1), 160.0),
        RunEvent(t=2.0, kind="process_start", message="not an attempt"),
    ]
    assert [a.number for a in attempts_from_events(events)] == [1, 2]


def test_a_run_that_succeeded_at_once_has_no_incident() -> None:
    assert incident_findings([make_attempt(1, "success")], 100.0, 150.0) == []


def test_a_job_that_failed_once_and_was_not_restarted_has_no_restart_summary() -> None:
    last = make_attempt(1, restarted=False, action="hang is not restarted (--max-restarts 0)")
    (finding,) = incident_findings([last], 100.0, 150.0)
    assert finding.id == "failure.hang"
    assert finding.evidence["action"] == "hang is not restarted (--max-restarts 0)"
    # Restarted, then given up: the summary says so.
    gave_up = [make_attempt(1), replace(last, number=2)]
    assert [f.id for f in incident_findings(gave_up, 100.0, 250.0)][-1] == "restart.summary"


def test_each_failed_attempt_is_a_finding_with_its_action_and_the_run_a_summary() -> None:
    attempts = [make_attempt(1), make_attempt(2, "success", resume_step=30)]
    findings = incident_findings(attempts, 100.0, 250.0)
    assert [f.id for f in findings] == ["failure.hang", "restart.summary"]
    hang, summary = findings
    assert hang.subject == "attempt 1"
    assert hang.evidence["action"] == "restart 1 after hang in 5 s"
    assert hang.evidence["hang_summary"].startswith("hung in `time.sleep`")
    assert summary.severity is Severity.INFO
    assert summary.category is Category.TIMEOUT
    assert summary.evidence["restarts"] == 1
    assert summary.evidence["detect_s"] == 15.0
    assert 0.0 < summary.impact < 1.0  # type: ignore[operator]


def test_a_run_that_gave_up_says_why_as_an_error() -> None:
    last = make_attempt(2, action="not restarting after hang: hung 2 times at train.py:88")
    findings = incident_findings([make_attempt(1), last], 100.0, 250.0)
    summary = findings[-1]
    assert summary.severity is Severity.ERROR
    assert "hung 2 times" in summary.title


def test_an_attempt_without_a_stored_finding_still_gets_one() -> None:
    a = make_attempt(1, "segfault", category="timeout", finding=None, hang=None)
    finding = incident_findings([a], 100.0, 150.0)[0]
    assert finding.id == "failure.segfault"
    assert finding.severity is Severity.ERROR


def test_the_failure_that_ended_the_job_outranks_slowness_measured_before_it() -> None:
    # A hung job's steps before the hang were slow (an error at 54 %): the hang that
    # stopped the job is still what the user must read first.
    slow = Finding(id="host.python", category=Category.FRAMEWORK_CONFIG,
                   severity=Severity.ERROR, title="slow loop", impact=0.54)  # fmt: skip
    last = make_attempt(1, restarted=False, action="hang is not restarted (--max-restarts 0)")
    (hang,) = incident_findings([last], 100.0, 150.0)
    assert hang.impact == 1.0
    assert [f.id for f in rank_findings([slow, hang])] == ["failure.hang", "host.python"]
    # An attempt that was restarted, the job finishing after it, costs what the restart
    # summary says: not the whole run.
    restarted = incident_findings([make_attempt(1), make_attempt(2, "success")], 100.0, 250.0)
    assert restarted[0].impact is None
