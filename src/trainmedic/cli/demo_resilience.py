"""``trainmedic demo --scenario hang|crash|oom``: a fault, caught, restarted and resumed.

The fault scenarios (:mod:`trainmedic.demo.resilience_scenarios`) run the
demo's faulty training script through the ``run`` command itself, with a
short fixed timeout and no backoff, then say what happened: the incident,
where the stacks are, the remedy, the resume step. Exit code: 0 when it went
as the scenario promises, else 1 (or the job's exit code when it failed).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from trainmedic.demo.resilience_scenarios import (
    RESILIENCE_SCENARIOS,
    SCRIPT,
    ResilienceScenario,
    judge,
)


def list_resilience_scenarios() -> None:
    for s in RESILIENCE_SCENARIOS.values():
        click.echo(f"{s.name} [fault]: {s.expectation}")
        click.echo(f"    {s.story}")


def run_resilience_demo(ctx: click.Context, name: str, out: str | None, quiet: bool) -> int:
    """Run the fault scenario ``name``; see the module docstring."""
    from trainmedic.cli.run_cmd import COMMAND as run_command
    from trainmedic.record.store import load_run_record
    from trainmedic.resilience.incidents import attempts_from_events
    from trainmedic.supervise.rundir import default_run_dir

    s = RESILIENCE_SCENARIOS[name]
    run_dir = Path(out) if out else default_run_dir([f"demo-{s.name}"])
    argv = [sys.executable, str(SCRIPT), *s.script_args()]
    options = s.run_options()
    if not quiet:
        _introduce(s, run_dir, argv, options)
    code = ctx.invoke(run_command, out=str(run_dir), quiet=quiet, command=tuple(argv), **options)
    exit_code = code if isinstance(code, int) else 1
    try:
        record = load_run_record(run_dir)
    except Exception as exc:
        _say(f"\ndemo ({s.name}): the run was not recorded: {exc}")
        return exit_code or 1
    verdict = judge(s, attempts_from_events(record.events), exit_code)
    _say(f"\ndemo ({s.name}): {'as expected' if verdict.ok else 'NOT as expected'}: ")
    _say(f"  {verdict.message}")
    _say(f"  run directory: {run_dir} (attempts/1/ holds the first attempt's evidence)")
    _say(f"  again: trainmedic report {shlex.quote(str(run_dir))}")
    if exit_code != 0:
        return exit_code
    return 0 if verdict.ok else 1


def _introduce(
    s: ResilienceScenario, run_dir: Path, argv: list[str], options: dict[str, object]
) -> None:
    flags = [
        "--timeout",
        f"{options['timeout_s']:g}",
        "--max-restarts",
        str(options["max_restarts"]),
        "--backoff",
        "0",
    ]
    _say(f"trainmedic demo: {s.name}")
    _say(f"  {s.story}")
    _say(f"  expected: {s.expectation}")
    run = ["trainmedic", "run", "--out", str(run_dir), *flags, "--", *argv]
    _say(f"  running: {shlex.join(run)}\n")


def _say(text: str) -> None:
    click.echo(text, err=True)
