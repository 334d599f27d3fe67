"""A run's report as one self-contained HTML file that opens offline.

Layout: the run (command, duration, exit code) and its summary numbers, the
findings with their fixes, then plots over the run — step time split into
data wait / compute / other, throughput, GPU readings, CPU, disk and network —
and the run's events. plotly.js is embedded once in the page; each figure is
stored as JSON and drawn by one script at the end. Every string that comes
from the run or the findings is HTML-escaped. Plotted series are reduced to at
most :data:`MAX_POINTS` points per trace, so a day-long run stays a few MB.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainmedic.atomicfile import write_atomic
from trainmedic.findings.model import Finding, Severity, rank_findings
from trainmedic.record.stats import RunSummary, StepSpan, all_spans, summarize
from trainmedic.record.types import RunRecord
from trainmedic.report.incidents import incidents_html
from trainmedic.report.ranks import ranks_html
from trainmedic.report.run_summary import (
    format_command,
    format_duration,
    format_exit_code,
    summary_rows,
)
from trainmedic.report.terminal import format_evidence_value

#: most points in one plotted trace; longer series are averaged in buckets.
MAX_POINTS = 5000
#: most events listed in the page.
MAX_EVENTS_LISTED = 500

SEVERITY_COLOUR = {Severity.ERROR: "#c62828", Severity.WARNING: "#b26a00", Severity.INFO: "#1565c0"}
_GIB = 1024**3
_MB = 1e6


def write_html_report(record: RunRecord, findings: Sequence[Finding], path: Path) -> None:
    """Write the report of ``record`` and its ``findings`` to ``path`` (replaced atomically)."""
    page = render_html_report(record, findings)
    write_atomic(path, page)


def render_html_report(record: RunRecord, findings: Sequence[Finding]) -> str:
    """The whole page as a string (see :func:`write_html_report`)."""
    from plotly.offline import get_plotlyjs

    clock = _Clock.of(record)
    figures: list[dict[str, Any]] = []
    sections = [
        _header(record),
        _summary(summarize(record)),
        ranks_html(record),
        incidents_html(record),
        _findings(findings),
        '<h2 id="plots">Over the run</h2>',
        _step_section(record, clock, figures),
        _gpu_section(record, clock, figures),
        _host_section(record, clock, figures),
        _events(record, clock),
        _loaders(record),
    ]
    title = f"trainmedic report — {_command(record)}"
    return _PAGE.format(
        title=_e(title),
        style=_STYLE,
        error_hook=_ERROR_HOOK,
        plotlyjs=get_plotlyjs(),
        body="\n".join(sections),
        figures=_figures_json(figures),
        draw=_DRAW,
    )


# --- header, summary, findings ---------------------------------------------------------


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
    return "<h1>trainmedic run report</h1>\n" + _table(rows, "meta")


def _summary(s: RunSummary) -> str:
    rows = [(k, _e(v)) for k, v in summary_rows(s)]
    return '<h2 id="summary">Summary</h2>\n' + _table(rows, "summary")


def _findings(findings: Sequence[Finding]) -> str:
    ranked = rank_findings(findings)
    counts = {sev: sum(1 for f in ranked if f.severity is sev) for sev in Severity}
    head = (
        f'<h2 id="findings">Findings</h2>\n<p class="counts">'
        f"{counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
        f"{counts[Severity.INFO]} info</p>"
    )
    if not ranked:
        return head + '\n<p class="none">No findings.</p>'
    return head + "\n" + "\n".join(_finding(f) for f in ranked)


def _finding(f: Finding) -> str:
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
    if f.fix:
        parts.append(f'<p class="fix"><b>Fix:</b> {_e(f.fix)}</p>')
    if f.detail:
        parts.append(f'<p class="detail">{_e(f.detail)}</p>')
    if f.evidence:
        rows = [(str(k), _e(format_evidence_value(v))) for k, v in f.evidence.items()]
        parts.append(_table(rows, "evidence"))
    parts.append(f'<p class="id">{_e(f.category.value)} · <code>{_e(f.id)}</code></p>')
    parts.append("</section>")
    return "\n".join(parts)


# --- plots -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Clock:
    """Turns Unix seconds into elapsed time in a unit that suits the run's length."""

    t0: float
    divisor: float
    unit: str

    @classmethod
    def of(cls, record: RunRecord) -> _Clock:
        t0 = record.meta.started_at
        ends = [record.meta.ended_at or t0]
        ends += [s.t for s in record.steps[-1:]] + [w.t for w in record.windows[-1:]]
        ends += [g.timestamp for g in record.gpu[-1:]] + [h.t for h in record.host[-1:]]
        span = max(ends) - t0
        if span > 2 * 3600:
            return cls(t0, 3600.0, "h")
        if span > 120:
            return cls(t0, 60.0, "min")
        return cls(t0, 1.0, "s")

    def x(self, t: float) -> float:
        return round((t - self.t0) / self.divisor, 6)

    @property
    def title(self) -> str:
        return f"time since start ({self.unit})"


