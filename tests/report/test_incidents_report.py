"""Incidents and goodput in the terminal and HTML reports, and as findings of a run."""

from __future__ import annotations

import io

from rich.console import Console

from support import builders
from trainmedic.diagnose import diagnose_run
from trainmedic.record.types import RunEvent, RunRecord
from trainmedic.report.html import render_html_report
from trainmedic.report.incidents import incidents_html, render_incidents
from trainmedic.resilience.incidents import AttemptSummary, attempt_event

T0 = 1_700_000_000.0


def make_record(*attempts: AttemptSummary) -> RunRecord:
    return builders.make_record(
        ended_at=T0 + 100.0,
        events=[attempt_event(a, a.ended_at) for a in attempts]
        + [RunEvent(T0 + 1, "process_start", "process 1: train.py", 1)],
    )


HANG = AttemptSummary(
    number=1,
    started_at=T0,
    ended_at=T0 + 40.0,
    failure_class="hang",
    category="timeout",
    why="the watchdog saw no progress",
    action="restart 1 after hang in 5 s",
    restarted=True,
    exit_code=-15,
    first_step_start=T0 + 5,
    last_step_end=T0 + 25,
    hang_started_at=T0 + 25,
    detected_at=T0 + 37,
    steps=300,
    wait_s=5.0,
    hang={"summary": "hung in `dist.all_reduce` called from train.py:88 in main"},
)
DONE = AttemptSummary(
    number=2,
    started_at=T0 + 45.0,
    ended_at=T0 + 100.0,
    failure_class="success",
    category="timeout",
    why="the job exited with status 0",
    action="the job finished",
    restarted=False,
    exit_code=0,
    first_step_start=T0 + 50,
    last_step_end=T0 + 99,
    steps=700,
    resume_step=200,
)


def render(record: RunRecord) -> str:
    out = io.StringIO()
    render_incidents(Console(file=out, width=120, color_system=None), record)
    return out.getvalue()


def test_the_terminal_lists_each_incident_and_the_goodput() -> None:
    text = render(make_record(HANG, DONE))
    assert "#1 at 37.0 s: hang — hung in `dist.all_reduce` called from train.py:88 in main" in text
    assert "action: restart 1 after hang in 5 s" in text
    assert "#2 at 100.0 s: success — resumed at step 200" in text
    # Productive: 20 s in attempt 1, and 49 s of attempt 2 less 100 of 700 steps redone.
    assert "goodput: 62% of 100.0 s productive" in text
    assert "waiting to detect hangs 12.0 s" in text
    assert "backoff 5.0 s" in text


def test_a_run_without_incidents_shows_nothing() -> None:
    assert render(make_record(DONE)) == ""
    assert render(make_record()) == ""
    assert incidents_html(make_record(DONE)) == ""


def test_the_html_report_has_an_incidents_and_goodput_section() -> None:
    record = make_record(HANG, DONE)
    page = render_html_report(record, diagnose_run(record))
    assert '<h2 id="incidents">Incidents and goodput</h2>' in page
    assert "hung in `dist.all_reduce` called from train.py:88 in main" in page
    assert "<b>Goodput 62%</b>" in page


def test_a_restarted_run_is_diagnosed_with_its_incidents_and_never_as_healthy() -> None:
    ids = [f.id for f in diagnose_run(make_record(HANG, DONE))]
    assert "failure.hang" in ids and "restart.summary" in ids
    assert "run.healthy" not in ids
    assert not any(
        i.startswith(("failure.", "restart."))
        for i in (f.id for f in diagnose_run(make_record(DONE)))
    )
