"""``trainmedic report TRACE.json[.gz] ...``: why the GPU idles, from torch.profiler traces.

Each trace is read as a stream (:mod:`trainmedic.traces.kineto`, a progress
bar on standard error while it reads) and judged by
:mod:`trainmedic.diagnose.trace_rules`; the report is the terminal one and,
with ``--html``, a page with a bar per step splitting its time into what the
GPU did and why it idled (:mod:`trainmedic.report.trace_html`); with
``--json``, the findings document, whose ``context`` carries ``steps``,
``step_time_median_s`` and ``gpu_busy_share`` (several traces: one entry each
under ``traces``). Traces of one job's ranks (distinct ranks, one world size)
are also compared (:mod:`trainmedic.diagnose.trace_ranks`: the rank the others
wait for), with each rank's medians under ``ranks``. A trace without
``ProfilerStep`` spans is one line saying what it holds and how to record
steps, exit 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.errors import InputError, UsageError
from trainmedic.findings.model import Finding, FindingsDocument
from trainmedic.ostext import printable
from trainmedic.traces.kineto import TraceSummary, read_trace

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")


def is_trace_path(path: str) -> bool:
    """A regular file that a trace may be (a ``.json``/``.gz`` name, or gzip or JSON
    bytes first): what ``report`` reads as a trace; other files are refused as run
    directories."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        if p.name.endswith(TRACE_SUFFIXES):
            return True
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError:
        return False  # (a name too long, a loop of links: the run-directory checks say so)
    return head.startswith(b"\x1f\x8b") or head.lstrip()[:1] in (b"{", b"[")


def _read(path: Path) -> TraceSummary:
    size = path.stat().st_size
    if not sys.stderr.isatty():
        return read_trace(path)
    columns = (TextColumn("reading {task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(printable(path.name), total=size)
        return read_trace(path, on_read=lambda done: bar.update(task, completed=done))


def _context(t: TraceSummary) -> dict[str, Any]:
    ctx: dict[str, Any] = {
        "trace": t.path,
        "steps": len(t.steps),
        "step_time_median_s": t.step_time_median_s,
        "gpu_busy_share": round(t.gpu_busy_share, 4) if t.gpu_busy_share is not None else None,
        "events": t.events,
    }
    if t.device is not None:
        ctx["gpu"] = {"index": t.device.index, "name": t.device.name,
                      "compute_capability": t.device.compute_capability}  # fmt: skip
    if t.rank is not None:
        ctx["rank"] = t.rank
    if t.world_size is not None:
        ctx["world_size"] = t.world_size
    return ctx


def report_traces(
    paths: tuple[str, ...],
    json_out: str | None,
    html_out: str | None,
    trace_out: str | None,
    force: bool,
    brief: bool,
) -> FindingsDocument:
    """Report the traces at ``paths``; the findings document reported."""
    from trainmedic.diagnose.trace_ranks import attribute_waits, compare_ranks, one_job, per_rank
    from trainmedic.diagnose.trace_rules import diagnose_trace
    from trainmedic.report.terminal import render_findings

    if trace_out:
        raise UsageError("--trace is for run directories; a trace gets the terminal report, "
                         "--json and --html")  # fmt: skip
    outputs = check_outputs({"--json": json_out, "--html": html_out}, force=force)
    inputs: set[Path] = set()
    for p in paths:
        if Path(p).resolve() in inputs:
            raise InputError(f"trace {printable(p)} is given twice")
        inputs.add(Path(p).resolve())
    for flag, output in outputs.items():
        if output.target.resolve() in inputs:
            raise UsageError(f"{flag} {printable(str(output.path))} is one of the traces read")
    summaries = []
    for p in paths:
        t = _read(Path(p))
        if not t.steps:
            gpu = f" on {t.device.name}" if t.device is not None and t.device.name else ""
            raise InputError(
                f"{printable(p)}: no ProfilerStep#N spans ({t.events} events, {t.kernels} "
                f"kernels{gpu}): record the trace with torch.profiler.profile(schedule=...) "
                "and call prof.step() after each training step"
            )
        summaries.append(t)
    compared = compare_ranks(summaries)
    findings: list[Finding] = list(compared)
    for t in summaries:
        findings.extend(attribute_waits(diagnose_trace(t), t, compared))
    context = _context(summaries[0]) if len(summaries) == 1 else {
        "traces": [_context(t) for t in summaries]}  # fmt: skip
    if one_job(summaries):
        context["ranks"] = per_rank(summaries)
    document = FindingsDocument.build("report", findings, time.time(), context)
    data = document.to_json()
    to_stdout = json_out == "-"
    if to_stdout:
        sys.stdout.write(data)
    else:
        console = Console(highlight=False)
        for t in summaries:
            busy = t.gpu_busy_share or 0.0
            step = (t.step_time_median_s or 0.0) * 1000
            where = f"{t.device.name} " if t.device is not None and t.device.name else ""
            rank = f", rank {t.rank} of {t.world_size}" if t.rank is not None else ""
            gpu = (f"{where}GPU busy {busy:.0%} of each step (median)" if t.device is not None
                   else "no GPU activity recorded (CPU activities only): nothing to judge "
                        "on the GPU side")  # fmt: skip
            console.print(
                f"[bold]{printable(Path(t.path).name)}[/]: {len(t.steps)} steps, median "
                f"{step:.1f} ms, {gpu}{rank}"
            )
        console.print()
        render_findings(console, document.findings, "findings", show_info=not brief)
    if "--html" in outputs:
        from trainmedic.report.trace_html import render_trace_html

        page = render_trace_html(summaries, document.findings, context.get("ranks"))
        write_output(outputs["--html"], lambda f: f.write(page))
        click.echo(f"html report written to {printable(str(outputs['--html'].path))}",
                   err=to_stdout)  # fmt: skip
    if "--json" in outputs:
        write_output(outputs["--json"], lambda f: f.write(data))
        click.echo(f"json report written to {printable(str(outputs['--json'].path))}",
                   err=to_stdout)  # fmt: skip
    return document
