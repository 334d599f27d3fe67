"""A comparison of two runs for a person: at a terminal, and as an HTML page.

The verdict comes first in words ("faster: 1.93x, 95 % interval 1.88x-1.99x"),
then the measures side by side, then the findings that were resolved, are
still present, or are new, then what else differed between the runs.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainmedic.record.stats import all_spans, split_steps
from trainmedic.record.types import RunRecord
from trainmedic.report.compare import Comparison
from trainmedic.report.compare_side_by_side import FindingChange

_VERDICT_STYLE = {"faster": "bold green", "slower": "bold red", "no_change": "bold yellow",
                  "inconclusive": "bold magenta"}  # fmt: skip
_MAX_POINTS = 4000


def verdict_sentence(c: Comparison) -> str:
    """The verdict in one sentence, with the speed-up and its interval."""
    if c.speedup is None:
        if c.reasons:
            return "inconclusive: " + c.reasons[0]
        return "no verdict: a run has no steady training steps to measure"
    ci = ""
    if c.speedup_ci is not None:
        lo, hi = c.speedup_ci
        ci = f", {c.confidence:.0%} interval {lo:.2f}x-{hi:.2f}x"
    what = {
        "faster": "faster",
        "slower": "slower",
        "no_change": "no change beyond noise",
        "inconclusive": "inconclusive",
    }[c.verdict]
    sentence = f"{what}: after/before throughput {c.speedup:.2f}x{ci}"
    if c.adjusted_speedup is not None and c.adjusted_ci is not None:
        lo, hi = c.adjusted_ci
        sentence += (
            f"; without other processes' load {c.adjusted_speedup:.2f}x "
            f"({lo:.2f}x-{hi:.2f}x), which the verdict is judged on"
        )
    return sentence


def render_comparison(console: Console, c: Comparison) -> None:
    """Print the comparison (see the module docstring)."""
    console.print(Text("compare", style="bold underline"))
    for label, runs, side in (("before:", c.before_runs, c.before),
                              ("after: ", c.after_runs, c.after)):  # fmt: skip
        names = ", ".join(r.name for r in runs) if len(runs) > 1 else side.name
        console.print(f"{label} {names}  ({' '.join(side.command)[:100]})")
    console.print()
    console.print(Text(verdict_sentence(c), style=_VERDICT_STYLE[c.verdict]))
    for reason in c.reasons if c.speedup is not None else c.reasons[1:]:
        console.print(Text(f"  because {reason}", style="magenta"))
    if c.verdict in ("no_change", "inconclusive") and c.speedup_ci is not None:
        console.print(
            Text(
                f"  (a change counts when the whole interval is beyond ±{c.min_effect:.0%})",
                style="dim",
            )
        )
    console.print()
    table = Table(show_edge=False, pad_edge=False, box=None)
    for name, justify in (("measure", "left"), ("before", "right"), ("after", "right"),
                          ("change", "right")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for name, unit, before, after in c.rows:
        label = f"{name} ({unit})" if unit else name
        table.add_row(label, _num(before), _num(after), _change(before, after))
    console.print(table)
    console.print()
    _render_changes(console, "resolved", c.resolved, "green")
    _render_changes(console, "still present", c.still_present, "yellow")
    _render_changes(console, "new", c.new, "red")
    for note in c.notes:
        console.print(Text(f"note: {note}", style="dim"))


def _render_changes(console: Console, heading: str, items: tuple[FindingChange, ...],
                    style: str) -> None:  # fmt: skip
    console.print(Text(f"findings {heading}: {len(items)}", style=f"bold {style}"))
    for f in items:
        sev = " -> ".join(s for s in (f.severity_before, f.severity_after) if s)
        imp = " -> ".join(_pct(i) for i in (f.impact_before, f.impact_after) if i is not None)
        console.print(f"  {f.id} ({f.category}, {sev}{', ' + imp if imp else ''}): {f.title}")


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return ""
    if before == 0:
        return "" if after == 0 else "new"
    return f"{after / before:.2f}x"


def _pct(v: float) -> str:
    return f"{v:.0%}"


# --- HTML ----------------------------------------------------------------------------------


def render_comparison_html(
    c: Comparison, before: Sequence[RunRecord], after: Sequence[RunRecord]
) -> str:
    """The page: verdict, measures, findings, notes, and the step times of both runs."""
    import plotly.graph_objects as go

    from trainmedic.report.html_page import render_page

    figures: list[dict[str, Any]] = []
    fig = go.Figure()
    for label, records in (("before", before), ("after", after)):
        for i, record in enumerate(records):
            durations = _step_durations(record)
            name = label if len(records) == 1 else f"{label} {i + 1}"
            fig.add_trace(go.Box(x=durations, name=name, boxpoints=False, orientation="h"))
    fig.update_layout(
        template="plotly_white", height=260, margin={"l": 70, "r": 30, "t": 30, "b": 40},
        xaxis_title="steady step time (s)",
    )  # fmt: skip
    figures.append({"id": "plot-0", "figure": json.loads(fig.to_json())})
    rows = "".join(
        f"<tr><th>{_e(n)}{f' ({_e(u)})' if u else ''}</th><td>{_e(_num(b))}</td>"
        f"<td>{_e(_num(a))}</td><td>{_e(_change(b, a))}</td></tr>"
        for n, u, b, a in c.rows
    )
    colour = {"faster": "#2e7d32", "slower": "#c62828", "no_change": "#b26a00",
              "inconclusive": "#6a1b9a"}[c.verdict]  # fmt: skip
    reasons = "".join(f"<li>{_e(r)}</li>" for r in c.reasons)
    body = [
        "<h1>trainmedic compare</h1>",
        f"<p>before: <code>{_e(c.before.name)}</code> — {_e(' '.join(c.before.command))}<br>"
        f"after: <code>{_e(c.after.name)}</code> — {_e(' '.join(c.after.command))}</p>",
        f'<h2 id="verdict">Verdict</h2><p class="verdict" style="border-left:6px solid '
        f'{colour};padding:.4em 1em"><b>{_e(verdict_sentence(c))}</b><br>'
        f"A change counts when the whole {c.confidence:.0%} interval of the throughput ratio "
        f"(bootstrap over runs and each run's steps, never narrower than run-to-run noise "
        f"of {c.run_noise:.0%} allows) is beyond ±{c.min_effect:.0%}.</p>"
        + (f"<p>Inconclusive because:</p><ul>{reasons}</ul>" if reasons else ""),
        '<h2 id="measures">Side by side</h2>',
        '<table class="compare"><tr><th>measure</th><th>before</th><th>after</th>'
        f"<th>change</th></tr>{rows}</table>",
        '<div class="plot" id="plot-0" style="height:260px"></div>',
        '<h2 id="findings">Findings</h2>',
        _changes_html("resolved", c.resolved),
        _changes_html("still present", c.still_present),
        _changes_html("new", c.new),
    ]
    if c.notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in c.notes) + "</ul>")
    return render_page(
        f"trainmedic compare — {c.before.name} vs {c.after.name}",
        "\n".join(body),
        figures,
        style="table.compare td{text-align:right}",
    )


def _changes_html(heading: str, items: tuple[FindingChange, ...]) -> str:
    if not items:
        return f'<h3>{_e(heading)}</h3><p class="none">none</p>'
    lis = "".join(
        f"<li><code>{_e(f.id)}</code> ({_e(f.category)}, "
        f"{_e(' → '.join(s for s in (f.severity_before, f.severity_after) if s))}): "
        f"{_e(f.title)}</li>"
        for f in items
    )
    return f"<h3>{_e(heading)}</h3><ul>{lis}</ul>"


def _step_durations(record: RunRecord) -> list[float]:
    """Steady step durations, every k-th of them so that at most ``_MAX_POINTS`` remain."""
    spans = split_steps(all_spans(record)).steady
    total = sum(s.count for s in spans)
    stride = max(1, -(-total // _MAX_POINTS))
    out: list[float] = []
    seen = 0
    for s in spans:
        # the indices i in [seen, seen + count) with i % stride == 0
        first = -(-seen // stride) * stride
        out.extend([s.mean_duration_s] * len(range(first, seen + s.count, stride)))
        seen += s.count
    return out


def _e(text: str) -> str:
    return html.escape(text, quote=True)
