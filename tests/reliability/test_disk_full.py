"""A full disk under the run directory: exit status and output survive, the record degrades."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.record.guard import RecordGuard
from trainmedic.record.store import RunRecordWriter, load_run_record
from trainmedic.record.types import RunEvent, RunMeta, StepRecord
from trainmedic.supervise.launch.launcher import OutputStream
from trainmedic.supervise.output.stream import OutputPump, TerminalMux

from .helpers import TRAINMEDIC, assert_one_line_error, can_drop_read_permission, listing

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LINES = 40_000
# About 2.8 MB of output, then a line on stderr; exits 0.
JOB = textwrap.dedent(
    """
    import sys
    for i in range(LINES):
        sys.stdout.write(f"line {i} " + "x" * 60 + "\\n")
    sys.stdout.flush()
    print("END OF JOB", file=sys.stderr)
    """
).replace("LINES", str(LINES))
EXPECTED = b"".join(b"line %d " % i + b"x" * 60 + b"\n" for i in range(LINES))


class FullDisk:
    """``os.write`` with ``free`` bytes left, shared by every file; ENOSPC after."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.free <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, data[: self.free])
        self.free -= n
        return n


# --- the parts, with an injected full disk ---------------------------------------------------


def test_the_record_writer_stops_at_a_full_disk_and_counts_what_it_lost(tmp_path: Path) -> None:
    guard = RecordGuard(write=FullDisk(20_000))
    writer = RunRecordWriter(tmp_path / "run", guard=guard)
    writer.write_meta(RunMeta(run_id="r", command=("t",), cwd="/", started_at=1.0))
    for i in range(3000):
        writer.add_step(StepRecord(i + 1, 2.0 + i * 0.01, 0.01, pid=5))
        writer.add_event(RunEvent(t=2.0 + i * 0.01, kind="note", message="m" * 50))
        if i % 500 == 0:
            writer.flush()
    writer.close()  # never raises for the run directory
    loss = guard.loss()
    assert loss is not None
    assert loss.errno_name == "ENOSPC"
    assert sum(loss.lost_lines.values()) > 0
    record = load_run_record(tmp_path / "run")  # what was written reads back
    steps = [s.step for s in record.steps]
    assert steps and steps == list(range(1, len(steps) + 1))  # a prefix: no gap, no garbage
    assert len(steps) < 3000


def test_the_log_stops_at_a_full_disk_and_the_terminal_gets_everything(tmp_path: Path) -> None:
    guard = RecordGuard(write=FullDisk(10_000))
    job_r, job_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    payload = bytes(range(256)) * 400
    try:
        mux = TerminalMux(out_w, err_w)
        pump = OutputPump(OutputStream(job_r, False), out_w, tmp_path / "stdout.log", mux, guard)
        pump.start()
        received = bytearray()
        os.write(job_w, payload[:50_000])
        while len(received) < 50_000:
            received += os.read(out_r, 65536)
        os.write(job_w, payload[50_000:])
        os.close(job_w)
        while len(received) < len(payload):
            received += os.read(out_r, 65536)
        pump.join(10)
    finally:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
    assert bytes(received) == payload
    assert (tmp_path / "stdout.log").read_bytes() == payload[:10_000]
    loss = guard.loss()
    assert loss is not None and loss.lost_bytes == {"stdout.log": len(payload) - 10_000}


# --- a whole run, with an injected full disk -------------------------------------------------


def check_degraded_run(got: subprocess.CompletedProcess[bytes], run_dir: Path) -> None:
    err = got.stderr.decode("utf-8", "replace")
    assert got.returncode == 0, err
    assert got.stdout == EXPECTED  # every byte reached the terminal
    assert "Traceback" not in err
    assert err.startswith("END OF JOB\n"), err[:300]
    warnings = [line for line in err.splitlines() if line.startswith("trainmedic: warning:")]
    assert len(warnings) == 1, err
    assert "the run directory " in warnings[0] and "stopped taking writes" in warnings[0]
    findings = json.loads((run_dir / "findings.json").read_text())
    assert "record.incomplete" in [f["id"] for f in findings["findings"]]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["exit_code"] == 0
    assert meta["environment"]["record_loss"]["errno"] == "ENOSPC"
    log = (run_dir / "stdout.log").read_bytes()
    assert 0 < len(log) < len(EXPECTED) and EXPECTED.startswith(log)
    assert not (run_dir / ".trainmedic-reserve").exists()


def test_a_run_on_a_disk_that_fills_ends_with_the_job_s_status_and_findings(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, str(SCRIPTS / "full_disk_run.py"), "600000"]
    argv += ["run", "--quiet", "--no-html", "--out", str(run_dir), "--", sys.executable, "-c", JOB]
    got = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    check_degraded_run(got, run_dir)


# --- a real small filesystem -----------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, or a skip saying why there is none."""
    where = tmp_path / "small"
    where.mkdir()
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    got = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if got.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {got.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def test_a_run_on_a_full_tmpfs(small_fs: Path) -> None:
    run_dir = small_fs / "run"
    argv = [*TRAINMEDIC, "run", "--quiet", "--out", str(run_dir), "--", sys.executable, "-c", JOB]
    got = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    check_degraded_run(got, run_dir)
    # The record reads back: `report` works on what was kept.
    shown = subprocess.run(
        [*TRAINMEDIC, "report", str(run_dir)], capture_output=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr


def test_a_read_only_filesystem_is_one_line_and_nothing_runs(
    small_fs: Path, tmp_path: Path
) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    marker = tmp_path / "ran"
    job = f"open({str(marker)!r}, 'w').close()"
    argv = [*TRAINMEDIC, "run", "--out", str(small_fs / "run"), "--", sys.executable, "-c", job]
    got = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    line = assert_one_line_error(got)
    assert "Read-only file system" in line
    assert not marker.exists()


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing-empty"])
def test_a_run_directory_it_may_not_write_is_one_line_and_nothing_runs(
    tmp_path: Path, existing: bool
) -> None:
    prefix = can_drop_read_permission()
    if prefix is None:
        pytest.skip("running as root without setpriv: file modes do not apply")
    parent = tmp_path / "locked"
    parent.mkdir()
    out = parent / "run"
    if existing:
        out.mkdir()
        os.chmod(out, 0o555)
    os.chmod(parent, 0o555)
    marker = tmp_path / "ran"
    job = f"open({str(marker)!r}, 'w').close()"
    argv = [*prefix, *TRAINMEDIC, "run", "--out", str(out), "--", sys.executable, "-c", job]
    try:
        got = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    finally:
        os.chmod(parent, 0o755)
        if existing:
            os.chmod(out, 0o755)
    line = assert_one_line_error(got)
    assert "Permission denied" in line
    assert not marker.exists()
    assert listing(parent) == (["run"] if existing else [])
