"""A run's report as one self-contained HTML file that opens offline.

Layout: the run (command, duration, exit code) and its summary numbers, the
findings with their fixes, then plots over the run — step time split into
data wait / compute / other, throughput, GPU readings, CPU, disk and network —
and the run's events. plotly.js is embedded once in the page; each figure is
stored as JSON and drawn by one script at the end. Every string that comes
from the run or the findings is HTML-escaped. Plotted series are reduced to at
most :data:`~trainmedic.report.html_plots.MAX_POINTS` points per trace, so a day-long run
stays a few MB.
The plots are drawn by :mod:`trainmedic.report.html_plots`, the page around
them by :mod:`trainmedic.report.html_page`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainmedic.atomicfile import write_atomic
from trainmedic.findings.model import Finding, Severity, rank_findings
from trainmedic.record.ranks import RankStats
from trainmedic.record.stats import RunSummary, summarize
from trainmedic.record.types import RunRecord
from trainmedic.report.breakdown import bar_html, of_ranks, of_summary
from trainmedic.report.facts import facts, format_value
from trainmedic.report.fix_text import Known, fill
from trainmedic.report.html_page import render_page
from trainmedic.report.html_plots import Clock, gpu_section, host_section, step_section
from trainmedic.report.incidents import incidents_html
from trainmedic.report.ranks import ranks_html, ranks_of_record
from trainmedic.report.run_summary import (
    format_command,
    format_duration,
    format_exit_code,
    summary_rows,
)

#: most events listed in the page.
MAX_EVENTS_LISTED = 500

SEVERITY_COLOUR = {Severity.ERROR: "#c62828", Severity.WARNING: "#b26a00", Severity.INFO: "#1565c0"}


def write_html_report(
    record: RunRecord, findings: Sequence[Finding], path: Path, known: Known | None = None
) -> None:
    """Write the report of ``record`` and its ``findings`` to ``path`` (replaced atomically)."""
    page = render_html_report(record, findings, known)
    write_atomic(path, page)


def render_html_report(
    record: RunRecord, findings: Sequence[Finding], known: Known | None = None
) -> str:
    """The whole page as a string (see :func:`write_html_report`). Its first screen says
    what is wrong and what to do: the command, where a step's time goes, the findings
    with their fixes; the run's details and plots follow."""
    clock = Clock.of(record)
    figures: list[dict[str, Any]] = []
    summary = summarize(record)
    if known is None:
        known = Known(command=record.meta.command)
    sections = [
        _title(record),
        breakdown_html(summary, ranks_of_record(record), bool(record.loaders)),
        findings_html(findings, known),
        _header(record),
        _summary(summary),
        ranks_html(record),
        incidents_html(record),
        '<h2 id="plots">Over the run</h2>',
        step_section(record, clock, figures),
        gpu_section(record, clock, figures),
        host_section(record, clock, figures),
        _events(record, clock),
        _loaders(record),
    ]
    return render_page(f"trainmedic report — {_command(record)}", "\n".join(sections), figures)


# --- header, summary, findings ---------------------------------------------------------


def _title(record: RunRecord) -> str:
    meta = record.meta
    return (
        "<h1>trainmedic run report</h1>\n"
        f'<p class="lede"><code>{_e(_command(record))}</code> · {_e(format_duration(meta))} · '
        f"exit code {_e(format_exit_code(meta.exit_code))}</p>"
    )


def breakdown_html(s: RunSummary, ranks: Sequence[RankStats] = (), loader: bool = True) -> str:
    """Where a step's time goes: the job's bar, then one per rank."""
    job = of_summary(s, loader)
    bars = ([job] if job else []) + of_ranks(ranks, loader)
    if not bars:
        return ""
    return (
        '<section class="breakdowns"><h2 id="time">Where a step\'s time goes</h2>\n'
        + "\n".join(bar_html(b) for b in bars)
        + "</section>"
    )


def _header(record: RunRecord) -> str:
    meta = record.meta
    rows = [
        ("command", f"<code>{_e(_command(record))}</code>"),
        ("run", _e(meta.run_id)),
        ("directory", _e(meta.cwd)),
        ("started", _e(_utc(meta.started_at))),
        ("duration", _e(format_duration(meta))),
        ("exit code", _e(format_exit_code(meta.exit_code))),
        ("GPU backend", _e(meta.gpu_backend)),
        ("trainmedic", _e(meta.trainmedic_version or "unknown")),
    ]
    return '<h2 id="run">The run</h2>\n' + _table(rows, "meta")