@dataclass(frozen=True)
class _StepPoint:
    """Consecutive spans merged into one plotted point (sums, seconds)."""

    t: float
    count: int
    duration: float
    wait: float
    compute: float | None
    samples: int | None


def _step_points(spans: Sequence[StepSpan], max_points: int) -> list[_StepPoint]:
    ordered = sorted(spans, key=lambda s: s.t_end)
    size = max(1, math.ceil(len(ordered) / max_points))
    points = []
    for i in range(0, len(ordered), size):
        group = ordered[i : i + size]
        count = sum(s.count for s in group)
        compute = [s.compute_s for s in group]
        samples = [s.samples for s in group]
        points.append(
            _StepPoint(
                t=sum(s.t_end * s.count for s in group) / count,
                count=count,
                duration=sum(s.duration_s for s in group),
                wait=sum(s.data_wait_s for s in group),
                compute=None if None in compute else sum(c for c in compute if c is not None),
                samples=None if None in samples else sum(n for n in samples if n is not None),
            )
        )
    return points


def _step_section(record: RunRecord, clock: _Clock, figures: list[dict[str, Any]]) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    spans = [s for s in all_spans(record) if s.count > 0]
    if not spans:
        return '<h3>Steps</h3>\n<p class="empty">No steps recorded.</p>'
    points = _step_points(spans, MAX_POINTS)
    x = [clock.x(p.t) for p in points]
    has_compute = all(p.compute is not None for p in points)
    wait_ms = [1000 * p.wait / p.count for p in points]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=("step time per step (ms)", "throughput per process"),
        specs=[[{}], [{"secondary_y": True}]],
    )
    fig.add_trace(
        go.Scatter(x=x, y=wait_ms, name="data wait", stackgroup="split", line={"width": 0.5}),
        row=1,
        col=1,
    )
    if has_compute:
        compute_ms = [1000 * (p.compute or 0.0) / p.count for p in points]
        other_ms = [
            max(0.0, 1000 * p.duration / p.count - w - c)
            for p, w, c in zip(points, wait_ms, compute_ms, strict=True)
        ]
        fig.add_trace(
            go.Scatter(x=x, y=compute_ms, name="compute", stackgroup="split", line={"width": 0.5}),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(x=x, y=other_ms, name="other", stackgroup="split", line={"width": 0.5}),
            row=1,
            col=1,
        )
    else:
        rest_ms = [
            max(0.0, 1000 * p.duration / p.count - w) for p, w in zip(points, wait_ms, strict=True)
        ]
        fig.add_trace(
            go.Scatter(
                x=x, y=rest_ms, name="compute and other", stackgroup="split", line={"width": 0.5}
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.count / p.duration if p.duration > 0 else None for p in points],
            name="steps/s",
            mode="lines",
        ),
        row=2,
        col=1,
    )
    if any(p.samples is not None for p in points):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[
                    p.samples / p.duration if p.samples is not None and p.duration > 0 else None
                    for p in points
                ],
                name="samples/s",
                mode="lines",
            ),
            row=2,
            col=1,
            secondary_y=True,
        )
        fig.update_yaxes(title_text="samples/s", row=2, col=1, secondary_y=True)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="steps/s", row=2, col=1, secondary_y=False)
    fig.update_xaxes(title_text=clock.title, row=2, col=1)
    _add_event_marks(fig, record, clock)
    note = ""
    if len(points) < len(spans):
        note = (
            f'<p class="note">{len(spans):,} steps and windows averaged into '
            f"{len(points):,} points.</p>"
        )
    return "<h3>Steps</h3>\n" + note + _figure(fig, figures, 620)


