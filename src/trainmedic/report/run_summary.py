"""A run's headline for a person: command, duration, exit code and the main rates.

Shared by the terminal summary of ``trainmedic report`` (and ``run``) and the
HTML report, so both say the same thing the same way.
"""

from __future__ import annotations

import shlex
import signal

from rich.console import Console
from rich.text import Text

from trainmedic.record.stats import RunSummary
from trainmedic.record.types import RunMeta


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


def format_rate(value: float | None, unit: str, digits: int = 2) -> str:
    return "not measured" if value is None else f"{value:,.{digits}f} {unit}"


def format_step_time(s: RunSummary) -> str:
    """Median and p90 step time in milliseconds."""
    if s.step_time_median_s is None:
        return "not measured"
    p90 = "" if s.step_time_p90_s is None else f" / p90 {s.step_time_p90_s * 1000:,.1f} ms"
    return f"median {s.step_time_median_s * 1000:,.1f} ms{p90}"


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
        ("samples/s (job)", format_rate(s.samples_per_s, "samples/s", 1)),
        ("step time", format_step_time(s)),
        ("data wait share", format_share(s.data_wait_share)),
        ("GPU utilization (mean)", format_rate(s.gpu_utilization_mean_pct, "%", 0)),
    ]


def render_run_summary(console: Console, meta: RunMeta, s: RunSummary) -> None:
    """Print the run's headline: a heading, then one aligned line per row."""
    console.print(Text(f"trainmedic run {meta.run_id}", style="bold underline"))
    rows = header_rows(meta) + summary_rows(s)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        line = Text(f"  {label:<{width}}  ", style="dim")
        line.append(value)
        console.print(line)
