"""Checks that a report reads in ten seconds: few evidence lines per finding, fixes with
nothing trainmedic knows left as a placeholder, the step-time bar on top.

Shared by the unit tests of the terminal report, the demo's test and the corpus.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from trainmedic.findings.model import Finding
from trainmedic.report.fix_text import Known
from trainmedic.report.terminal import EVIDENCE_LINES, render_findings

HEAD = re.compile(r"^  [✖▲●] (ERROR|WARNING|INFO) ")
LABEL = re.compile(r"^  (evidence|why|fix|id) ")
KNOWN_PLACEHOLDERS = ("RUN_DIR", "-- CMD")
"""What a run's report always knows: its directory and its command."""


def evidence_blocks(text: str) -> list[list[str]]:
    """The evidence lines of each finding in a terminal report, wrapped lines counted."""
    blocks: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if HEAD.match(line):
            blocks.append([])
            inside = False
            continue
        label = LABEL.match(line)
        if label:
            inside = label.group(1) == "evidence"
            if inside:
                blocks[-1].append(line)
            continue
        if inside and line.startswith(" " * 12) and line.strip():
            blocks[-1].append(line)
        elif not line.startswith(" " * 12):
            inside = False
    return blocks


def assert_readable(text: str, width: int | None = None) -> None:
    """Every finding in ``text`` has at most :data:`EVIDENCE_LINES` lines of evidence,
    no known placeholder is left in it, and no line is wider than ``width``."""
    for block in evidence_blocks(text):
        assert len(block) <= EVIDENCE_LINES, "\n".join(block)
    for placeholder in KNOWN_PLACEHOLDERS:
        assert placeholder not in text, text
    if width is not None:
        wide = [line for line in text.splitlines() if len(line.rstrip()) > width]
        assert not wide, wide


def render(findings: Iterable[Finding], known: Known | None, width: int) -> str:
    """The findings as the terminal shows them at ``width`` columns, without colour."""
    out = io.StringIO()
    console = Console(file=out, width=width, no_color=True, highlight=False)
    render_findings(console, list(findings), "findings", known=known)
    return out.getvalue()


def check_run_findings(
    findings: Sequence[Mapping[str, Any]], run_dir: Path, command: Sequence[str]
) -> None:
    """A run's findings (JSON dicts) read as the rules above ask, at 80 and 120 columns."""
    parsed = [Finding.from_dict(f) for f in findings]
    known = Known(run_dir=run_dir, command=command, evidence_at=str(run_dir / "findings.json"))
    for width in (80, 120):
        assert_readable(render(parsed, known, width), width)
