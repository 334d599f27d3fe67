"""The HTML page of an attach window (``trainmedic attach PID --html FILE``).

Read from the findings document alone (its context: the processes, each
training thread's time split with intervals, the GPUs' readings, the
machine's problems), so the page and ``--json`` never disagree.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from trainmedic.findings.model import FindingsDocument
from trainmedic.report.html import findings_html
from trainmedic.report.html_page import add_figure, render_page


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="events"><tr>{cells}</tr>{body}</table>'


def _split_figure(thread: dict[str, Any], figures: list[dict[str, Any]]) -> str:
    import plotly.graph_objects as go

    split = sorted(thread["time_split"].items(), key=lambda kv: -kv[1]["share"])
    names = [k.replace("_", " ") for k, _ in split]
    shares = [100 * v["share"] for _, v in split]
    fig = go.Figure(
        go.Bar(
            x=shares,
            y=names,
            orientation="h",
            error_x={
                "type": "data",
                "symmetric": False,
                "array": [100 * (v["high"] - v["share"]) for _, v in split],
                "arrayminus": [100 * (v["share"] - v["low"]) for _, v in split],
            },
            hovertemplate="%{y}: %{x:.1f}%<extra></extra>",
        )
    )
    fig.update_layout(
        title=(
            f"training thread of pid {thread['pid']}: {thread['samples']} samples "
            "(90 % intervals)"
        ),
        xaxis_title="share of the window, %",
        yaxis={"autorange": "reversed"},
    )
    return add_figure(fig, figures, height=120 + 28 * len(names))


def render_attach_html(document: FindingsDocument) -> str:
    """The whole page for one attach document."""
    ctx = document.context
    figures: list[dict[str, Any]] = []
    when = datetime.fromtimestamp(document.created_at, timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    parts = [
        f"<h1>trainmedic attach: pid {_e(ctx.get('pid'))}</h1>",
        f"<p>Watched for {_e(ctx.get('window_s'))} s from outside, ending {_e(when)}; "
        f"{_e(ctx.get('stack_samples') or 0)} stack samples.</p>",
    ]
    if ctx.get("stacks_unavailable"):
        parts.append(f"<p><b>No stacks:</b> {_e(ctx['stacks_unavailable'])}</p>")
    parts.append("<h2>Findings</h2>")
    parts.append(findings_html(document.findings))
    parts.append("<h2>Processes</h2>")
    parts.append(
        _table(
            ("pid", "parent", "role", "rank", "command"),
            [
                (
                    p["pid"],
                    p["ppid"],
                    p["role"],
                    p["rank"] if p["rank"] is not None else "",
                    " ".join(p["command"]),
                )
                for p in ctx.get("processes") or []
            ],
        )
    )
    threads = ctx.get("training_threads") or []
    if threads:
        parts.append("<h2>Where the training thread's time goes</h2>")
        parts.extend(_split_figure(t, figures) for t in threads if t["time_split"])
    gpus = ctx.get("gpus") or []
    parts.append("<h2>GPUs</h2>")
    if gpus:
        parts.append(
            _table(
                ("GPU", "name", "the job's", "busy %", "memory used GiB", "max °C", "readings"),
                [
                    (
                        g["index"],
                        g["name"],
                        "yes" if g["job"] else "",
                        g["utilization_pct_mean"] if g["utilization_pct_mean"] is not None else "",
                        f"{g['memory_used_bytes_max'] / 2**30:.1f}"
                        if g["memory_used_bytes_max"] is not None
                        else "",
                        g["temperature_c_max"] if g["temperature_c_max"] is not None else "",
                        g["readings"],
                    )
                    for g in gpus
                ],
            )
        )
    else:
        parts.append(f"<p>No GPU readings: {_e(ctx.get('gpus_absent') or 'none')}</p>")
    machine = ctx.get("machine")
    if machine:
        parts.append("<h2>The machine</h2>")
        parts.append(
            _table(
                ("host", "GPUs", "driver", "torch"),
                [
                    (
                        machine.get("hostname"),
                        ", ".join(machine.get("gpus") or []) or "none",
                        machine.get("driver_version") or "",
                        machine.get("torch_version") or "",
                    )
                ],
            )
        )
        problems = machine.get("problems") or []
        if problems:
            parts.append(
                _table(
                    ("check", "severity", "what"),
                    [(m["id"], m["severity"], m["title"]) for m in problems],
                )
            )
    return render_page(f"trainmedic attach {ctx.get('pid')}", "\n".join(parts), figures)