def _summary(s: RunSummary) -> str:
    rows = [(k, _e(v)) for k, v in summary_rows(s)]
    return '<h2 id="summary">Summary</h2>\n' + _table(rows, "summary")


def findings_html(findings: Sequence[Finding], known: Known | None = None) -> str:
    """The findings section, ranked: each with its facts and its fix (``known`` fills
    the fix's placeholders), the full evidence behind a disclosure (escaped)."""
    ranked = rank_findings(findings)
    counts = {sev: sum(1 for f in ranked if f.severity is sev) for sev in Severity}
    head = (
        f'<h2 id="findings">Findings</h2>\n<p class="counts">'
        f"{counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
        f"{counts[Severity.INFO]} info</p>"
    )
    if not ranked:
        return head + '\n<p class="none">No findings.</p>'
    return head + "\n" + "\n".join(_finding(f, known) for f in ranked)


def _finding(f: Finding, known: Known | None) -> str:
    colour = SEVERITY_COLOUR[f.severity]
    impact = ""
    if f.impact is not None:
        share = "<1%" if f.impact < 0.005 else f"~{f.impact:.0%}"
        impact = f' <span class="impact">{_e(share)} of time</span>'
    subject = "" if f.subject is None else f' <span class="subject">{_e(f.subject)}</span>'
    parts = [
        f'<section class="finding sev-{f.severity.value}" style="border-left-color:{colour}">',
        f'<h3><span class="sev" style="background:{colour}">{f.severity.value.upper()}</span> '
        f"{_e(f.title)}{subject}{impact}</h3>",
    ]
    said = facts(f.id, f.evidence)
    if said:
        parts.append('<ul class="facts">' + "".join(f"<li>{_e(x)}</li>" for x in said) + "</ul>")
    if f.fix:
        parts.append(f'<p class="fix"><b>Fix:</b> {_e(fill(f.fix, known))}</p>')
    if f.detail:
        parts.append(f'<p class="detail">{_e(f.detail)}</p>')
    if f.evidence:
        rows = [(str(k), _e(format_value(str(k), v))) for k, v in f.evidence.items()]
        parts.append(
            f"<details><summary>all {len(f.evidence)} evidence values</summary>"
            + _table(rows, "evidence")
            + "</details>"
        )
    parts.append(f'<p class="id">{_e(f.category.value)} · <code>{_e(f.id)}</code></p>')
    parts.append("</section>")
    return "\n".join(parts)


# --- events and loaders ----------------------------------------------------------------


def _events(record: RunRecord, clock: Clock) -> str:
    head = '<h2 id="events">Events</h2>'
    if not record.events:
        return head + '\n<p class="empty">No events.</p>'
    rows = []
    for e in record.events[:MAX_EVENTS_LISTED]:
        data = ""
        if e.data:
            dumped = json.dumps(dict(e.data), indent=2, default=repr, ensure_ascii=False)
            data = f"<details><summary>details</summary><pre>{_e(dumped)}</pre></details>"
        rows.append(
            f"<tr><td>{clock.x(e.t):,.2f} {clock.unit}</td><td>{_e(e.kind)}</td>"
            f"<td>{'' if e.pid is None else e.pid}</td><td>{_e(e.message)}{data}</td></tr>"
        )
    more = len(record.events) - MAX_EVENTS_LISTED
    tail = f'<p class="note">{more:,} more events not listed.</p>' if more > 0 else ""
    return (
        f'{head}\n<table class="events"><thead><tr><th>time</th><th>kind</th><th>pid</th>'
        f"<th>message</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{tail}"
    )


def _loaders(record: RunRecord) -> str:
    if not record.loaders:
        return ""
    rows = []
    for info in record.loaders:
        cells = [
            str(info.pid),
            str(info.loader_id),
            str(info.num_workers),
            "?" if info.batch_size is None else str(info.batch_size),
            "yes" if info.pin_memory else "no",
            "default" if info.prefetch_factor is None else str(info.prefetch_factor),
            "yes" if info.persistent_workers else "no",
            info.dataset_type or "",
        ]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    heads = ["pid", "loader", "workers", "batch", "pin memory", "prefetch", "persistent", "dataset"]
    return (
        '<h2 id="loaders">DataLoaders</h2>\n<table class="loaders"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in heads)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


# --- small helpers ---------------------------------------------------------------------


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _table(rows: Sequence[tuple[str, str]], css: str) -> str:
    """Two-column table; values must already be escaped, keys are escaped here."""
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="{css}">{body}</table>'


def _command(record: RunRecord) -> str:
    return format_command(record.meta)


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
