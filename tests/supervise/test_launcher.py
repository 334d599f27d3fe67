"""The job as a child in its own session: exit codes, signals, leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from trainmedic.supervise.launch.launcher import (
    CommandNotExecutableError,
    CommandNotFoundError,
    Job,
    exit_status,
    probe_environment,
)
from trainmedic.supervise.launch.signals import SignalForwarder


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        data = os.read(fd, 65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def run_job(argv: list[str]) -> tuple[Job, bytes, bytes]:
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    try:
        job = Job.start(argv, dict(os.environ), stdout_fd=w_out, stderr_fd=w_err)
    finally:
        os.close(w_out)
        os.close(w_err)
    out = read_all(job.streams[w_out].fd)
    err = read_all(job.streams[w_err].fd)
    job.wait(30)
    for fd in (r_out, r_err, job.streams[w_out].fd, job.streams[w_err].fd):
        os.close(fd)
    return job, out, err


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (3, 3), (-9, 137), (-2, 130)])
def test_exit_status_is_what_a_shell_reports(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


def test_the_job_runs_in_its_own_session_with_its_output_captured() -> None:
    code = (
        f"import os, sys; print(os.getsid(0) != {os.getsid(0)}, os.getpid());"
        " sys.stderr.write('e'); sys.exit(3)"
    )
    job, out, err = run_job([sys.executable, "-c", code])
    own_session, pid = out.split()
    assert (job.returncode, own_session, err) == (3, b"True", b"e")
    assert int(pid) == job.pid  # the job itself, not the process that holds its session
    assert job.pgid != job.pid


def test_the_job_may_start_a_session_of_its_own() -> None:
    """A session leader cannot call setsid(): the job is not made one (EPERM otherwise)."""
    code = "import os; os.setsid(); print(os.getsid(0) == os.getpid())"
    job, out, err = run_job([sys.executable, "-c", code])
    assert (job.returncode, out, err) == (0, b"True\n", b"")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV])
def test_a_job_killed_by_a_signal_reads_as_killed_by_it(sig: int) -> None:
    code = f"import os; os.kill(os.getpid(), {int(sig)})"
    job, _, _ = run_job([sys.executable, "-c", code])
    assert job.returncode == -sig


def test_the_job_starts_with_the_signal_dispositions_popen_gives() -> None:
    """Nothing ignored that a plain ``Popen`` would not ignore (Python ignores SIGPIPE itself)."""
    argv = ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]
    _, out, _ = run_job(argv)
    plain = subprocess.run(argv, capture_output=True, check=True).stdout
    assert out == plain


def test_a_signal_to_the_group_reaches_the_job_once_and_its_status_comes_back() -> None:
    code = (
        "import signal, sys, time\n"
        "n = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: n.append(1))\n"
        "print('ready', flush=True)\n"
        "time.sleep(1.0)\n"
        "sys.exit(10 + len(n))\n"
    )
    r_out, w_out = os.pipe()
    try:
        job = Job.start([sys.executable, "-c", code], dict(os.environ), stdout_fd=w_out)
    finally:
        os.close(w_out)
    fd = job.streams[w_out].fd
    got = b""
    while not got.endswith(b"\n"):
        got += os.read(fd, 16)
    assert got == b"ready\n"
    assert job.signal_group(signal.SIGTERM)
    assert job.wait(30) == 11  # the handler ran once; the holder outlived the signal
    os.close(fd)
    os.close(r_out)


def test_a_missing_command_is_exit_127() -> None:
    with pytest.raises(CommandNotFoundError) as info:
        Job.start(["no-such-command-xyz"], dict(os.environ))
    assert info.value.exit_code == 127
    assert str(info.value) == "command not found: no-such-command-xyz"


def test_a_file_that_is_not_executable_is_exit_126(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("echo hi\n")
    with pytest.raises(CommandNotExecutableError) as info:
        Job.start([str(script)], dict(os.environ))
    assert info.value.exit_code == 126


def test_the_probe_environment_keeps_the_users_pythonpath(tmp_path: Path) -> None:
    env = probe_environment({"PYTHONPATH": "/a:/b", "X": "1"}, "unix:/s", "tok", tmp_path)
    first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
    assert first.endswith("probe/bootstrap")
    assert rest == "/a:/b"
    assert env["X"] == "1"
    assert env["TRAINMEDIC_PROBE_ADDR"] == "unix:/s"
    assert probe_environment({"X": "1"}, "a", "t", tmp_path, probe=False) == {"X": "1"}


class FakeJob:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def signal_group(self, sig: int) -> bool:
        self.sent.append(sig)
        return True


def test_ctrl_c_is_forwarded_then_escalates() -> None:
    job = FakeJob()
    notes: list[str] = []
    forwarder = SignalForwarder(job, notes.append)  # type: ignore[arg-type]
    for _ in range(3):
        forwarder.handle(signal.SIGINT)
    assert job.sent == [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    assert len(notes) == 2


def test_sigterm_is_forwarded_and_a_second_one_kills() -> None:
    job = FakeJob()
    forwarder = SignalForwarder(job, lambda _: None)  # type: ignore[arg-type]
    forwarder.handle(signal.SIGTERM)
    forwarder.handle(signal.SIGHUP)
    forwarder.handle(signal.SIGTERM)
    assert job.sent == [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]


def start_with_pipes(argv: list[str]) -> tuple[Job, list[int]]:
    """Start ``argv`` with its stdout and stderr going to pipes this test reads."""
    ends = [os.pipe(), os.pipe()]
    try:
        job = Job.start(argv, dict(os.environ), stdout_fd=ends[0][1], stderr_fd=ends[1][1])
    finally:
        for r, w in ends:
            os.close(w)
            os.close(r)
    return job, [s.fd for s in job.streams.values()]


def read_line(fd: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 100)
        assert chunk, "the job closed its output early"
        line += chunk
    return line


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_signals_reach_the_whole_process_group() -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    job, fds = start_with_pipes([sys.executable, "-c", code])
    try:
        grandchild = int(read_line(fds[0]))
        assert job.signal_group(signal.SIGTERM)
        assert job.wait(10) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while _running(grandchild) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _running(grandchild)
    finally:
        job.signal_group(signal.SIGKILL)
        for fd in fds:
            os.close(fd)


def _voluntary_switches() -> int:
    """This thread's voluntary context switches so far (Linux)."""
    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("voluntary_ctxt_switches")))  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this system")
def test_waiting_on_a_running_job_sleeps_until_it_exits(tmp_path: Path) -> None:
    # The attempt loop waits 0.25 s at a time for the whole run; Popen.wait would wake
    # 11 times in each, on a core the job shares. The wait sleeps on the job's exit.
    done = tmp_path / "done"
    code = f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.01)\n"
    job = Job.start([sys.executable, "-c", code], dict(os.environ))
    try:
        before = _voluntary_switches()
        assert job.wait(0.3) is None
        assert job.wait(0.3) is None
        # Popen.wait: about 24. Two sleeps are 2; the rest of the margin is for other
        # threads of the test process (pytest-timeout's timer starting) taking the lock.
        assert _voluntary_switches() - before <= 8
    finally:
        done.touch()  # the job exits
    started = time.monotonic()
    assert job.wait(30) == 0
    assert time.monotonic() - started < 10
