"""The plots of the run report: step times, throughput, GPU and host readings over the run.

Each section adds its plotly figures to the page's list (drawn by
:mod:`trainmedic.report.html_page`) and returns the HTML that holds them.
Series are reduced to at most :data:`MAX_POINTS` points per trace.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.record.events import EventKind
from trainmedic.record.stats import StepSpan, all_spans
from trainmedic.record.types import RunRecord
from trainmedic.report.html_page import add_figure

#: most points in one plotted trace; longer series are averaged in buckets.
MAX_POINTS = 5000
_GIB = 1024**3
_MB = 1e6


@dataclass(frozen=True)
class Clock:
    """Turns Unix seconds into elapsed time in a unit that suits the run's length."""

    t0: float
    divisor: float
    unit: str

    @classmethod
    def of(cls, record: RunRecord) -> Clock:
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


def step_section(record: RunRecord, clock: Clock, figures: list[dict[str, Any]]) -> str:
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
    return "<h3>Steps</h3>\n" + note + add_figure(fig, figures, 620)


def _add_event_marks(fig: Any, record: RunRecord, clock: Clock) -> None:
    """Vertical dotted lines where something went wrong (stalls, exceptions, restarts)."""
    for e in record.events[:200]:
        if e.kind in (EventKind.PROCESS_START, EventKind.RECORD_CAPPED):
            continue
        fig.add_vline(x=clock.x(e.t), line_dash="dot", line_color="#888", line_width=1)


def gpu_section(record: RunRecord, clock: Clock, figures: list[dict[str, Any]]) -> str:
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
            xs, ys = series(((clock.x(g.timestamp), value(g)) for g in samples), MAX_POINTS)
            if not xs:
                continue
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name=html.escape(label),
                    legendgroup=str(index),
                    showlegend=row == 1,
                    mode="lines",
                ),
                row=row,
                col=1,
            )
    fig.update_xaxes(title_text=clock.title, row=len(panels), col=1)
    return "<h3>GPUs</h3>\n" + add_figure(fig, figures, 900)


def host_section(record: RunRecord, clock: Clock, figures: list[dict[str, Any]]) -> str:
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
        xs, ys = series(((clock.x(h.t), value(h)) for h in hosts), MAX_POINTS)
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
    return "<h3>Host: CPU, disk and network</h3>\n" + add_figure(fig, figures, 900)


def series(
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


def _scale(value: float | None, divisor: float) -> float | None:
    return None if value is None else value / divisor
