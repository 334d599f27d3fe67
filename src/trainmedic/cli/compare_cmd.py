"""``trainmedic compare RUN_A RUN_B``: did a change make training faster, beyond noise?

RUN_A is the run before the change, RUN_B the run after. The comparison
itself is :mod:`trainmedic.report.compare` (pure); this command loads the two
records and their findings, prints the comparison and writes ``--json`` /
``--html`` where asked. Bad input (a missing directory, one that is not a run,
a corrupt record) is one line and exit 2; nothing in the run directories is
ever written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from trainmedic.cli.options import json_option
from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.errors import InputError, UsageError


@click.command("compare")
@click.argument("before", metavar="RUN_A")
@click.argument("after", metavar="RUN_B")
@json_option("the comparison")
@click.option("--html", "html_out", metavar="FILE", help="Write the comparison as an HTML page.")
@click.option(
    "--force", is_flag=True, help="Replace an existing --json/--html file trainmedic did not write."
)
@click.option(
    "--min-effect",
    type=click.FloatRange(0.0, 0.5),
    default=0.03,
    show_default=True,
    metavar="FRACTION",
    help="Smallest speed-up (or slow-down) that counts, as a fraction (0.03 = 3 %).",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 0.999),
    default=0.95,
    show_default=True,
    help="Confidence of the interval of the throughput ratio.",
)
def compare(
    before: str,
    after: str,
    json_out: str | None,
    html_out: str | None,
    force: bool,
    min_effect: float,
    confidence: float,
) -> int:
    """Compare the run RUN_B (after a change) with RUN_A (before it): throughput with its
    confidence interval and a verdict (faster, slower, no_change), step-time breakdown,
    data wait, GPU use, and the findings resolved, still present or new."""
    from trainmedic.record.store import load_run_record
    from trainmedic.report.compare import compare_runs
    from trainmedic.report.compare_view import render_comparison, render_comparison_html
    from trainmedic.report.run_findings import load_or_diagnose

    dirs = (Path(before), Path(after))
    for flag, value in (("--json", json_out), ("--html", html_out)):
        if value not in (None, "-"):
            _outside_runs(flag, value, dirs)
    outputs = check_outputs({"--json": json_out, "--html": html_out}, force=force)
    records = [load_run_record(d) for d in dirs]
    documents = [load_or_diagnose(d, r) for d, r in zip(dirs, records, strict=True)]
    comparison = compare_runs(
        records[0],
        records[1],
        documents[0].findings,
        documents[1].findings,
        names=(_name(dirs[0]), _name(dirs[1])),
        min_effect=min_effect,
        confidence=confidence,
    )
    if json_out == "-":
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=2) + "\n")
    else:
        render_comparison(Console(highlight=False), comparison)
    if "--json" in outputs:
        data = json.dumps(comparison.to_dict(), indent=2) + "\n"
        write_output(outputs["--json"], lambda f: f.write(data))
        click.echo(f"json written to {json_out}", err=True)
    if "--html" in outputs:
        page = render_comparison_html(comparison, records[0], records[1])
        write_output(outputs["--html"], lambda f: f.write(page))
        click.echo(f"html written to {html_out}", err=True)
    return 0


def _name(directory: Path) -> str:
    return directory.resolve().name or str(directory)


def _outside_runs(flag: str, value: str, run_dirs: tuple[Path, Path]) -> None:
    """Refuse an output inside either run directory: a comparison is about them,
    never part of their record."""
    if not value:
        raise UsageError(f"{flag}: empty file name")
    parent = Path(value).resolve().parent
    for run_dir in run_dirs:
        if run_dir.is_dir() and parent == run_dir.resolve():
            raise InputError(f"{flag} {value}: would write into the run directory {run_dir}")


COMMAND = compare
