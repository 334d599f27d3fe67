"""``doctor --stress`` for a person: one table of the figures, then the findings (terminal), or
the same as one self-contained HTML page without scripts.

Both read only the :class:`~.results.StressResult` and the findings, so the terminal, the
page and ``--json`` never disagree.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timezone

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainmedic.doctor.stress.datasheet import DTYPES
from trainmedic.doctor.stress.results import Drift, GpuStress, StressResult
from trainmedic.findings.model import Finding


def _dtypes(result: StressResult) -> list[str]:
    return [d for d in DTYPES if any(d in g.tflops for g in result.gpus)]


def _share(value: float, peak: float | None) -> str:
    return f"{value:.0f}" + (f" ({value / peak:.0%})" if peak else "")


def _drift(d: Drift | None, unit: str, high: bool = False) -> str:
    if d is None:
        return "-"
    end = d.high if high else d.end
    text = f"{d.start:.0f}→{end:.0f} {unit}"
    if not high and d.low < min(d.start, d.end):  # fell during the load and came back
        text += f" (low {d.low:.0f})"
    return text


def figure_rows(result: StressResult) -> tuple[list[str], list[list[str]]]:
    """The figures table: its header and one row per GPU (strings, units in the header)."""
    dtypes = _dtypes(result)
    alone = any(g.tflops_alone for g in result.gpus)
    head = [
        "GPU",
        "model",
        *[f"{d} TFLOP/s" for d in dtypes],
        *(["alone TFLOP/s"] if alone else []),
        "memory GB/s",
        "host GB/s h2d/d2h pinned",
        "SM clock",
        "power",
        "temperature",
        "memory test",
        "slowdown",
    ]
    rows = []
    for g in result.gpus:
        sheet = g.datasheet
        cells = [str(g.index), sheet.model if sheet else g.name]
        for d in dtypes:
            rate = g.tflops.get(d)
            peak = sheet.tflops.get(d) if sheet else None
            cells.append("-" if rate is None else _share(rate.mean, peak))
        if alone:
            cells.append(_alone(g))
        mem = g.memory_gb_per_s
        cells.append(
            "-" if mem is None else _share(mem.mean, sheet.memory_gb_per_s if sheet else None)
        )
        h2d, d2h = g.host_gb_per_s.get("h2d_pinned"), g.host_gb_per_s.get("d2h_pinned")
        cells.append(f"{h2d.mean:.1f}/{d2h.mean:.1f}" if h2d and d2h else "-")
        r = g.readings
        cells.append(_drift(r.sm_clock_mhz, "MHz"))
        cells.append(_drift(r.power_w, "W"))
        cells.append(_drift(r.temperature_c, "°C", high=True))
        cells.append(_memtest(g))
        cells.append(", ".join(f"{k} {v:.0%}" for k, v in r.reason_shares.items()) or "none")
        rows.append(cells)
    return head, rows


def _alone(g: GpuStress) -> str:
    """``fp8 1350 (together 67 %)``: the one-at-a-time pass and what running together kept."""
    for dtype, rate in g.tflops_alone.items():
        share = g.together_share(dtype)
        return f"{dtype} {rate.mean:.0f}" + ("" if share is None else f" (together {share:.0%})")
    return "-"


def _memtest(g: GpuStress) -> str:
    m = g.memtest
    if m is None:
        return "-"
    verdict = "ok" if m.errors == 0 else f"{m.errors} errors"
    return f"{verdict} ({m.tested_bytes / 2**30:.1f} GiB)"


def render_stress(
    console: Console,
    result: StressResult,
    findings: Sequence[Finding],
    heading: str,
    show_info: bool = True,
    notes: Sequence[str] = (),
) -> None:
    """The figures table, the findings, and the notes (dcgmi not installed, ...)."""
    from trainmedic.report.fix_text import Known
    from trainmedic.report.terminal import render_findings

    head, rows = figure_rows(result)
    # One column per GPU: a figure's values side by side, and 80 columns hold 4 GPUs.
    table = Table(
        title=f"under load: {result.elapsed_s:.0f} s via {result.machine}", title_justify="left"
    )
    table.add_column("")
    for row in rows:
        table.add_column(f"GPU {row[0]}", overflow="fold")
    for n, name in enumerate(head[1:], start=1):
        table.add_row(name, *(row[n] for row in rows))
    console.print(table)
    for note in notes:
        console.print(Text(f"note: {note}", style="dim"))
    known = Known(evidence_at="trainmedic doctor --stress --json -")
    render_findings(console, list(findings), heading, show_info=show_info, known=known)


def render_stress_html(
    result: StressResult,
    findings: Sequence[Finding],
    created_at: float,
    host: str,
    notes: Sequence[str] = (),
) -> str:
    """The whole page (no plotly, no script: it opens anywhere)."""
    from trainmedic.report.html import findings_html
    from trainmedic.report.html_page import STYLE

    e = html.escape
    when = datetime.fromtimestamp(created_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    head, rows = figure_rows(result)
    table = (
        "<tr>"
        + "".join(f"<th>{e(h)}</th>" for h in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    )
    sources = sorted({g.datasheet.source for g in result.gpus if g.datasheet})
    parts = [
        f"<h1>trainmedic doctor --stress: {e(host)}</h1>",
        f"<p>{len(result.gpus)} GPU(s), {result.seconds:g} s each asked, {result.elapsed_s:.0f} s "
        f"under load via {e(result.machine)}, readings from {e(result.backend)}; {e(when)}.</p>",
        "<h2>Figures</h2>",
        "<p>TFLOP/s dense, every GPU running at once; in brackets the share of the "
        "datasheet's peak. Alone: each GPU by itself in its best dtype, and the share of that "
        "it kept with every GPU running. Memory: device copies, bytes read plus written. "
        "Clock, power and temperature: read during the bursts, from the first reading to the "
        "last (temperature: to the hottest).</p>",
        f'<table class="events">{table}</table>',
        *(f"<p><b>Note:</b> {e(n)}</p>" for n in notes),
        "<h2>Findings</h2>",
        findings_html(list(findings)),
        "<h2>Datasheets</h2><ul>" + "".join(f"<li>{e(s)}</li>" for s in sources) + "</ul>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="generator" content="trainmedic">'
        "<title>trainmedic doctor --stress</title>"
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    )
