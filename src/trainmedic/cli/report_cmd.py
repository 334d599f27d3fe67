"""``trainmedic report RUN_DIR``: show a recorded run's report again, or export it.

The findings come from the run directory's ``findings.json`` (written by
``trainmedic run``); a run without one (killed supervisor, older record) is
diagnosed again from its record. Outputs go only where the user points, and
never over a file trainmedic did not write for that purpose (the rules are in
:mod:`trainmedic.cli.outputs`).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click
from rich.console import Console

from trainmedic.cli.options import json_option
from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.errors import InputError, UsageError
from trainmedic.findings.model import Finding
from trainmedic.ostext import path_problem, printable
from trainmedic.record.layout import FINDINGS_FILE
from trainmedic.record.types import RunRecord
from trainmedic.report.fix_text import Known
from trainmedic.report.run_findings import diagnose_merged, load_or_diagnose


@click.command("report")
@click.argument("run_dirs", metavar="RUN_DIR... | TRACE...", nargs=-1, required=True)
@json_option("the findings document")
@click.option("--html", "html_out", metavar="FILE", help="Write a self-contained HTML report.")
@click.option(
    "--trace",
    "trace_out",
    metavar="FILE",
    help="Write a Chrome trace (JSON) for chrome://tracing or ui.perfetto.dev.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing output file outside the run directory that trainmedic did "
    "not write.",
)
@click.option("--brief", is_flag=True, help="Hide info findings in the terminal report.")
def report(
    run_dirs: tuple[str, ...],
    json_out: str | None,
    html_out: str | None,
    trace_out: str | None,
    force: bool,
    brief: bool,
) -> int:
    """Show the report of the run recorded in RUN_DIR (a directory written by
    'trainmedic run'), and optionally export it as JSON, HTML or a trace.

    Several RUN_DIRs — one per node of a job across nodes — are merged into one
    report, their clocks aligned on the steps the ranks made in lockstep.

    TRACE: a torch.profiler (Kineto) trace, .json or .json.gz: why the GPU idles
    in each step (host syncs and their call sites, launch-bound steps, pageable
    copies, allocator churn, exposed communication; several ranks' traces
    compared), with --json for the findings document."""
    from trainmedic.cli.report_trace import is_trace_path, report_traces
    from trainmedic.record.store import load_run_record

    traces = [p for p in run_dirs if p and is_trace_path(p)]
    if traces:
        if len(traces) != len(run_dirs):
            raise UsageError("give run directories or torch.profiler traces, not both")
        report_traces(run_dirs, json_out, html_out, trace_out, force, brief)
        return 0
    directories: list[Path] = []
    for run_dir in run_dirs:
        if not run_dir:
            raise InputError("RUN_DIR is empty (give the run directory 'trainmedic run' wrote)")
        problem = path_problem(run_dir)
        if problem:
            raise InputError(f"run directory {printable(run_dir)}: {problem}")
        directory = Path(run_dir)
        if any(_same_dir(directory, d) for d in directories):
            raise InputError(f"run directory {printable(run_dir)} is given twice")
        directories.append(directory)
    requested = {"--json": json_out, "--html": html_out, "--trace": trace_out}
    outputs = {}
    for directory in reversed(directories):
        outputs = check_outputs(requested, run_dir=directory, force=force)
    records = [load_run_record(d) for d in directories]
    if len(records) == 1:
        record = records[0]
        document = load_or_diagnose(directories[0], record)
    else:
        from trainmedic.record.merge import merge_records, why_apart

        pairs = [(printable(str(d)), r) for d, r in zip(directories, records, strict=True)]
        apart = why_apart(pairs)
        if apart is not None:
            raise InputError(f"report: several directories are merged as one job's nodes; {apart}")
        record = merge_records(pairs)
        document = diagnose_merged(record)
    findings = list(document.findings)

    to_stdout = json_out == "-"
    data = document.to_json()
    known = _known(directories, record)
    if to_stdout:
        sys.stdout.write(data)
    else:
        _print_report(record, findings, brief, known)
    if "--json" in outputs:
        write_output(outputs["--json"], lambda f: f.write(data))
    if "--html" in outputs:
        from trainmedic.report.html import render_html_report

        page = render_html_report(record, findings, known)
        write_output(outputs["--html"], lambda f: f.write(page))
    if "--trace" in outputs:
        from trainmedic.report.trace import dump_chrome_trace

        write_output(outputs["--trace"], lambda f: dump_chrome_trace(record, f))
    for flag, output in outputs.items():
        click.echo(f"{flag[2:]} report written to {printable(str(output.path))}", err=to_stdout)
    return 0


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _known(directories: list[Path], record: RunRecord) -> Known:
    """What the fixes' placeholders stand for: one run's directory and command (several
    merged runs have no one directory), and where the full evidence is."""
    if len(directories) != 1:
        return Known(command=record.meta.command, evidence_at="trainmedic report ... --json -")
    directory = directories[0]
    stored = directory / FINDINGS_FILE
    try:
        evidence_at = str(stored) if stored.is_file() else None
    except OSError:
        evidence_at = None
    again = f"trainmedic report {shlex.quote(printable(str(directory)))} --json -"
    return Known(
        run_dir=directory,
        command=record.meta.command,
        evidence_at=printable(evidence_at) if evidence_at else again,
    )


def _print_report(
    record: RunRecord, findings: list[Finding], brief: bool, known: Known | None = None
) -> None:
    from trainmedic.record.stats import summarize
    from trainmedic.report.applied import render_applied
    from trainmedic.report.incidents import render_incidents
    from trainmedic.report.ranks import ranks_of_record, render_nodes, render_ranks
    from trainmedic.report.run_summary import render_run_summary
    from trainmedic.report.terminal import render_findings

    console = Console(highlight=False)
    render_run_summary(
        console, record.meta, summarize(record), ranks_of_record(record), bool(record.loaders)
    )
    console.print()
    render_nodes(console, record)
    render_ranks(console, record)
    render_incidents(console, record)
    render_applied(console, record)
    render_findings(console, findings, "findings", show_info=not brief, known=known)


COMMAND = report
