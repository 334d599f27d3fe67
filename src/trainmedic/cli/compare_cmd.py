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

from trainmedic.cli.options import write_json
from trainmedic.errors import InputError, UsageError


@click.command("compare")
@click.argument("before", metavar="RUN_A")
@click.argument("after", metavar="RUN_B")
@click.option(
    "--json",
    "json_out",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[FILE]",
    help="Write the comparison as JSON to FILE, or to stdout when no FILE is given.",
)
@click.option("--html", "html_out", metavar="FILE", help="Write the comparison as an HTML page.")
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
    min_effect: float,
    confidence: float,
) -> int:
    """Compare the run RUN_B (after a change) with RUN_A (before it): throughput with its
    confidence interval and a verdict (faster, slower, no_change), step-time breakdown,
    data wait, GPU use, and the findings resolved, still present or new."""
    from trainmedic.cli.report_cmd import load_or_diagnose
    from trainmedic.record.store import load_run_record
    from trainmedic.report.compare import compare_runs
    from trainmedic.report.compare_view import render_comparison, write_comparison_html

    dirs = (Path(before), Path(after))
    json_path = _output("--json", json_out, dirs) if json_out not in (None, "-") else None
    html_path = _output("--html", html_out, dirs) if html_out is not None else None
    if (
        json_path is not None
        and html_path is not None
        and json_path.resolve() == html_path.resolve()
    ):
        raise UsageError(f"--json and --html name the same file {json_path}")
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
    if json_path is not None:
        write_json(json_path, comparison.to_dict())
        click.echo(f"json written to {json_path}", err=json_out == "-")
    if html_path is not None:
        try:
            write_comparison_html(comparison, records[0], records[1], html_path)
        except OSError as exc:
            raise InputError(f"--html {html_path}: cannot write: {exc.strerror or exc}") from None
        click.echo(f"html written to {html_path}", err=json_out == "-")
    return 0


def _name(directory: Path) -> str:
    return directory.resolve().name or str(directory)


def _output(flag: str, value: str, run_dirs: tuple[Path, Path]) -> Path:
    """An output path that is writable and never a file of either run."""
    if not value:
        raise UsageError(f"{flag}: empty file name")
    path = Path(value)
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory")
    if not path.parent.is_dir():
        raise InputError(f"{flag} {path}: directory {path.parent} does not exist")
    for run_dir in run_dirs:
        if run_dir.is_dir() and path.resolve().parent == run_dir.resolve():
            raise InputError(f"{flag} {path}: would write into the run directory {run_dir}")
    return path


COMMAND = compare
