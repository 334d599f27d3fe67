"""A run's headline for a person: command, duration, exit code and the main rates.

Shared by the terminal summary of ``trainmedic report`` (and ``run``) and the
HTML report, so both say the same thing the same way.
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainmedic.ostext import visible
from trainmedic.record.ranks import RankStats
from trainmedic.record.stats import RunSummary
from trainmedic.record.types import RunMeta
from trainmedic.report.breakdown import BAR_CELLS, bar_text, legend_lines, of_ranks, of_summary
from trainmedic.report.facts import format_seconds_short, significant

STEP_LABEL = "a step's time"


def format_command(meta: RunMeta) -> str:
    """The command as a shell would read it."""
    return shlex.join(meta.command) if meta.command else "(no command)"


def format_seconds(seconds: float) -> str:
    """``42.0 s``, ``12m 05s`` or ``3h 02m 10s``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def format_duration(meta: RunMeta) -> str:
    if meta.ended_at is None:
        return "unknown (the run has not ended, or its supervisor died)"
    return format_seconds(max(0.0, meta.ended_at - meta.started_at))


def format_exit_code(code: int | None) -> str:
    """The exit code, with the signal's name when the job was killed."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"{code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"{code} (killed by signal {-code})"
    return str(code)


def format_share(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.0%}"


def format_rate(value: float | None, unit: str) -> str:
    """``2,792 steps/s``, ``12.3 steps/s``, ``0.5 steps/s``: three significant digits,
    every digit of the whole part."""
    return "not measured" if value is None else f"{significant(value)} {unit}"


def format_gpu_util(pct: float | None) -> str:
    return "not measured" if pct is None else f"{pct:.0f}%"


def format_step_time(s: RunSummary) -> str:
    """Median and p90 step time in milliseconds."""
    if s.step_time_median_s is None:
        return "not measured"
    p90 = "" if s.step_time_p90_s is None else f" / p90 {format_seconds_short(s.step_time_p90_s)}"
    return f"median {format_seconds_short(s.step_time_median_s)}{p90}"


def format_steps(s: RunSummary) -> str:
    return f"{s.steps_total:,} ({s.steps_exact:,} kept exactly, {s.steps_folded:,} folded)"


def header_rows(meta: RunMeta) -> list[tuple[str, str]]:
    """What ran and how it ended, as (label, value) pairs."""
    return [
        ("command", format_command(meta)),
        ("duration", format_duration(meta)),
        ("exit code", format_exit_code(meta.exit_code)),
    ]


def summary_rows(s: RunSummary) -> list[tuple[str, str]]:
    """The run's main numbers as (label, value) pairs, in the order both reports show them."""
    return [
        ("steps", format_steps(s)),
        ("processes", str(s.processes)),
        ("steps/s (per process)", format_rate(s.steps_per_s, "steps/s")),
        ("samples/s (job)", format_rate(s.samples_per_s, "samples/s")),
        ("step time", format_step_time(s)),
        ("data wait share", format_share(s.data_wait_share)),
        ("GPU utilization (mean)", format_gpu_util(s.gpu_utilization_mean_pct)),
    ]


def render_run_summary(
    console: Console,
    meta: RunMeta,
    s: RunSummary,
    ranks: Sequence[RankStats] = (),
    loader: bool = True,
) -> None:
    """Print the run's headline: a heading, what ran, where a step's time goes (one bar
    for the job, one per rank of a distributed run), then one aligned line per number.
    ``loader``: the job read its batches from a DataLoader (else the time between steps
    is the loop's own batch preparation and code, and is named so)."""
    console.print(Text(f"trainmedic run {visible(meta.run_id)}", style="bold underline"))
    head, numbers = header_rows(meta), summary_rows(s)
    job = of_summary(s, loader)
    bars = ([job] if job else []) + of_ranks(ranks, loader)
    labels = [STEP_LABEL if b.who == "job" else b.who for b in bars]
    width = 2 + max(len(label) for label in [*labels, *(k for k, _ in head + numbers)])

    def grid(wrap: bool) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, style="dim", min_width=width)
        table.add_column(ratio=1 if wrap else None, overflow="fold", no_wrap=not wrap)
        return table

    top = grid(True)
    for label, value in head:
        top.add_row(f"  {label}", visible(value))
    console.print(top)
    if bars:
        room = max(20, console.width - width - 3)
        lines = grid(False)
        for label, b in zip(labels, bars, strict=True):
            lines.add_row(f"  {label}", bar_text(b, min(BAR_CELLS, room)))
            for line in legend_lines(b, room):
                lines.add_row("", line)
        console.print(lines)
    rest = grid(True)
    for label, value in numbers:
        rest.add_row(f"  {label}", value)
    console.print(rest)
