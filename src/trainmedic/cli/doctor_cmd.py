"""``trainmedic doctor``: what in this machine will slow or break training."""

from __future__ import annotations

import sys
import time

import click
from rich.console import Console

from trainmedic.cli.options import (
    FAIL_ON_CHOICES,
    FiniteRange,
    exit_code_for,
    json_option,
    simulate_option,
)
from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.doctor.facts import MachineFacts
from trainmedic.errors import UsageError
from trainmedic.findings.model import Finding, FindingsDocument


@click.command("doctor")
@simulate_option
@click.option(
    "--data-dir",
    metavar="PATH",
    help="Measure read speed of the training data here (read-only, bounded sample).",
)
@click.option(
    "--data-url",
    metavar="URL",
    help="Measure latency and throughput to where data comes from (http(s)://... or host:port).",
)
@click.option(
    "--io-budget",
    type=FiniteRange(0.5, 120.0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Time budget for each of the --data-dir and --data-url measurements.",
)
@json_option("the findings document")
@click.option(
    "--fail-on",
    type=click.Choice(FAIL_ON_CHOICES),
    default="error",
    show_default=True,
    help="Exit 1 when a finding reaches this severity.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing --json/--html FILE that is not trainmedic's; with --stress, "
    "also stress GPUs that other processes use.",
)
@click.option("--brief", is_flag=True, help="Hide info findings in the terminal report.")
@click.option(
    "--stress",
    is_flag=True,
    help="Burn in the GPUs instead: matmul TFLOP/s per dtype, memory bandwidth and test, "
    "host and peer copies, clocks and heat under load, against the datasheet and each "
    "other (docs/stress.md; exit 3: no GPU, 4: a GPU is busy).",
)
@click.option(
    "--seconds",
    type=FiniteRange(1.0, 3600.0),
    default=None,
    metavar="N",
    help="With --stress: the burn-in's budget per GPU, seconds  [default: 60]",
)
@click.option(
    "--gpus",
    metavar="LIST",
    help="With --stress: the GPUs to stress, e.g. 0,2 or 0-3 (NVML order).",
)
@click.option(
    "--dcgm",
    "dcgm_level",
    type=click.IntRange(1, 4),
    default=None,
    metavar="LEVEL",
    help="With --stress: also run dcgmi diag -r LEVEL (1-4) when dcgmi is installed.",
)
@click.option("--html", "html_out", metavar="FILE", help="With --stress: write the report as HTML.")
def doctor(
    simulate: str | None,
    data_dir: str | None,
    data_url: str | None,
    io_budget: float,
    json_out: str | None,
    fail_on: str,
    force: bool,
    brief: bool,
    stress: bool = False,
    seconds: float | None = None,
    gpus: str | None = None,
    dcgm_level: int | None = None,
    html_out: str | None = None,
) -> int:
    """Check this machine: GPUs, driver and torch build, heat, hardware faults,
    other tenants, CPU limits, memory, shared memory, settings, and optionally
    the storage and network the training data comes from. With --stress, burn
    the GPUs in instead and judge them under load."""
    stress_only = {"--seconds": seconds, "--gpus": gpus, "--dcgm": dcgm_level, "--html": html_out}
    if not stress:
        given = [flag for flag, value in stress_only.items() if value is not None]
        if given:
            raise UsageError(f"{given[0]} applies only with --stress")
    else:
        if data_dir is not None or data_url is not None:
            raise UsageError("--data-dir and --data-url do not apply with --stress")
        from trainmedic.cli.doctor_stress import stress_command

        return stress_command(
            simulate=simulate,
            seconds=seconds,
            gpus=gpus,
            force=force,
            dcgm_level=dcgm_level,
            json_out=json_out,
            html_out=html_out,
            fail_on=fail_on,
            brief=brief,
        )
    from trainmedic.doctor.gather import DoctorRequest, gather_facts
    from trainmedic.doctor.runner import run_checks
    from trainmedic.host.nettarget import parse_target
    from trainmedic.host.storage import validate_data_dir

    # Validate every user input before measuring anything, so a typo costs nothing.
    if data_dir is not None:
        validate_data_dir(data_dir)
    if data_url is not None:
        parse_target(data_url)
    outputs = check_outputs({"--json": json_out}, force=force)
    request = DoctorRequest(
        simulate=simulate,
        data_dir=data_dir,
        data_url=data_url,
        io_budget_s=io_budget,
        net_budget_s=io_budget,
    )
    facts = gather_facts(request)
    findings = run_checks(facts)
    document = FindingsDocument.build(
        "doctor", findings, created_at=time.time(), context=_context(facts, simulate)
    )
    if json_out == "-":
        sys.stdout.write(document.to_json())
    else:
        if "--json" in outputs:
            data = document.to_json()
            write_output(outputs["--json"], lambda f: f.write(data))
        _print_report(facts, list(document.findings), brief)
    return exit_code_for(document.findings, fail_on)


def _context(facts: MachineFacts, simulate: str | None) -> dict[str, object]:
    return {
        "hostname": facts.host.hostname,
        "gpu_backend": facts.gpu.backend,
        "gpus": [s.name for s in facts.gpu.samples],
        "driver_version": facts.gpu.driver.version if facts.gpu.driver else None,
        "torch_version": facts.torch.version if facts.torch else None,
        "simulation": simulate,
    }


def _print_report(facts: MachineFacts, findings: list[Finding], brief: bool) -> None:
    console = Console(highlight=False)
    gpus = len(facts.gpu.samples)
    where = f"{facts.host.hostname}: {gpus} GPU(s) via {facts.gpu.backend}"
    render_heading = f"trainmedic doctor — {where}"
    from trainmedic.report.fix_text import Known
    from trainmedic.report.terminal import render_findings

    known = Known(evidence_at="trainmedic doctor --json -")
    render_findings(console, findings, render_heading, show_info=not brief, known=known)


COMMAND = doctor
