"""``trainmedic run -- CMD ...``: run a training command under supervision and diagnose it.

The job's output, exit code and Ctrl-C behave as without trainmedic; the run
record, ``findings.json`` and ``report.html`` go to the run directory, and a
summary with the findings is printed to stderr at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from trainmedic.atomicfile import write_atomic
from trainmedic.cli.options import FAIL_ON_CHOICES, exit_code_for, simulate_option
from trainmedic.cli.resilience_options import resilience_options
from trainmedic.errors import InputError, UsageError
from trainmedic.findings.model import Finding
from trainmedic.ostext import printable, visible
from trainmedic.record.guard import record_loss_finding
from trainmedic.record.layout import FINDINGS_FILE, HTML_FILE, PROFILES_DIR
from trainmedic.report.fix_text import Known
from trainmedic.report.run_findings import run_document

if TYPE_CHECKING:
    from trainmedic.record.types import RunRecord
    from trainmedic.supervise.live.metrics_server import Exporter
    from trainmedic.supervise.loop.attempts import ResilienceOptions
    from trainmedic.supervise.session import RunOutcome
    from trainmedic.traces.windows import WindowTrace


@click.command(
    "run",
    # Options end at the first argument that is not one (or at "--"): everything
    # after it is the job's, "--quiet" included. Before it, an unknown option is
    # a usage error, never the command.
    context_settings={"allow_interspersed_args": False},
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
@click.option(
    "--apply-anyway",
    is_flag=True,
    default=False,
    help="With --apply-from: apply a run's fixes to another script than the one it ran.",
)
@click.option(
    "--prometheus",
    metavar="[ADDR:]PORT",
    default=None,
    help="Serve metrics for Prometheus at http://ADDR:PORT/metrics while the job runs "
    "(127.0.0.1 unless ADDR is given; names in docs/metrics.md).",
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
    apply_anyway: bool,
    prometheus: str | None,
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
    from trainmedic.supervise.launch.launcher import resolve_command
    from trainmedic.supervise.rundir import default_run_dir

    argv = tuple(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command given (usage: trainmedic run [OPTIONS] -- CMD [ARGS]...)")
    # Everything that can be refused is refused before anything is created.
    try:
        os.getcwd()
    except OSError as exc:  # run from a directory removed meanwhile
        raise UsageError(
            f"the current directory cannot be used ({exc.strerror}): cd to one that exists"
        ) from None
    if simulate is not None:
        load_simulation(simulate)  # a bad file is refused before anything runs
    resolve_command(argv[0], os.environ)
    if not no_probe:
        from trainmedic.probe.env import settings_problem

        wrong = settings_problem(os.environ)
        if wrong is not None:
            raise UsageError(wrong)
    listen = None
    if prometheus is not None:
        from trainmedic.supervise.live.metrics_server import parse_listen

        listen = parse_listen(prometheus)
    environ = dict(os.environ)
    plan = None
    if apply_anyway and apply_from is None:
        raise UsageError("--apply-anyway goes with --apply-from")
    if apply_from is not None:
        from trainmedic.remedies.apply.plan import APPLY_ENV, plan_from

        if no_probe:
            raise UsageError("--apply-from needs the probe: drop --no-probe")
        plan = plan_from(apply_from)  # a bad source is refused before anything runs
        other = None if apply_anyway else _other_script(plan, argv)
        if other:
            raise InputError(f"--apply-from {printable(apply_from)}: {other}")
        _announce_plan(plan)
        environ[APPLY_ENV] = plan.to_env()
    if out is not None and not out.strip():
        raise UsageError("--out: empty directory name (leave --out out for the default)")
    run_dir = Path(out) if out else default_run_dir(argv)
    with contextlib.ExitStack() as stack:
        exporter = None
        if listen is not None:
            from trainmedic.supervise.live.metrics import MetricsState
            from trainmedic.supervise.live.metrics_server import start_exporter

            # Bound before anything is created: a port in use is a usage error.
            exporter = start_exporter(MetricsState(printable(run_dir.name)), listen)
            stack.callback(exporter.close)
        return _run(
            argv, run_dir, simulate, quiet, no_html, no_probe, fail_on, plan, environ,
            resilience, exporter, default=not out,
        )  # fmt: skip


def _run(
    argv: tuple[str, ...],
    run_dir: Path,
    simulate: str | None,
    quiet: bool,
    no_html: bool,
    no_probe: bool,
    fail_on: str,
    plan: Any,
    environ: dict[str, str],
    resilience: ResilienceOptions,
    exporter: Exporter | None,
    default: bool = False,
) -> int:
    from trainmedic.supervise.rundir import prepare_run_dir, release, remove_unused
    from trainmedic.supervise.session import RunOptions, RunSession

    prepared = prepare_run_dir(run_dir, default=default)
    run_dir = prepared.path  # a default name another run took first moves on
    if exporter is not None:
        _say(f"trainmedic: metrics at {exporter.url}")
        from trainmedic.supervise.live.metrics_server import reachable_from_others

        if reachable_from_others(exporter.address):
            _say(
                f"trainmedic: warning: other machines can read {exporter.url} (the job's "
                "command and its rates); --prometheus 127.0.0.1:PORT keeps it on this one"
            )
    options = RunOptions(
        argv=argv,
        run_dir=run_dir,
        simulate=simulate,
        live="off" if quiet else "auto",
        probe=not no_probe,
        created_dir=prepared.created,
        resilience=resilience,
    )
    try:
        outcome = RunSession(
            options, environ=environ, metrics=None if exporter is None else exporter.state
        ).run()
    except BaseException:
        remove_unused(prepared)  # only what it created, and only when empty
        raise
    release(prepared)  # the record is closed: its meta.json now keeps others out
    # With the disk full, the few MB of report.html would only fail.
    html = not no_html and outcome.record_loss is None
    try:
        with _stopped_by_signals():
            findings = _diagnose_and_report(
                run_dir, outcome, write_html=html, plan=None if plan is None else plan.to_dict()
            )
    except (KeyboardInterrupt, _Stopped) as exc:
        # The job has ended: Ctrl-C, SIGTERM or SIGHUP now stops the report, never
        # changes the job's status.
        why = f"stopped by {exc.name}" if isinstance(exc, _Stopped) else "interrupted"
        _say(
            f"trainmedic: {why}: the report was not finished; the job's exit status "
            f"{outcome.exit_status} stands (see the report with 'trainmedic report "
            f"{printable(str(run_dir))}')"
        )
        return outcome.exit_status
    if exporter is not None and findings is not None:
        exporter.state.set_findings(findings)
    if prepared.note:
        _say(f"trainmedic: note: {prepared.note}")
    if outcome.record_loss is not None:
        message = outcome.record_loss.message(run_dir, outcome.started_at)
        _say(f"trainmedic: warning: {message}" + ("" if no_html else " (no report.html)"))
    if outcome.exit_status == 0 and findings is not None:
        return exit_code_for(findings, fail_on)
    return outcome.exit_status


def _other_script(plan: Any, argv: Sequence[str]) -> str | None:
    """Why ``plan`` does not fit ``argv``'s script (``None`` when it does): fixes
    measured on one script's data and model are no evidence for another's. Scripts are
    told apart by name (``command_name``: the script's stem, the ``-m`` module)."""
    from trainmedic.supervise.rundir import command_name

    if not plan.made_for or plan.empty:
        return None
    before, now = command_name(plan.made_for), command_name(argv)
    if before == now:
        return None
    return (
        f"that run was of {before}, this command runs {now}: its fixes were measured on "
        f"{before}'s data and model (add --apply-anyway to apply them all the same)"
    )


class _Stopped(BaseException):
    """SIGTERM or SIGHUP while the report is made (the job has ended); a
    ``BaseException``, like ``KeyboardInterrupt``, so that no handler of a step
    of the report takes it for that step's failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`_Stopped` meanwhile (their default would end
    trainmedic with 143/129 and the job's status lost); the handlers before are restored."""

    def stop(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave them
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)


def _say(line: str) -> None:
    """One line on stderr; a closed stderr must not change the exit status."""
    with contextlib.suppress(OSError, ValueError):
        click.echo(visible(line), err=True)


def _announce_plan(plan: Any) -> None:
    head = "nothing to apply" if plan.empty else "applying"
    _say(f"trainmedic: {head} from {plan.source}:")
    for line in plan.describe():
        _say(f"  {line}")


def _diagnose_and_report(
    run_dir: Path, outcome: RunOutcome, write_html: bool, plan: dict[str, Any] | None = None
) -> list[Finding] | None:
    """Diagnose the closed record, write findings.json and report.html, print the summary.

    Each failure here is one line, and none stops the others: the findings are
    printed even when the disk refuses findings.json, and the job's exit code
    comes out of ``trainmedic run`` whatever happens.
    """
    console = _StderrConsole(file=sys.stderr, highlight=False)
    shown = printable(str(run_dir))
    try:
        from trainmedic.diagnose import diagnose_run
        from trainmedic.record.store import load_run_record
        from trainmedic.traces.windows import read_window_traces

        record = load_run_record(run_dir)
        windows = read_window_traces(run_dir)
        for problem in windows.problems:
            _say(f"trainmedic: a profiler window's trace was not read: {problem}")
        findings = list(diagnose_run(record, outcome.machine, windows=windows.traces))
    except Exception as exc:
        _say(
            f"trainmedic: error: the run was recorded in {shown} but could not be "
            f"diagnosed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        )
        return None
    if outcome.record_loss is not None:
        findings.append(record_loss_finding(outcome.record_loss, shown, outcome.started_at))
    document = run_document(
        record,
        findings,
        exit_code=record.meta.exit_code,
        run_dir=shown,
        **({"profile_windows": _window_context(windows.traces)} if windows.traces else {}),
        **({"apply_plan": plan} if plan is not None else {}),
    )
    ranked = list(document.findings)
    where: Path | None = run_dir
    wrote = _write_file(run_dir / FINDINGS_FILE, document.to_json)
    known = Known(
        run_dir=run_dir,
        command=record.meta.command,
        evidence_at=printable(str(run_dir / FINDINGS_FILE)) if wrote else None,
    )
    if not wrote:
        where = None
    if write_html:
        from trainmedic.report.html import render_html_report

        if _write_file(run_dir / HTML_FILE, lambda: render_html_report(record, ranked, known)):
            where = run_dir / HTML_FILE
    with contextlib.suppress(OSError, ValueError):
        _print_summary(console, record, ranked, where, plan, known)
    return ranked


def _window_context(windows: Sequence[WindowTrace]) -> list[dict[str, Any]]:
    """What each profiler window's trace showed, for the findings document's context."""
    return [
        {
            "profile": f"{PROFILES_DIR}/{w.file}",
            "pid": w.pid,
            "after_step": w.after_step,
            "steps": len(w.summary.steps),
            "step_time_median_s": w.summary.step_time_median_s,
            "gpu_busy_share": (round(w.summary.gpu_busy_share, 4)
                               if w.summary.device is not None and w.summary.gpu_busy_share
                               is not None else None),
        }
        for w in windows
    ]  # fmt: skip


class _StderrConsole(Console):
    """A console whose closed stream is an ``OSError`` to suppress: rich's default
    ends the process (``SystemExit(1)``), which would replace the job's exit status."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def _print_summary(
    console: Console,
    record: RunRecord,
    findings: list[Finding],
    where: Path | None,
    plan: dict[str, Any] | None = None,
    known: Known | None = None,
) -> None:
    from trainmedic.record.stats import summarize
    from trainmedic.report.applied import render_applied
    from trainmedic.report.incidents import render_incidents
    from trainmedic.report.ranks import ranks_of_record, render_ranks
    from trainmedic.report.run_summary import render_run_summary
    from trainmedic.report.terminal import render_findings

    console.print()
    render_run_summary(
        console, record.meta, summarize(record), ranks_of_record(record), bool(record.loaders)
    )
    console.print()
    render_ranks(console, record)
    render_incidents(console, record)
    render_applied(console, record, None if plan is None else str(plan.get("source")), plan)
    render_findings(console, findings, "findings", known=known)
    if where is not None:
        console.print(f"\nreport: {printable(str(where))}", soft_wrap=True, markup=False)


def _write_file(path: Path, render: Callable[[], str]) -> bool:
    """Write a report file of the run (private, atomic); one line and ``False`` on failure."""
    try:
        write_atomic(path, render())
    except Exception as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        _say(f"trainmedic: error: {path.name} not written: {reason}")
        return False
    return True


COMMAND = run
