"""``trainmedic report RUN_DIR``: show a recorded run's report again, or export it.

The findings come from the run directory's ``findings.json`` (written by
``trainmedic run``); a run without one (killed supervisor, older record) is
diagnosed again from its record. Outputs go only where the user points: a
path that would overwrite a file of the run record itself is refused.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console

from trainmedic.cli.options import write_json
from trainmedic.errors import InputError, RunDirectoryError, UsageError
from trainmedic.findings.model import Finding, FindingsDocument
from trainmedic.record.types import RunRecord

FINDINGS_FILE = "findings.json"


@click.command("report")
@click.argument("run_dir", metavar="RUN_DIR")
@click.option(
    "--json",
    "json_out",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[FILE]",
    help="Write the findings document as JSON to FILE, or to stdout when no FILE is given.",
)
@click.option("--html", "html_out", metavar="FILE", help="Write a self-contained HTML report.")
@click.option(
    "--trace",
    "trace_out",
    metavar="FILE",
    help="Write a Chrome trace (JSON) for chrome://tracing or ui.perfetto.dev.",
)
@click.option("--brief", is_flag=True, help="Hide info findings in the terminal report.")
def report(
    run_dir: str, json_out: str | None, html_out: str | None, trace_out: str | None, brief: bool
) -> int:
    """Show the report of the run recorded in RUN_DIR (a directory written by
    'trainmedic run'), and optionally export it as JSON, HTML or a trace."""
    from trainmedic.record.store import load_run_record

    directory = Path(run_dir)
    requested = {"--json": json_out, "--html": html_out, "--trace": trace_out}
    outputs = _check_outputs(directory, requested)
    record = load_run_record(directory)
    document = load_or_diagnose(directory, record)
    findings = list(document.findings)

    to_stdout = json_out == "-"
    if to_stdout:
        sys.stdout.write(json.dumps(document.to_dict(), indent=2) + "\n")
    else:
        _print_report(record, findings, brief)
    if "--json" in outputs:
        write_json(outputs["--json"], document.to_dict())
    if "--html" in outputs:
        from trainmedic.report.html import write_html_report

        _write("--html", outputs["--html"], lambda p: write_html_report(record, findings, p))
    if "--trace" in outputs:
        from trainmedic.report.trace import write_chrome_trace

        _write("--trace", outputs["--trace"], lambda p: write_chrome_trace(record, p))
    for flag, path in outputs.items():
        click.echo(f"{flag[2:]} report written to {path}", err=to_stdout)
    return 0


def load_or_diagnose(run_dir: Path, record: RunRecord) -> FindingsDocument:
    """The run's findings: its findings.json, else a fresh diagnosis of ``record``."""
    path = run_dir / FINDINGS_FILE
    if path.is_file():
        try:
            return FindingsDocument.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except OSError as exc:
            raise RunDirectoryError(f"cannot read {path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            reason = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) else exc
            raise RunDirectoryError(f"{path}: malformed findings document: {reason}") from None
    try:
        from trainmedic.diagnose import diagnose_run
    except ImportError:
        raise RunDirectoryError(
            f"{run_dir} has no {FINDINGS_FILE} and this trainmedic cannot diagnose runs"
        ) from None
    return FindingsDocument.build(
        "run",
        diagnose_run(record),
        created_at=time.time(),
        context={
            "run_id": record.meta.run_id,
            "command": list(record.meta.command),
            "rediagnosed": True,
        },
    )


def _check_outputs(run_dir: Path, requested: dict[str, str | None]) -> dict[str, Path]:
    """The output paths, checked before any work: writable places, no clashes,
    and never a file of the run record."""
    from trainmedic.record.store import LINE_FILES, META_FILE

    protected = {*LINE_FILES, META_FILE, FINDINGS_FILE}
    outputs: dict[str, Path] = {}
    seen: dict[Path, str] = {}
    for flag, value in requested.items():
        if value is None or value == "-":
            continue
        if not value:
            raise UsageError(f"{flag}: empty file name")
        path = Path(value)
        if path.is_dir():
            raise InputError(f"{flag} {path}: is a directory")
        if not path.parent.is_dir():
            raise InputError(f"{flag} {path}: directory {path.parent} does not exist")
        resolved = path.resolve()
        if resolved in seen:
            raise UsageError(f"{flag} and {seen[resolved]} name the same file {path}")
        seen[resolved] = flag
        if run_dir.is_dir() and resolved.parent == run_dir.resolve() and path.name in protected:
            raise InputError(f"{flag} {path}: would overwrite the run record's {path.name}")
        outputs[flag] = path
    return outputs


def _write(flag: str, path: Path, write: Callable[[Path], None]) -> None:
    try:
        write(path)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None


def _print_report(record: RunRecord, findings: list[Finding], brief: bool) -> None:
    from trainmedic.record.stats import summarize
    from trainmedic.report.applied import render_applied
    from trainmedic.report.incidents import render_incidents
    from trainmedic.report.run_summary import render_run_summary
    from trainmedic.report.terminal import render_findings

    console = Console(highlight=False)
    render_run_summary(console, record.meta, summarize(record))
    console.print()
    render_incidents(console, record)
    render_applied(console, record)
    render_findings(console, findings, "findings", show_info=not brief)


COMMAND = report