def _add_event_marks(fig: Any, record: RunRecord, clock: _Clock) -> None:
    """Vertical dotted lines where something went wrong (stalls, exceptions, restarts)."""
    for e in record.events[:200]:
        if e.kind in ("process_start", "record_capped"):
            continue
        fig.add_vline(x=clock.x(e.t), line_dash="dot", line_color="#888", line_width=1)


def _gpu_section(record: RunRecord, clock: _Clock, figures: list[dict[str, Any]]) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if not record.gpu:
        return '<h3>GPUs</h3>\n<p class="empty">No GPU readings.</p>'
    panels: list[tuple[str, Callable[[Any], float | None]]] = [
        ("utilization (%)", lambda g: g.utilization_gpu_pct),
        ("memory used (GiB)", lambda g: _scale(g.memory_used_bytes, _GIB)),
        ("temperature (°C)", lambda g: g.temperature_c),
        ("SM clock (MHz)", lambda g: g.sm_clock_mhz),
    ]
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[title for title, _ in panels],
    )
    indexes = sorted({g.index for g in record.gpu})
    for index in indexes:
        samples = [g for g in record.gpu if g.index == index]
        label = f"gpu{index} {samples[0].name}".strip()
        for row, (_, value) in enumerate(panels, start=1):
            xs, ys = _series(((clock.x(g.timestamp), value(g)) for g in samples), MAX_POINTS)
            if not xs:
                continue
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name=_e(label),
                    legendgroup=str(index),
                    showlegend=row == 1,
                    mode="lines",
                ),
                row=row,
                col=1,
            )
    fig.update_xaxes(title_text=clock.title, row=len(panels), col=1)
    return "<h3>GPUs</h3>\n" + _figure(fig, figures, 900)


def _host_section(record: RunRecord, clock: _Clock, figures: list[dict[str, Any]]) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if not record.host:
        return '<h3>Host</h3>\n<p class="empty">No host readings.</p>'
    hosts = record.host
    traces: list[tuple[int, str, Callable[[Any], float | None]]] = [
        (1, "job", lambda h: h.job_cpu_pct / 100),
        (1, "other processes", lambda h: _scale(h.others_cpu_pct, 100)),
        (1, "usable cores", lambda h: h.usable_cores),
        (2, "system CPU (%)", lambda h: h.system_cpu_pct),
        (2, "iowait (%)", lambda h: h.iowait_pct),
        (3, "disk read", lambda h: _scale(h.disk_read_bytes_per_s, _MB)),
        (3, "disk write", lambda h: _scale(h.disk_write_bytes_per_s, _MB)),
        (4, "network received", lambda h: _scale(h.net_recv_bytes_per_s, _MB)),
        (4, "network sent", lambda h: _scale(h.net_sent_bytes_per_s, _MB)),
    ]
    titles = ("CPU (cores)", "system CPU and iowait (%)", "disk (MB/s)", "network (MB/s)")
    fig = make_subplots(
        rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles
    )
    empty_rows = set(range(1, 5))
    for row, name, value in traces:
        xs, ys = _series(((clock.x(h.t), value(h)) for h in hosts), MAX_POINTS)
        if not xs:
            continue
        empty_rows.discard(row)
        dash = "dash" if name == "usable cores" else None
        fig.add_trace(
            go.Scatter(x=xs, y=ys, name=name, mode="lines", line={"dash": dash}),
            row=row,
            col=1,
        )
    for row in sorted(empty_rows):
        fig.add_annotation(
            text="no readings",
            showarrow=False,
            xref="x domain",
            yref="y domain",
            x=0.5,
            y=0.5,
            row=row,
            col=1,
        )
    fig.update_xaxes(title_text=clock.title, row=4, col=1)
    return "<h3>Host: CPU, disk and network</h3>\n" + _figure(fig, figures, 900)


