"""The attempts of a run for a person: each incident and where the time went.

Shared by the terminal summary (``run``, ``report``) and the HTML report, so
both list the same incidents — when, class, evidence, action taken — and the
same goodput split (:mod:`trainmedic.resilience.goodput`).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from trainmedic.record.types import RunRecord
from trainmedic.resilience.goodput import Goodput
from trainmedic.resilience.incidents import AttemptSummary, attempts_from_events, goodput_of

GOODPUT_PARTS = (
    ("productive", "productive steps", "#2e7d32"),
    ("startup", "start-up", "#90a4ae"),
    ("redone", "redone work", "#ef6c00"),
    ("lost", "lost in the failed step", "#c62828"),
    ("detect", "waiting to detect hangs", "#ad1457"),
    ("restart", "restarting", "#6a1b9a"),
    ("backoff", "backoff", "#1565c0"),
    ("other", "other", "#cfd8dc"),
)
"""(key, label, colour) of each part of the goodput split."""


def run_attempts(record: RunRecord) -> tuple[list[AttemptSummary], Goodput | None]:
    """The run's attempts and goodput; ``([], None)`` for a run recorded without them."""
    attempts = attempts_from_events(record.events)
    if not attempts:
        return [], None
    return attempts, goodput_of(attempts, record.meta.started_at, record.meta.ended_at)


def has_incidents(attempts: Sequence[AttemptSummary]) -> bool:
    return any(not a.succeeded for a in attempts)


def incident_rows(attempts: Sequence[AttemptSummary], t0: float) -> list[tuple[str, ...]]:
    """(attempt, when, class, evidence, action) per attempt, times from the run's start."""
    rows: list[tuple[str, ...]] = []
    for a in attempts:
        ended = a.detected_at if a.detected_at is not None else a.ended_at
        evidence = a.hang.get("summary") if a.hang else None
        evidence = str(evidence or a.why)
        if a.resume_step is not None and a.number > 1:
            evidence = f"resumed at step {a.resume_step}; " + evidence
        rows.append(
            (
                str(a.number),
                f"{ended - t0:,.1f} s",
                a.failure_class,
                evidence,
                a.action,
            )
        )
    return rows


def goodput_rows(g: Goodput) -> list[tuple[str, float, float, str]]:
    """(label, seconds, share of the wall time, colour) for each part of the split."""
    wall = g.wall_s or 1.0
    values = {
        "productive": g.productive_s,
        "startup": g.startup_s,
        "redone": g.redone_s,
        "lost": g.lost_s,
        "detect": g.detect_s,
        "restart": g.restart_s,
        "backoff": g.backoff_s,
        "other": g.other_s,
    }
    return [
        (label, values[key], values[key] / wall, colour) for key, label, colour in GOODPUT_PARTS
    ]


# --- terminal ----------------------------------------------------------------------------


def render_incidents(console: Console, record: RunRecord) -> None:
    """Print the incidents and the goodput split when the run had any incident."""
    attempts, goodput = run_attempts(record)
    if goodput is None or not has_incidents(attempts):
        return
    console.print(Text("incidents", style="bold underline"))
    for number, when, cls, evidence, action in incident_rows(attempts, record.meta.started_at):
        line = Text(f"  #{number} at {when}: ", style="dim")
        line.append(cls, style="bold" if cls != "success" else "green")
        line.append(f" — {evidence}")
        console.print(line)
        console.print(Text(f"      action: {action}", style="dim"))
    console.print(
        Text(
            f"goodput: {goodput.share:.0%} of {goodput.wall_s:,.1f} s productive",
            style="bold",
        )
    )
    parts = [f"{label} {sec:,.1f} s" for label, sec, _, _ in goodput_rows(goodput) if sec]
    console.print(Text("  " + " · ".join(parts), style="dim"))
    if not goodput.redone_known:
        console.print(
            Text(
                "  (redone work unknown for attempts whose resume step was not reported: "
                "use trainmedic.Checkpointer or --checkpoint-glob)",
                style="dim",
            )
        )


# --- HTML --------------------------------------------------------------------------------


def incidents_html(record: RunRecord) -> str:
    """The HTML section (empty when the run had no incident)."""
    attempts, goodput = run_attempts(record)
    if goodput is None or not has_incidents(attempts):
        return ""
    t0 = record.meta.started_at
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in incident_rows(attempts, t0)
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0))
    table = (
        '<table class="incidents"><thead><tr><th>attempt</th><th>when</th><th>class</th>'
        f"<th>evidence</th><th>action</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    bar = "".join(
        f'<span title="{html.escape(label)}: {seconds:,.1f} s ({share:.0%})" '
        f'style="display:inline-block;height:18px;width:{share * 100:.2f}%;'
        f'background:{colour}"></span>'
        for label, seconds, share, colour in goodput_rows(goodput)
        if share > 0
    )
    split = "".join(
        f'<tr><td><span style="color:{colour}">&#9632;</span> {html.escape(label)}</td>'
        f"<td>{seconds:,.1f} s</td><td>{share:.1%}</td></tr>"
        for label, seconds, share, colour in goodput_rows(goodput)
    )
    note = (
        ""
        if goodput.redone_known
        else '<p class="note">Redone work is unknown for attempts whose resume step was not '
        "reported (use trainmedic.Checkpointer or --checkpoint-glob).</p>"
    )
    return (
        '<h2 id="incidents">Incidents and goodput</h2>\n'
        f'<p class="counts">{len(attempts)} attempt(s) from {started} UTC; times from the '
        f"run's start.</p>\n{table}\n"
        f"<p><b>Goodput {goodput.share:.0%}</b> of {goodput.wall_s:,.1f} s</p>\n"
        f'<div style="width:100%;border:1px solid #ccc">{bar}</div>\n'
        f'<table class="summary"><tbody>{split}</tbody></table>{note}'
    )
