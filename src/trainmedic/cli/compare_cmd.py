"""``trainmedic compare RUN_A RUN_B``: did a change make training faster, beyond noise?

RUN_A is the run before the change, RUN_B the run after; repeated runs of each side
are given as ``RUN_A1 RUN_A2 ... -- RUN_B1 RUN_B2 ...`` (or ``:::`` between the
sides). The comparison
itself is :mod:`trainmedic.report.compare` (pure); this command loads the two
records and their findings, prints the comparison and writes ``--json`` /
``--html`` where asked. Bad input (a missing directory, one that is not a run,
a corrupt record) is one line and exit 2; nothing in the run directories is
ever written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

from trainmedic.cli.options import FiniteRange, json_option
from trainmedic.cli.outputs import Output, check_outputs, write_output
from trainmedic.errors import InputError, UsageError
from trainmedic.ostext import printable

if TYPE_CHECKING:
    from trainmedic.record.types import RunRecord
    from trainmedic.report.compare import Comparison

F = TypeVar("F", bound=Callable[..., Any])

SEPARATOR = ":::"


class _SidesCommand(click.Command):
    """``--`` between the run directories separates the sides, as ``:::`` does (click
    would otherwise drop it as the end of the options)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            args = [*args[:i], SEPARATOR, *args[i + 1 :]]
        return super().parse_args(ctx, args)


def split_sides(runs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The run directories before and after the change: ``A B``, or ``A1 A2 ::: B1 B2``."""
    if SEPARATOR in runs:
        i = runs.index(SEPARATOR)
        before, after = list(runs[:i]), list(runs[i + 1 :])
        if SEPARATOR in after:
            raise UsageError(f"compare: one {SEPARATOR} (or --) between the two sides, not more")
    elif len(runs) == 2:
        before, after = [runs[0]], [runs[1]]
    else:
        raise UsageError(
            "compare: give two run directories (before, after), or repeated runs of each "
            f"side as RUN_A1 RUN_A2 ... -- RUN_B1 RUN_B2 ... ({len(runs)} given)"
        )
    if not before or not after:
        raise UsageError("compare: each side needs at least one run directory")
    repeated = {r for r in before + after if (before + after).count(r) > 1}
    if repeated:
        raise UsageError(f"compare: {sorted(repeated)[0]} is given more than once")
    return before, after


def comparison_options(f: F) -> F:
    """The options of a comparison's outputs and threshold (``compare``, ``bench``)."""
    for option in reversed((
        json_option("the comparison"),
        click.option("--html", "html_out", metavar="FILE",
                     help="Write the comparison as an HTML page."),
        click.option("--force", is_flag=True,
                     help="Replace an existing --json/--html file trainmedic did not write."),
        click.option("--min-effect", type=FiniteRange(0.0, 0.5), default=0.03,
                     show_default=True, metavar="FRACTION",
                     help="Smallest speed-up (or slow-down) that counts, as a fraction "
                     "(0.03 = 3 %)."),
    )):  # fmt: skip
        f = option(f)
    return f


def emit(
    comparison: Comparison,
    before: Sequence[RunRecord],
    after: Sequence[RunRecord],
    outputs: dict[str, Output],
    json_out: str | None,
    html_out: str | None,
) -> None:
    """The comparison on the terminal (or as JSON on stdout, ``--json`` alone), and to
    the ``--json``/``--html`` files asked for."""
    from trainmedic.report.compare_view import render_comparison, render_comparison_html

    if json_out == "-":
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=2) + "\n")
    else:
        render_comparison(Console(highlight=False), comparison)
    if "--json" in outputs:
        data = json.dumps(comparison.to_dict(), indent=2) + "\n"
        write_output(outputs["--json"], lambda f: f.write(data))
        click.echo(f"json written to {json_out}", err=True)
    if "--html" in outputs:
        page = render_comparison_html(comparison, before, after)
        write_output(outputs["--html"], lambda f: f.write(page))
        click.echo(f"html written to {html_out}", err=True)


@click.command("compare", cls=_SidesCommand)
@click.argument("runs", nargs=-1, metavar="RUN_A RUN_B | RUN_A1 ... -- RUN_B1 ...")
@comparison_options
@click.option(
    "--confidence",
    type=FiniteRange(0.5, 0.999),
    default=0.95,
    show_default=True,
    help="Confidence of the interval of the throughput ratio.",
)
@click.option(
    "--run-noise",
    type=FiniteRange(0.0, 1.0),
    default=None,
    metavar="FRACTION",
    help="Run-to-run noise of an unchanged job's throughput on this machine (log standard "
    "deviation; default 0.12, measured as docs/compare.md says): the interval is never "
    "narrower than it allows.",
)
def compare(
    runs: tuple[str, ...],
    json_out: str | None,
    html_out: str | None,
    force: bool,
    min_effect: float,
    confidence: float,
    run_noise: float | None,
) -> int:
    """Compare runs after a change (RUN_B) with runs before it (RUN_A): throughput with its
    confidence interval and a verdict (faster, slower, no_change, inconclusive with the
    reasons), step-time breakdown, data wait, GPU use, and the findings resolved, still
    present or new. Repeated runs of each side, separated by --, fold the run-to-run
    noise into the interval."""
    from trainmedic.record.store import load_run_record
    from trainmedic.report.compare import RUN_NOISE, compare_groups
    from trainmedic.report.run_findings import load_or_diagnose

    before, after = split_sides(runs)
    dirs = tuple(Path(d) for d in before + after)
    for flag, value in (("--json", json_out), ("--html", html_out)):
        if value not in (None, "-"):
            _outside_runs(flag, value, dirs)
    outputs = check_outputs({"--json": json_out, "--html": html_out}, force=force)
    records = [load_run_record(d) for d in dirs]
    documents = [load_or_diagnose(d, r) for d, r in zip(dirs, records, strict=True)]
    n = len(before)
    comparison = compare_groups(
        records[:n],
        records[n:],
        [d.findings for d in documents[:n]],
        [d.findings for d in documents[n:]],
        names=([_name(d) for d in dirs[:n]], [_name(d) for d in dirs[n:]]),
        min_effect=min_effect,
        confidence=confidence,
        run_noise=RUN_NOISE if run_noise is None else run_noise,
    )
    emit(comparison, records[:n], records[n:], outputs, json_out, html_out)
    return 0


def _name(directory: Path) -> str:
    return directory.resolve().name or str(directory)


def _outside_runs(flag: str, value: str, run_dirs: tuple[Path, ...]) -> None:
    """Refuse an output inside either run directory: a comparison is about them,
    never part of their record."""
    if not value:
        raise UsageError(f"{flag}: empty file name")
    try:
        target = Path(value).resolve()  # through links: where the bytes would go
    except (OSError, RuntimeError):
        return  # check_outputs says what is wrong with the path
    for run_dir in run_dirs:
        root = run_dir.resolve() if run_dir.is_dir() else None
        if root is not None and (target == root or root in target.parents):
            raise InputError(
                f"{printable(flag)} {printable(value)}: would write into the run directory "
                f"{printable(str(run_dir))} (choose a path outside the runs compared)"
            )


COMMAND = compare
