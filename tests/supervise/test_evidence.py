"""Evidence an attempt leaves: stderr tail, error files, kernel log, GPU faults."""

from __future__ import annotations

import json
from pathlib import Path

from trainmedic.gpu.types import EccCounts, GpuSample, RemappedRows
from trainmedic.resilience.classify import GpuRef
from trainmedic.supervise.loop.evidence import (
    collect_error_reports,
    gpu_faults,
    oom_kill_delta,
    relevant_kernel_lines,
    stderr_tail,
)


def test_the_tail_starts_at_the_attempts_offset(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_bytes(b"attempt 1 line\n")
    offset = log.stat().st_size
    with log.open("ab") as f:
        f.write(b"epoch 1 10%\repoch 1 90%\nTraceback (most recent call last):\nValueError: x\n")
    assert stderr_tail(log, offset) == (
        "epoch 1 10%",
        "epoch 1 90%",
        "Traceback (most recent call last):",
        "ValueError: x",
    )
    assert stderr_tail(log, offset, lines=1) == ("ValueError: x",)
    assert stderr_tail(tmp_path / "missing.log", 0) == ()


def test_error_files_are_read_and_moved_into_the_attempt(tmp_path: Path) -> None:
    errors = tmp_path / "errors"
    errors.mkdir()
    (errors / "error-7.json").write_text(
        json.dumps({"message": {"message": "ValueError: bad"}, "pid": 7, "t": 5.0})
    )
    attempt = tmp_path / "attempts" / "1"
    attempt.mkdir(parents=True)
    reports = collect_error_reports(tmp_path, attempt)
    assert [(r.pid, r.exc_type, r.message) for r in reports] == [(7, "ValueError", "bad")]
    assert not errors.exists()
    assert (attempt / "errors" / "error-7.json").is_file()
    assert collect_error_reports(tmp_path, attempt) == ()  # the next attempt starts clean


def test_kernel_lines_after_the_attempt_began_are_kept() -> None:
    records = [
        "4,100,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "4,101,9000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE",
        "6,102,9100000,-;usb 1-1: new device",
        "3,103,9200000,-;Out of memory: Killed process 4242 (python)\n SUBSYSTEM=x",
        "garbage",
    ]
    assert relevant_kernel_lines(records, since_monotonic=8.0) == (
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE",
        "Out of memory: Killed process 4242 (python)",
    )


def make_sample(index: int, uncorrected: int, failure: bool = False) -> GpuSample:
    return GpuSample(
        timestamp=0.0,
        index=index,
        name="A100",
        uuid=f"GPU-{index}",
        ecc=EccCounts(volatile_uncorrected=uncorrected),
        remapped_rows=RemappedRows(failure=failure),
    )


def test_gpu_faults_are_what_appeared_during_the_attempt() -> None:
    first = {0: make_sample(0, 2), 1: make_sample(1, 0)}
    last = {0: make_sample(0, 2), 1: make_sample(1, 3, failure=True)}
    faults = gpu_faults(first, last)
    assert [(f.gpu, f.reason) for f in faults] == [
        (GpuRef(index=1, uuid="GPU-1"), "volatile uncorrected ECC errors +3"),
        (GpuRef(index=1, uuid="GPU-1"), "row remap failure"),
    ]


def test_an_unreadable_oom_counter_gives_no_delta() -> None:
    assert oom_kill_delta(3, 5) == 2
    assert oom_kill_delta(None, 5) is None