def _series(
    points: Iterable[tuple[float, float | None]], max_points: int
) -> tuple[list[float], list[float]]:
    """Known points, averaged in consecutive buckets when there are more than ``max_points``."""
    known = [(x, y) for x, y in points if y is not None and math.isfinite(y)]
    if len(known) <= max_points:
        return [x for x, _ in known], [y for _, y in known]
    size = math.ceil(len(known) / max_points)
    xs, ys = [], []
    for i in range(0, len(known), size):
        bucket = known[i : i + size]
        xs.append(round(sum(x for x, _ in bucket) / len(bucket), 6))
        ys.append(round(sum(y for _, y in bucket) / len(bucket), 6))
    return xs, ys


def _figure(fig: Any, figures: list[dict[str, Any]], height: int) -> str:
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 30, "t": 40, "b": 50},
        legend={"orientation": "h", "y": -0.08},
        hovermode="x unified",
    )
    div_id = f"plot-{len(figures)}"
    figures.append({"id": div_id, "figure": json.loads(fig.to_json())})
    return f'<div class="plot" id="{div_id}" style="height:{height}px"></div>'


def _figures_json(figures: list[dict[str, Any]]) -> str:
    text = json.dumps(figures, separators=(",", ":"))
    # Inside <script>: no "</script>" or "<!--" can appear in the JSON text.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# --- events and loaders ----------------------------------------------------------------


def _events(record: RunRecord, clock: _Clock) -> str:
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


def _scale(value: float | None, divisor: float) -> float | None:
    return None if value is None else value / divisor


def _command(record: RunRecord) -> str:
    return format_command(record.meta)


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- page template ---------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222}
h1{margin-bottom:.3em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}th,td{text-align:left;padding:.2em .8em;
vertical-align:top}table.meta th,table.summary th,table.evidence th{color:#555;font-weight:600}
table.events,table.loaders,table.ranks{width:100%}table.ranks td,table.ranks th,
table.events td,table.loaders td,table.events th,table.loaders th{border-bottom:1px solid #eee}
.finding{border-left:6px solid #999;background:#fafafa;padding:.4em 1em;margin:1em 0}
.finding h3{margin:.3em 0}.sev{color:#fff;border-radius:3px;padding:0 .4em;font-size:.8em;
margin-right:.4em}.impact,.subject{color:#666;font-weight:normal;font-size:.85em;
margin-left:.5em}.fix{background:#e8f5e9;padding:.4em .6em;border-radius:3px}
.id{color:#777;font-size:.85em}.empty,.none,.note{color:#666;font-style:italic}
pre{white-space:pre-wrap;font-size:.85em}code{font-size:.95em}
#tm-errors{color:#b71c1c;font-weight:600}.plot{width:100%}
"""

# Runs first: records script errors so a broken page says so (and tests can see it).
_ERROR_HOOK = """
window.__tmErrors = [];
function __tmShowErrors() {
  var box = document.getElementById('tm-errors');
  if (box && window.__tmErrors.length) {
    box.hidden = false;
    box.textContent = 'Script errors: ' + window.__tmErrors.join(' | ');
  }
}
function __tmError(msg) { window.__tmErrors.push(String(msg)); __tmShowErrors(); }
window.addEventListener('error', function (e) { __tmError(e.message || e); });
window.addEventListener('unhandledrejection', function (e) { __tmError(e.reason); });
"""

_DRAW = """
(function () {
  var figures = JSON.parse(document.getElementById('tm-figures').textContent);
  __tmShowErrors();
  var drawn = figures.map(function (f) {
    return Plotly.newPlot(f.id, f.figure.data, f.figure.layout,
                          {responsive: true, displaylogo: false});
  });
  Promise.all(drawn).then(function () {
    document.body.setAttribute('data-plots-drawn', String(drawn.length));
  }, function (err) { __tmError(err); });
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="trainmedic">
<title>{title}</title>
<style>{style}</style>
<script>{error_hook}</script>
<script>{plotlyjs}</script>
</head>
<body data-plots-drawn="0">
<p id="tm-errors" hidden></p>
{body}
<script type="application/json" id="tm-figures">{figures}</script>
<script>{draw}</script>
</body>
</html>
"""
