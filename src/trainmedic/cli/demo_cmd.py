"""``trainmedic demo``: run a bundled training script under ``trainmedic run`` and diagnose it.

The script (the article's LeNet on synthetic digits) is an ordinary PyTorch
program; each ``--scenario`` gives it flags that reproduce one real cause of
slow training, and the GPU scenarios add a simulation file for the GPU's
readings. The run goes through the ``run`` command itself, in this process,
so output, Ctrl-C and exit codes behave exactly as with ``trainmedic run``.
Exit code: the job's when it failed; else 0 when the diagnosis is the
scenario's, 1 when it is not (the report says what was found instead).
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import click

from trainmedic.cli.demo_resilience import list_resilience_scenarios, run_resilience_demo
from trainmedic.cli.demo_trace import NAME as TRACE_SCENARIO
from trainmedic.cli.demo_trace import list_trace_scenario, run_trace_demo
from trainmedic.cli.options import simulate_option
from trainmedic.demo.resilience_scenarios import RESILIENCE_SCENARIOS
from trainmedic.demo.scenarios import (
    DEFAULT_SCENARIO,
    DEMO_MODULES,
    SCENARIOS,
    SCRIPT,
    Scenario,
    dataset_dir,
)
from trainmedic.errors import RunDirectoryError
from trainmedic.optional import require
from trainmedic.record.layout import FINDINGS_FILE, HTML_FILE


@click.command("demo")
@click.option(
    "--scenario",
    type=click.Choice([*SCENARIOS, *RESILIENCE_SCENARIOS, TRACE_SCENARIO]),
    default=DEFAULT_SCENARIO,
    show_default=True,
    help="Which bottleneck the example reproduces (see --list).",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Optimizer steps (default: the scenario's, ~15-30 s on 2 cores; far fewer "
    "may not show the bottleneck).",
)
@click.option(
    "--out",
    metavar="DIR",
    default=None,
    help="Run directory (new or empty). Default: ./trainmedic-runs/<time>-demo-<scenario>/.",
)
@simulate_option
@click.option("--quiet", "-q", is_flag=True, help="No introduction and no live status.")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.pass_context
def demo(
    ctx: click.Context,
    scenario: str,
    steps: int | None,
    out: str | None,
    simulate: str | None,
    quiet: bool,
    list_only: bool,
) -> int:
    """Train the LeNet of the source article on synthetic digits under
    'trainmedic run', in a scenario that reproduces a real bottleneck, and show
    the diagnosis. The GPU scenarios (throttling, contention, memory-pressure)
    read the GPU from a bundled simulation file (--simulate replaces it);
    gpu-trace judges a real GPU's torch.profiler trace, bundled."""
    if list_only:
        _list_scenarios()
        list_resilience_scenarios()
        list_trace_scenario()
        return 0
    if scenario == TRACE_SCENARIO:  # a recorded GPU trace: no torch needed (cli/demo_trace.py)
        return run_trace_demo(out, steps, quiet)
    require("trainmedic demo", DEMO_MODULES, "demo")  # torch is not a core dependency
    if scenario in RESILIENCE_SCENARIOS:  # hang, crash, oom: cli/demo_resilience.py
        return run_resilience_demo(ctx, scenario, out, quiet)
    from trainmedic.cli.run_cmd import COMMAND as run_command
    from trainmedic.simulation import load_simulation
    from trainmedic.supervise.rundir import default_run_dir

    chosen = SCENARIOS[scenario]
    n_steps = steps or chosen.steps
    simulation = simulate or (str(chosen.simulation_path) if chosen.simulation_path else None)
    if simulation is not None:
        load_simulation(simulation)  # a bad file is refused before anything runs
    run_dir = Path(out) if out else default_run_dir([f"demo-{chosen.name}"])
    _check_unused(run_dir)  # before minutes of data set writing, not after
    with tempfile.TemporaryDirectory(prefix="trainmedic-demo-") as tmp:
        scratch = Path(tmp)
        argv = [sys.executable, str(SCRIPT), *chosen.script_args(n_steps, scratch)]
        if not quiet:
            _introduce(chosen, run_dir, simulation, argv)
        if chosen.dataset:
            _write_dataset(chosen, dataset_dir(scratch), quiet)
        code = ctx.invoke(
            run_command, out=str(run_dir), simulate=simulation, quiet=quiet, command=tuple(argv)
        )
    if not isinstance(code, int) or code != 0:
        _say(f"\ndemo ({chosen.name}): the training job ended with exit code {code}")
        _where(run_dir)
        return code if isinstance(code, int) else 1
    return _conclude(chosen, run_dir)


def _check_unused(run_dir: Path) -> None:
    """Refuse a run directory ``trainmedic run`` would refuse, before any work."""
    from trainmedic.supervise.rundir import check_run_dir

    check_run_dir(run_dir)


def _list_scenarios() -> None:
    for s in SCENARIOS.values():
        default = " (default)" if s.name == DEFAULT_SCENARIO else ""
        gpu = " [simulated GPU]" if s.simulation else ""
        click.echo(f"{s.name}{default}{gpu}: {s.expectation}")
        click.echo(f"    {s.story}")


def _introduce(s: Scenario, run_dir: Path, simulation: str | None, argv: list[str]) -> None:
    run = ["trainmedic", "run", "--out", str(run_dir)]
    if simulation is not None:
        run += ["--simulate", simulation]
    _say(f"trainmedic demo: {s.name}")
    _say(f"  {s.story}")
    _say(f"  expected diagnosis: {s.expectation}")
    _say(f"  running: {shlex.join([*run, '--', *argv])}\n")


def _write_dataset(s: Scenario, directory: Path, quiet: bool) -> None:
    from trainmedic.demo.digits import write_digits

    written = write_digits(directory, s.samples)
    if not quiet:
        _say(f"  wrote {s.samples} sample files ({written / 2**20:.1f} MiB) to {directory}\n")


def _conclude(s: Scenario, run_dir: Path) -> int:
    """Print the verdict and where the report is; 0 when the diagnosis is the scenario's."""
    from trainmedic.demo.verdict import judge
    from trainmedic.findings.reading import read_findings_document

    path = run_dir / FINDINGS_FILE
    try:
        document = read_findings_document(path)
    except RunDirectoryError as exc:
        raise RunDirectoryError(f"the run was not diagnosed: {exc}") from None
    verdict = judge(s, list(document.findings))
    _say(f"\ndemo ({s.name}): {verdict.message}")
    _where(run_dir)
    return 0 if verdict.ok else 1


def _where(run_dir: Path) -> None:
    if not run_dir.is_dir():
        return
    _say(f"  run directory: {run_dir}")
    html = run_dir / HTML_FILE
    if html.is_file():
        _say(f"  report: {html}")
    _say(f"  again: trainmedic report {shlex.quote(str(run_dir))}")


def _say(text: str) -> None:
    click.echo(text, err=True)


COMMAND = demo
