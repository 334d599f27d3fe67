"""``trainmedic bench --runs N -- CMD_A ::: CMD_B``: prove a change on a shared machine.

Runs the two commands in turns (:mod:`trainmedic.bench`), each under ``trainmedic
run`` into a directory of its own inside the bench directory, with a progress bar
on standard error, then compares the finished runs of each side as ``trainmedic
compare A1 A2 ... -- B1 B2 ...`` does: repeated runs fold the run-to-run noise into
the interval. Ctrl-C stops the run under way (its record is kept, not compared)
and compares what finished. A run that fails is left out of the comparison and
named. Bad input is one line and exit 2.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from trainmedic.cli.compare_cmd import comparison_options, emit
from trainmedic.cli.outputs import check_outputs
from trainmedic.errors import InputError, UsageError

if TYPE_CHECKING:
    from trainmedic.bench import PlannedRun
    from trainmedic.record.types import RunRecord
    from trainmedic.report.compare import Comparison


@click.command(
    "bench", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option(
    "--runs",
    type=click.IntRange(1, 100),
    default=5,
    show_default=True,
    help="Runs of each command.",
)
@click.option(
    "--out",
    "out",
    metavar="DIR",
    help="Bench directory (new or empty), holding a run directory per run. "
    "Default: ./trainmedic-runs/<time>-bench-<name>/.",
)
@comparison_options
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD_A ::: CMD_B")
def bench(
    runs: int,
    out: str | None,
    json_out: str | None,
    html_out: str | None,
    force: bool,
    min_effect: float,
    argv: tuple[str, ...],
) -> int:
    """Run CMD_A and CMD_B --runs times each, in turns, under trainmedic run, and compare
    them: the way to prove a fix on a shared machine (CMD_A before the change, CMD_B
    after it)."""
    from trainmedic.bench import plan, split_commands
    from trainmedic.supervise.rundir import command_name, default_run_dir, prepare_run_dir, release

    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and argv[0].startswith("-"):
        raise UsageError(f"bench: no such option: {argv[0]} (commands go after --)")
    try:
        a, b = split_commands(argv)
    except ValueError as exc:
        raise UsageError(f"bench: {exc}") from None
    outputs = check_outputs({"--json": json_out, "--html": html_out}, force=force)
    name = f"bench-{command_name(a)}"
    directory = Path(out) if out else default_run_dir(("bench", f"{name}.py"))
    prepared = prepare_run_dir(directory, default=not out)
    directory = prepared.path
    planned = plan(a, b, runs)
    try:
        finished, failed, interrupted = _run_all(planned, directory)
    finally:
        release(prepared)
    comparison, records = _compare(finished, directory, min_effect)
    for run, why in failed:
        # On stderr: stdout may carry the JSON.
        click.echo(f"left out: {run} ({why})", err=True)
    if comparison is None:
        raise InputError(
            f"bench: no comparison: each command needs a finished run ({directory}: "
            f"{len(finished['a'])} of A, {len(finished['b'])} of B)"
        )
    emit(comparison, records[0], records[1], outputs, json_out, html_out)
    if json_out != "-":
        click.echo(f"runs: {directory}")
    return 130 if interrupted else 0


def _run_all(
    planned: list[PlannedRun], directory: Path
) -> tuple[dict[str, list[str]], list[tuple[str, str]], bool]:
    """Run the plan in order, with a progress bar; stop at Ctrl-C. Returns the finished
    runs' names by side, the failed ones with why, and whether it was interrupted."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    finished: dict[str, list[str]] = {"a": [], "b": []}
    failed: list[tuple[str, str]] = []
    progress = Progress(
        TextColumn("bench {task.completed}/{task.total}: {task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with progress:
        task = progress.add_task("starting", total=len(planned))
        for run in planned:
            progress.update(task, description=f"{run.name} ({' '.join(run.command)[:60]})")
            code = _run_one(run, directory)
            progress.advance(task)
            if code is None:
                failed.append((run.name, "interrupted: its record is kept, not compared"))
                return finished, failed, True
            if code == 0:
                finished[run.side].append(run.name)
            else:
                failed.append((run.name, f"exited {code}: see {directory / run.name}.log"))
    return finished, failed, False


def _run_one(run: PlannedRun, directory: Path) -> int | None:
    """One run under ``trainmedic run``; its exit code, or ``None`` at Ctrl-C (the run,
    which gets the same SIGINT, is waited for while it stops its job)."""
    from trainmedic.bench import run_argv

    argv = run_argv(sys.executable, run, directory / run.name)
    with (directory / f"{run.name}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    proc.wait(timeout=1)
                except (subprocess.TimeoutExpired, KeyboardInterrupt):
                    continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            return None


def _compare(
    finished: dict[str, list[str]], directory: Path, min_effect: float
) -> tuple[Comparison | None, tuple[list[RunRecord], list[RunRecord]]]:
    """The comparison of the finished runs (``None`` when a side has none), and their
    records, before and after."""
    from trainmedic.record.store import load_run_record
    from trainmedic.report.compare import compare_groups
    from trainmedic.report.run_findings import load_or_diagnose

    if not finished["a"] or not finished["b"]:
        return None, ([], [])
    sides = []
    for side in ("a", "b"):
        dirs = [directory / name for name in finished[side]]
        records = [load_run_record(d) for d in dirs]
        docs = [load_or_diagnose(d, r) for d, r in zip(dirs, records, strict=True)]
        sides.append((records, [d.findings for d in docs], finished[side]))
    comparison = compare_groups(
        sides[0][0], sides[1][0], sides[0][1], sides[1][1],
        names=(sides[0][2], sides[1][2]), min_effect=min_effect,
    )  # fmt: skip
    return comparison, (sides[0][0], sides[1][0])


COMMAND = bench
