"""``trainmedic run -- CMD ...``: run a training command under supervision and diagnose it.

The job's output, exit code and Ctrl-C behave as without trainmedic; the run
record, ``findings.json`` and ``report.html`` go to the run directory, and a
summary with the findings is printed to stderr at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from trainmedic.cli.options import FAIL_ON_CHOICES, exit_code_for, simulate_option
from trainmedic.cli.resilience_options import resilience_options
from trainmedic.errors import UsageError
from trainmedic.findings.model import Finding, FindingsDocument

if TYPE_CHECKING:
    from trainmedic.supervise.attempts import ResilienceOptions

FINDINGS_FILE = "findings.json"
HTML_FILE = "report.html"


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--out",
    metavar="DIR",
    default=None,
    help="Run directory (new or empty). Default: ./trainmedic-runs/<time>-<name>/.",
)
@simulate_option
@click.option("--quiet", "-q", is_flag=True, help="No live status while the job runs.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option(
    "--no-probe",
    is_flag=True,
    help="Load nothing into the job: watch only its processes, the host and the GPUs.",
)
@click.option(
    "--fail-on",
    type=click.Choice(FAIL_ON_CHOICES),
    default="never",
    show_default=True,
    help="Exit 1 when the job succeeded but a finding reaches this severity.",
)
@click.option(
    "--apply-from",
    metavar="PATH",
    default=None,
    help="Apply the fixes a previous run directory's findings (or a tune --json file) "
    "recommend, inside the unmodified job (docs/remedies.md).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
@resilience_options
def run(
    out: str | None,
    simulate: str | None,
    quiet: bool,
    no_html: bool,
    no_probe: bool,
    fail_on: str,
    apply_from: str | None,
    command: tuple[str, ...],
    resilience: ResilienceOptions,
) -> int:
    """Run CMD (python train.py, python -m pkg.train, torchrun ..., any program)
    under supervision: its output passes through unchanged, its exit code is
    trainmedic's, and the run is diagnosed when it ends. A hang (no step for
    longer than the learned or given timeout) or a crash is classified, and the
    job restarted with remedies and resumed from its last checkpoint
    (docs/restarts.md); a bug is not restarted."""
    from trainmedic.simulation import load_simulation
    from trainmedic.supervise.rundir import default_run_dir, prepare_run_dir
    from trainmedic.supervise.session import RunOptions, RunSession

    argv = tuple(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command given (usage: trainmedic run [OPTIONS] -- CMD [ARGS]...)")
    if simulate is not None:
        load_simulation(simulate)  # a bad file is refused before anything runs
    environ = dict(os.environ)
    plan = None
    if apply_from is not None:
        from trainmedic.remedies.apply_plan import APPLY_ENV, plan_from

        if no_probe:
            raise UsageError("--apply-from needs the probe: drop --no-probe")
        plan = plan_from(apply_from)  # a bad source is refused before anything runs
        _announce_plan(plan)
        environ[APPLY_ENV] = plan.to_env()
    run_dir = Path(out) if out else default_run_dir(argv)
    created = prepare_run_dir(run_dir)
    options = RunOptions(
        argv=argv,
        run_dir=run_dir,
        simulate=simulate,
        live="off" if quiet else "auto",
        probe=not no_probe,
        created_dir=created,
        resilience=resilience,
    )
    outcome = RunSession(options, environ=environ).run()
    findings = _diagnose_and_report(
        run_dir, outcome, write_html=not no_html, plan=None if plan is None else plan.to_dict()
    )
    if outcome.exit_status == 0 and findings is not None:
        return exit_code_for(findings, fail_on)
    return outcome.exit_status


def _announce_plan(plan: Any) -> None:
    lines = plan.describe()
    head = "nothing to apply" if plan.empty else "applying"
    click.echo(f"trainmedic: {head} from {plan.source}:", err=True)
    for line in lines:
        click.echo(f"  {line}", err=True)


def _diagnose_and_report(
    run_dir: Path, outcome: object, write_html: bool, plan: dict[str, Any] | None = None
) -> list[Finding] | None:
    """Diagnose the closed record, write findings.json and report.html, print the summary.

    Any failure here is reported in one line: the job's exit code must still
    come out of ``trainmedic run``.
    """
    console = Console(file=sys.stderr, highlight=False)
    try:
        from trainmedic.diagnose import diagnose_run
        from trainmedic.record.stats import summarize
        from trainmedic.record.store import load_run_record
        from trainmedic.report.applied import render_applied
        from trainmedic.report.incidents import render_incidents
        from trainmedic.report.run_summary import render_run_summary
        from trainmedic.report.terminal import render_findings

        record = load_run_record(run_dir)
        findings = diagnose_run(record, getattr(outcome, "machine", None))
        document = FindingsDocument.build(
            "run",
            findings,
            created_at=time.time(),
            context={
                "run_id": record.meta.run_id,
                "command": list(record.meta.command),
                "exit_code": record.meta.exit_code,
                "run_dir": str(run_dir),
                **({"apply_plan": plan} if plan is not None else {}),
            },
        )
        _write_private(run_dir / FINDINGS_FILE, json.dumps(document.to_dict(), indent=2) + "\n")
        if write_html:
            from trainmedic.report.html import write_html_report

            html = run_dir / HTML_FILE
            write_html_report(record, list(document.findings), html)
            os.chmod(html, 0o600)
        console.print()
        render_run_summary(console, record.meta, summarize(record))
        console.print()
        render_incidents(console, record)
        render_applied(console, record, None if plan is None else str(plan.get("source")))
        render_findings(console, list(document.findings), "findings")
        where = run_dir / HTML_FILE if write_html else run_dir
        console.print(f"\nreport: {where}", soft_wrap=True, markup=False)
        return list(document.findings)
    except Exception as exc:
        console.print(
            f"trainmedic: error: the run was recorded in {run_dir} but could not be "
            f"diagnosed: {type(exc).__name__}: {' '.join(str(exc).split())}",
            highlight=False,
            markup=False,
        )
        return None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


COMMAND = run
