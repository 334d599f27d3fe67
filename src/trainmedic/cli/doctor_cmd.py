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
    help="Replace an existing --json FILE that is not a trainmedic findings document.",
)
@click.option("--brief", is_flag=True, help="Hide info findings in the terminal report.")
def doctor(
    simulate: str | None,
    data_dir: str | None,
    data_url: str | None,
    io_budget: float,
    json_out: str | None,
    fail_on: str,
    force: bool,
    brief: bool,
) -> int:
    """Check this machine: GPUs, driver and torch build, heat, hardware faults,
    other tenants, CPU limits, memory, shared memory, settings, and optionally
    the storage and network the training data comes from."""
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
