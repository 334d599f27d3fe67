"""Findings for a person at a terminal: grouped by category, worst first.

Rich renders colours and panels on a TTY; the same content comes out as
plain text when stdout is a pipe or a file (rich decides from the console).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainmedic.findings.model import Finding, Severity, rank_findings

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
SEVERITY_MARK = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}


def format_evidence_value(value: Any) -> str:
    """Short human form of one evidence value."""
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, (list, tuple)):
        return ", ".join(format_evidence_value(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={format_evidence_value(v)}" for k, v in value.items())
    return str(value)


def group_by_category(findings: Iterable[Finding]) -> list[tuple[str, list[Finding]]]:
    """Categories ordered by their most important finding; findings ranked inside."""
    groups: dict[str, list[Finding]] = {}
    for f in rank_findings(findings):
        groups.setdefault(f.category.value, []).append(f)
    return list(groups.items())


def render_finding(f: Finding) -> Table:
    """One finding as a grid whose wrapped lines stay under their label."""
    style = SEVERITY_STYLE[f.severity]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=1)
    grid.add_column(no_wrap=True, min_width=9)
    grid.add_column(ratio=1, overflow="fold")
    head = Text(f.title, style="bold")
    if f.impact is not None:
        head.append(f"  (~{f.impact:.0%} of time)", style="dim")
    grid.add_row(
        "", Text(f"{SEVERITY_MARK[f.severity]} {f.severity.value.upper()}", style=style), head
    )
    if f.evidence:
        ev = "; ".join(f"{k}={format_evidence_value(v)}" for k, v in f.evidence.items())
        grid.add_row("", Text("evidence", style="dim"), Text(ev, style="dim"))
    if f.detail:
        grid.add_row("", Text("why", style="dim"), Text(f.detail))
    if f.fix:
        grid.add_row("", Text("fix", style="green"), Text(f.fix))
    grid.add_row("", Text("id", style="dim"), Text(f.id, style="dim"))
    return grid


def render_findings(
    console: Console,
    findings: Sequence[Finding],
    heading: str,
    show_info: bool = True,
) -> None:
    """Print a heading, then the findings grouped by category, then a summary line."""
    console.print(Text(heading, style="bold underline"))
    shown = [f for f in findings if show_info or f.severity is not Severity.INFO]
    if not shown:
        console.print(Text("  no findings", style="green"))
    for category, items in group_by_category(shown):
        console.print()
        console.print(Text(f"[{category}]", style="bold magenta"))
        for f in items:
            console.print(render_finding(f))
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    console.print()
    summary = Text("summary: ")
    summary.append(f"{counts[Severity.ERROR]} error(s)", style=SEVERITY_STYLE[Severity.ERROR])
    summary.append(", ")
    summary.append(f"{counts[Severity.WARNING]} warning(s)", style=SEVERITY_STYLE[Severity.WARNING])
    summary.append(", ")
    summary.append(f"{counts[Severity.INFO]} info", style=SEVERITY_STYLE[Severity.INFO])
    console.print(summary)
