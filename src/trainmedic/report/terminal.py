"""Findings for a person at a terminal: grouped by category, worst first.

Rich renders colours and panels on a TTY; the same content comes out as
plain text when stdout is a pipe or a file (rich decides from the console).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainmedic.findings.model import CATEGORY_CAUSE, Category, Finding, Severity, rank_findings
from trainmedic.ostext import visible
from trainmedic.report.facts import facts
from trainmedic.report.fix_text import Known, fill

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
SEVERITY_MARK = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}


def group_by_category(findings: Iterable[Finding]) -> list[tuple[str, list[Finding]]]:
    """Categories ordered by their most important finding; findings ranked inside."""
    groups: dict[str, list[Finding]] = {}
    for f in rank_findings(findings):
        groups.setdefault(f.category.value, []).append(f)
    return list(groups.items())


def _cause(category: str) -> str:
    """The category's cause in words; empty for a name outside the vocabulary."""
    try:
        return CATEGORY_CAUSE[Category(category)]
    except ValueError:
        return ""


EVIDENCE_LINES = 6
"""Terminal lines of evidence per finding at most, wrapped lines counted."""
LABEL_CELLS = 14
"""Columns before a finding's text: the indent, the label and the gaps."""


def evidence_lines(f: Finding, known: Known | None, width: int) -> list[str]:
    """The facts of ``f`` that fit in :data:`EVIDENCE_LINES` lines of ``width``
    characters (each at most two), then where the rest of its evidence is."""
    where = known.evidence_at if known is not None else None
    measure = Console(width=width, file=io.StringIO())

    def two_lines(text: str) -> tuple[str, int]:
        """``text`` and the lines it takes, cut to two (a long frame or path)."""
        lines = Text(text).wrap(measure, width)
        if len(lines) > 2:
            text = " ".join(line.plain.strip() for line in lines[:2])[: 2 * width - 8] + "…"
            lines = Text(text).wrap(measure, width)
        return text, len(lines)

    tail = None
    if where:  # never cut: a path cut short is no path
        said = f"all {len(f.evidence)} values: {where}"
        tail = (said, len(Text(said).wrap(measure, width)))
    room = EVIDENCE_LINES - (tail[1] if tail else 0)
    out: list[str] = []
    for fact in facts(f.id, f.evidence):
        fact, need = two_lines(fact)
        if need > room:
            break
        out.append(fact)
        room -= need
    if tail and len(f.evidence) > len(out):
        out.append(tail[0])
    return out


def render_finding(f: Finding, known: Known | None = None, width: int = 80) -> Table:
    """One finding as a grid whose wrapped lines stay under their label: the title and
    its impact, a few facts in words (:mod:`trainmedic.report.facts`), the fix with
    what trainmedic knows filled in (:mod:`trainmedic.report.fix_text`)."""
    style = SEVERITY_STYLE[f.severity]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=1)
    grid.add_column(no_wrap=True, min_width=9)
    grid.add_column(ratio=1, overflow="fold")
    head = Text(visible(f.title), style="bold")
    if f.impact is not None:
        share = "<1%" if f.impact < 0.005 else f"~{f.impact:.0%}"
        head.append(f"  ({share} of time)", style="dim")
    grid.add_row(
        "", Text(f"{SEVERITY_MARK[f.severity]} {f.severity.value.upper()}", style=style), head
    )
    lines = evidence_lines(f, known, max(20, width - LABEL_CELLS))
    for i, line in enumerate(lines):
        grid.add_row("", Text("evidence" if i == 0 else "", style="dim"), Text(visible(line)))
    if f.detail:
        grid.add_row("", Text("why", style="dim"), Text(visible(f.detail)))
    if f.fix:
        grid.add_row("", Text("fix", style="green"), Text(visible(fill(f.fix, known))))
    grid.add_row("", Text("id", style="dim"), Text(visible(f.id), style="dim"))
    return grid


def render_findings(
    console: Console,
    findings: Sequence[Finding],
    heading: str,
    show_info: bool = True,
    known: Known | None = None,
) -> None:
    """Print a heading, then the findings grouped by category, then a summary line;
    ``known`` fills the fixes' placeholders and says where the full evidence is."""
    console.print(Text(heading, style="bold underline"))
    shown = [f for f in findings if show_info or f.severity is not Severity.INFO]
    if not shown:
        console.print(Text("  no findings", style="green"))
    for category, items in group_by_category(shown):
        console.print()
        title = Text(f"[{visible(category)}]", style="bold magenta")
        cause = _cause(category)
        if cause:
            title.append(f" {cause}", style="magenta")
        console.print(title)
        for f in items:
            console.print(render_finding(f, known, console.width))
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    console.print()
    summary = Text("summary: ")
    summary.append(f"{counts[Severity.ERROR]} error(s)", style=SEVERITY_STYLE[Severity.ERROR])
    summary.append(", ")
    summary.append(f"{counts[Severity.WARNING]} warning(s)", style=SEVERITY_STYLE[Severity.WARNING])
    summary.append(", ")
    summary.append(f"{counts[Severity.INFO]} info", style=SEVERITY_STYLE[Severity.INFO])
    console.print(summary)
