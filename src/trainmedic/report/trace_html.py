"""The report of torch.profiler traces as one self-contained HTML page.

Layout: each trace (file, GPU, rank, steps, median step, GPU busy share), the
ranks' medians when the traces are one job's ranks, the findings with their
fixes (as in the run report), then per trace a bar per step splitting its
time into what the GPU did and why it idled: GPU compute, NCCL with nothing
else on the GPU, idle after synchronisations, idle while the loop waited for
its DataLoader, and the idle time none of these explains. The page shell and
the findings are the run report's (:mod:`trainmedic.report.html_page`,
:func:`trainmedic.report.html.findings_html`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainmedic.findings.model import Finding
from trainmedic.report.html import findings_html
from trainmedic.report.html_page import add_figure, render_page
from trainmedic.traces.kineto import TraceStep, TraceSummary

#: most steps drawn per trace (a profiler schedule records a few; a whole run's trace may
#: hold thousands, of which the first ones are shown).
MAX_STEPS_DRAWN = 2000

PARTS = (
    ("GPU compute", "#2e7d32"),
    ("NCCL alone", "#6a1b9a"),
    ("idle after syncs", "#c62828"),
    ("idle, loop waiting for data", "#ef6c00"),
    ("idle, not explained", "#9e9e9e"),
)


def step_parts_ms(s: TraceStep) -> tuple[float, float, float, float, float]:
    """One step's time split into :data:`PARTS`, milliseconds; the parts sum to the step.

    The idle time (step less GPU busy) is attributed first to the GPU's idle time after
    synchronisations, then to the loop's wait for data, the rest unexplained.
    """
    busy = min(s.gpu_busy_us, s.dur_us)
    alone = min(s.exposed_nccl_us, busy)
    idle = max(0.0, s.dur_us - busy)
    after_sync = min(idle, s.gpu_idle_after_sync_us)
    data = min(idle - after_sync, s.data_us)
    rest = idle - after_sync - data
    parts = (busy - alone, alone, after_sync, data, rest)
    return tuple(round(p / 1000, 4) for p in parts)  # type: ignore[return-value]


def render_trace_html(
    traces: Sequence[TraceSummary],
    findings: Sequence[Finding],
    ranks: Sequence[dict[str, Any]] | None = None,
) -> str:
    """The whole page as a string."""
    figures: list[dict[str, Any]] = []
    sections = ["<h1>trainmedic trace report</h1>", _traces_table(traces)]
    if ranks:
        sections.append(_ranks_table(ranks))
    sections.append(findings_html(findings))
    sections.append('<h2 id="steps">Each step: what the GPU did, and why it idled</h2>')
    for t in traces:
        sections.append(_steps_figure(t, figures))
    names = ", ".join(Path(t.path).name for t in traces)
    return render_page(f"trainmedic trace report — {names}", "\n".join(sections), figures)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _traces_table(traces: Sequence[TraceSummary]) -> str:
    head = ("<tr><th>trace</th><th>GPU</th><th>rank</th><th>steps</th><th>median step</th>"
            "<th>GPU busy (median)</th><th>events</th></tr>")  # fmt: skip
    rows = []
    for t in traces:
        gpu = t.device.name if t.device is not None and t.device.name else "-"
        rank = f"{t.rank} of {t.world_size}" if t.rank is not None else "-"
        step = f"{(t.step_time_median_s or 0.0) * 1000:.1f} ms" if t.steps else "-"
        busy = f"{t.gpu_busy_share:.0%}" if t.gpu_busy_share is not None else "-"
        rows.append(f"<tr><td><code>{_e(Path(t.path).name)}</code></td><td>{_e(gpu)}</td>"
                    f"<td>{_e(rank)}</td><td>{len(t.steps)}</td><td>{_e(step)}</td>"
                    f"<td>{_e(busy)}</td><td>{t.events}</td></tr>")  # fmt: skip
    return ('<h2 id="traces">Traces</h2>\n<table class="ranks">' + head + "".join(rows)
            + "</table>")  # fmt: skip


def _ranks_table(ranks: Sequence[dict[str, Any]]) -> str:
    cols = ("rank", "step_ms", "gpu_compute_ms", "exposed_nccl_ms", "data_wait_ms")
    labels = ("rank", "step (ms)", "GPU compute (ms)", "NCCL alone (ms)", "data wait (ms)")
    head = "<tr>" + "".join(f"<th>{_e(c)}</th>" for c in labels) + "</tr>"
    rows = "".join(
        "<tr>" + "".join(f"<td>{_e(r.get(c, '-'))}</td>" for c in cols) + "</tr>" for r in ranks
    )
    return ('<h2 id="ranks">Ranks (medians over each rank\'s steps)</h2>\n<table class="ranks">'
            + head + rows + "</table>")  # fmt: skip


def _steps_figure(t: TraceSummary, figures: list[dict[str, Any]]) -> str:
    import plotly.graph_objects as go

    steps = t.steps[:MAX_STEPS_DRAWN]
    title = f"<h3><code>{_e(Path(t.path).name)}</code></h3>"
    if not steps:
        return title + '<p class="none">No ProfilerStep spans.</p>'
    split = [step_parts_ms(s) for s in steps]
    x = [f"#{s.number}" for s in steps]
    fig = go.Figure()
    for i, (name, colour) in enumerate(PARTS):
        fig.add_trace(go.Bar(x=x, y=[p[i] for p in split], name=name, marker_color=colour))
    fig.update_layout(barmode="stack", yaxis_title="ms", xaxis_title="ProfilerStep",
                      xaxis_type="category")  # fmt: skip
    note = ""
    if len(t.steps) > len(steps):
        note = f'<p class="none">The first {len(steps)} of {len(t.steps)} steps.</p>'
    return title + add_figure(fig, figures, 380) + note
