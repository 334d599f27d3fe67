"""A reader that goes away (``trainmedic ... | head -3``) changes nothing: every command
that prints finishes its work and exits with the status it has unpiped, and says nothing
on stderr."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmedic.cli.main import main
from trainmedic.findings.model import Category, Finding, FindingsDocument, Severity
from trainmedic.record.store import RunRecordWriter
from trainmedic.record.types import RunMeta, StepRecord

ROOT = Path(__file__).resolve().parents[2]
SIMULATIONS = ROOT / "examples" / "simulations"
PIPE_BYTES = 4096
"""The pipe's capacity, made as small as Linux allows: a command that prints more than
this is still writing when the reader closes its end, so it meets the closed pipe."""
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
T0 = 1_700_000_000.0


def make_run(path: Path, step_s: float) -> Path:
    with RunRecordWriter(path) as w:
        w.write_meta(
            RunMeta(
                run_id=path.name,
                command=("python", "train.py"),
                cwd=str(path.parent),
                started_at=T0,
                ended_at=T0 + 90.0,
                exit_code=0,
            )
        )
        t = T0 + 1
        for i in range(300):
            t += step_s
            w.add_step(
                StepRecord(i + 1, t, step_s, data_wait_s=0.1, compute_s=0.1, samples=32, pid=9)
            )
    findings = [
        Finding(
            id=f"input.example_{n}",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title=f"Finding {n}: the GPU waits for data {n} % of each step",
            evidence={"data_wait_share": n / 100},
            fix="DataLoader(num_workers=6)",
            impact=n / 100,
        )
        for n in range(1, 41)
    ]
    doc = FindingsDocument.build("run", findings, created_at=T0 + 91)
    (path / "findings.json").write_text(json.dumps(doc.to_dict()))
    return path


def commands(tmp: Path) -> dict[str, list[str]]:
    a, b = make_run(tmp / "a", 0.25), make_run(tmp / "b", 0.2)
    faults = str(SIMULATIONS / "stress" / "four-h100-faults.json")
    healthy = str(SIMULATIONS / "stress" / "healthy-h200.json")
    tenant = SIMULATIONS / "other-tenant.json"  # a machine with many findings: long output
    return {
        "doctor": ["doctor", "--simulate", str(tenant)],
        "doctor-json": ["doctor", "--simulate", str(tenant), "--json", "-"],
        "stress": ["doctor", "--stress", "--simulate", faults, "--seconds", "5"],
        "stress-json": ["doctor", "--stress", "--simulate", healthy, "--json", "-"],
        "report": ["report", str(a), "--json"],
        "compare": ["compare", str(a), str(b), "--json"],
    }


def _small_pipe() -> None:
    fcntl.fcntl(1, F_SETPIPE_SZ, PIPE_BYTES)


@pytest.mark.parametrize(
    "name", ["doctor", "doctor-json", "stress", "stress-json", "report", "compare"]
)
def test_a_pipe_closed_after_one_line_keeps_the_exit_status_and_stderr_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    argv = commands(tmp_path)[name]
    expected = main(argv)
    printed = capsys.readouterr().out.encode()
    assert len(printed) > 2 * PIPE_BYTES, "too little output to meet the closed pipe"
    # Buffered as a user's shell starts it (unbuffered, a partial write drops the rest
    # silently instead of meeting the closed pipe).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainmedic", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        preexec_fn=_small_pipe,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does after its line
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first and printed.startswith(first.rstrip(b"\n")[:20])
    assert (proc.returncode, err.decode()) == (expected, "")
