"""``trainmedic doctor --stress``: the burn-in's command-line side (docs/stress.md).

Checks every input first (``--gpus``, the output files), opens the GPU backend (NVML, or
``--simulate FILE`` with a ``stress`` section), runs the stress, and reports it in the
terminal, ``--json`` and ``--html``. Exit statuses: 0, or 1 when a finding reaches
``--fail-on``; 2 for bad input; 3 when there is no GPU to stress; 4 when a GPU is busy
with another process and ``--force`` was not given.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Sequence

import click
from rich.console import Console

from trainmedic.cli.options import exit_code_for
from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.doctor.stress.dcgm import DcgmOutcome, run_dcgm_diag
from trainmedic.doctor.stress.judge import judge_stress
from trainmedic.doctor.stress.machine import StressMachine
from trainmedic.doctor.stress.runner import (
    GpuBusyError,
    NoGpuToStress,
    StressPlan,
    parse_gpu_list,
    run_stress,
)
from trainmedic.doctor.stress.sampling import SamplerFactory
from trainmedic.findings.model import FindingsDocument
from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample

DEFAULT_SECONDS = 60.0
"""The burn-in's budget per GPU when ``--seconds`` is not given."""

OpenMachine = Callable[[Sequence[GpuSample]], tuple[str, StressMachine]]


def stress_command(
    *,
    simulate: str | None,
    seconds: float | None,
    gpus: str | None,
    force: bool,
    dcgm_level: int | None,
    json_out: str | None,
    html_out: str | None,
    fail_on: str,
    brief: bool,
) -> int:
    """Run ``doctor --stress``; returns the exit status."""
    wanted = parse_gpu_list(gpus) if gpus is not None else None
    outputs = check_outputs({"--json": json_out, "--html": html_out}, force=force)
    plan = StressPlan(
        gpus=wanted, seconds=DEFAULT_SECONDS if seconds is None else seconds, force=force
    )
    backend, open_machine, clock, sampler, notes = _machine(simulate)
    dcgm: Callable[[], DcgmOutcome] | None = None
    if dcgm_level is not None:
        if simulate is None:
            dcgm = lambda: run_dcgm_diag(dcgm_level)  # noqa: E731
        else:
            notes.append("dcgmi diag is not run on a simulated machine")
    try:
        result = run_stress(plan, backend, open_machine, clock, dcgm=dcgm, sampler=sampler)
    except (NoGpuToStress, GpuBusyError) as exc:
        click.echo(f"trainmedic doctor --stress: {exc}", err=True)
        return exc.exit_code
    finally:
        backend.close()
    if result.dcgm is not None and result.dcgm.note:
        notes.append(result.dcgm.note)
    findings = judge_stress(result)
    host = socket.gethostname()
    created = time.time()
    document = FindingsDocument.build(
        "doctor",
        findings,
        created_at=created,
        context={
            "hostname": host,
            "mode": "stress",
            "gpu_backend": result.backend,
            "simulation": simulate,
            "notes": notes,
            "stress": result.to_dict(),
        },
    )
    if "--html" in outputs:
        from trainmedic.report.stress import render_stress_html

        page = render_stress_html(result, document.findings, created, host, notes)
        write_output(outputs["--html"], lambda f: f.write(page))
    if json_out == "-":
        sys.stdout.write(document.to_json())
    else:
        if "--json" in outputs:
            data = document.to_json()
            write_output(outputs["--json"], lambda f: f.write(data))
        from trainmedic.report.stress import render_stress

        heading = f"trainmedic doctor --stress — {host}: {len(result.gpus)} GPU(s)"
        render_stress(
            Console(highlight=False),
            result,
            document.findings,
            heading,
            show_info=not brief,
            notes=notes,
        )
    return exit_code_for(document.findings, fail_on)


def _machine(
    simulate: str | None,
) -> tuple[GpuBackend, OpenMachine, Callable[[], float], SamplerFactory | None, list[str]]:
    """The GPU backend, the compute, the clock both run on, what reads the GPUs during
    the bursts (``None``: a thread reading the backend), and notes for the report."""
    if simulate is not None:
        from trainmedic.doctor.stress.simulated import load_stress_simulation

        sim = load_stress_simulation(simulate)
        return sim.backend, lambda _: ("simulated", sim.machine), sim.clock, sim.sampler, []
    from trainmedic.doctor.stress.torch_machine import open_torch_machine
    from trainmedic.gpu.factory import open_nvml_or_none

    return open_nvml_or_none(), open_torch_machine, time.monotonic, None, []
