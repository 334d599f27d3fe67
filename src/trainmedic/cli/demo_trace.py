"""``trainmedic demo --scenario gpu-trace``: a real GPU's timings judged, on any machine.

The scenario reads the torch.profiler trace bundled with trainmedic (rank 0 of
a 128-rank data-parallel job on NVIDIA GPUs, :mod:`trainmedic.demo.traces`)
exactly as ``trainmedic report TRACE`` does, and says whether the diagnosis is
the one the trace shows: the gradient all-reduce running alone on the GPU.
No GPU and no torch are needed. Exit code: 0 when it is, else 1.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from trainmedic.errors import UsageError

NAME = "gpu-trace"
STORY = (
    "A real torch.profiler trace of an NVIDIA GPU (rank 0 of 128, data-parallel): its GPU "
    "idles more than half of each step. Read and judged as 'trainmedic report TRACE' does; "
    "no GPU and no torch needed."
)
EXPECTED = "gpu.exposed_communication"
EXPECTATION = f"{EXPECTED} (framework_config): NCCL runs with nothing to overlap it"


def list_trace_scenario() -> None:
    click.echo(f"{NAME} [real GPU trace]: {EXPECTATION}")
    click.echo(f"    {STORY}")


def run_trace_demo(out: str | None, steps: int | None, quiet: bool) -> int:
    """Judge the bundled trace; with ``out``, its findings go to ``out/findings.json``."""
    from trainmedic.cli.report_trace import report_traces
    from trainmedic.demo.traces import DEMO_TRACE
    from trainmedic.record.layout import FINDINGS_FILE

    if steps is not None:
        raise UsageError(f"--steps is for training scenarios; {NAME} reads a recorded trace")
    json_out = None
    if out is not None:
        directory = Path(out)
        if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
            raise UsageError(f"--out {out}: not a new or empty directory")
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        json_out = str(directory / FINDINGS_FILE)
    if not quiet:
        _say(f"trainmedic demo: {NAME}")
        _say(f"  {STORY}")
        _say(f"  expected diagnosis: {EXPECTATION}")
        _say(f"  running: trainmedic report {shlex.quote(str(DEMO_TRACE))}\n")
    document = report_traces((str(DEMO_TRACE),), json_out, None, None, False, False)
    first = document.findings[0].id if document.findings else None
    ok = first == EXPECTED
    verdict = "as expected" if ok else f"NOT as expected: the first finding is {first}"
    _say(f"\ndemo ({NAME}): {verdict}")
    _say(f"  again: trainmedic report {shlex.quote(str(DEMO_TRACE))}")
    return 0 if ok else 1


def _say(text: str) -> None:
    click.echo(text, err=True)
