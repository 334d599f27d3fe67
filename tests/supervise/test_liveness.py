"""The kernel's view of real processes, and the observer that turns it into windows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from trainmedic.channel.wire import Heartbeat, Hello
from trainmedic.resilience.silence_evidence import Silence
from trainmedic.supervise.hang.liveness import SilenceObserver
from trainmedic.supervise.observe import procview
from trainmedic.supervise.observe.processes import ProcessState

pytestmark = pytest.mark.skipif(not procview.exists(), reason="needs /proc")


@contextmanager
def child(code: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # the child says when it is where it should be
        yield proc
    finally:
        proc.kill()
        proc.wait()


READY = "import sys; print('ready', flush=True); "


def test_a_sleeping_process_as_the_kernel_sees_it() -> None:
    with child(READY + "import time; time.sleep(60)") as proc:
        time.sleep(0.1)
        snap = procview.read_process(proc.pid)
    assert snap is not None and snap.state == "S"
    assert snap.syscall in ("clock_nanosleep", "nanosleep", "select", None)
    assert snap.cpu_s is not None and snap.wakeups is not None and snap.io_chars is not None
    assert procview.read_process(2**22 + 12345) is None


def test_the_probe_threads_cpu_and_reads_are_counted_apart() -> None:
    # Two busy threads named like the probe's: what they spend is not the job's.
    code = (
        "import threading, time, os\n"
        "def spin():\n"
        "    while True:\n"
        "        fd = os.open('/proc/self/stat', os.O_RDONLY)\n"
        "        os.read(fd, 512)\n"
        "        os.close(fd)\n"
        "ts = [threading.Thread(target=spin, daemon=True) for _ in range(2)]\n"
        "[t.start() for t in ts]\n"
        "print(' '.join(str(t.native_id) for t in ts), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        probe, sampler = (int(w) for w in proc.stdout.readline().split())
        time.sleep(0.3)
        one = procview.read_process(proc.pid, probe)
        both = procview.read_process(proc.pid, probe, sampler_tid=sampler)
    finally:
        proc.kill()
        proc.wait()
    assert one is not None and both is not None
    assert one.probe_cpu_s is not None and both.probe_cpu_s is not None
    assert both.probe_cpu_s > one.probe_cpu_s  # the second thread's CPU too
    assert both.probe_io_chars is not None and one.probe_io_chars is not None
    assert both.probe_io_chars > one.probe_io_chars


def test_a_socket_read_names_its_peer(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"import socket; s = socket.create_connection(('127.0.0.1', {port})); "
    with child(code + READY + "s.recv(1)") as proc:
        conn, _ = server.accept()
        time.sleep(0.2)
        snap = procview.read_process(proc.pid)
        assert snap is not None
        if snap.syscall is None:
            pytest.skip("/proc/<pid>/syscall is not readable here")
        assert snap.syscall == "recvfrom" and snap.fd is not None
        target, dev = procview.fd_target(proc.pid, snap.fd)
        assert target == f"socket 127.0.0.1:{port}" and dev is None
        assert procview.socket_peers(proc.pid) == [f"127.0.0.1:{port}"]
        conn.close()
    server.close()


def test_files_open_for_writing_and_their_growth(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    code = f"f = open({str(path)!r}, 'wb'); r = open({__file__!r}, 'rb'); " + READY
    code += "import time\nwhile True:\n    f.write(b'x' * 65536); f.flush(); time.sleep(0.05)"
    with child(code) as proc:
        first = procview.written_files(proc.pid)
        time.sleep(0.3)
        second = procview.written_files(proc.pid)
    key = (path.stat().st_dev, path.stat().st_ino)
    read = Path(__file__).stat()
    assert key in first and (read.st_dev, read.st_ino) not in first  # written, not read
    assert second[key] > first[key]


def test_flushed_bytes_from_the_device_or_the_machine(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    (sys_root / "dev" / "block" / "8:0").mkdir(parents=True)
    (sys_root / "dev" / "block" / "8:0" / "stat").write_text("1 2 3 4 10 20 4096 40 0 0 0\n")
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    (proc_root / "vmstat").write_text("nr_dirty 5\nnr_written 100\n")
    dev = os.makedev(8, 0)
    assert procview.flushed_bytes(dev, str(proc_root), str(sys_root)) == 4096 * 512
    overlay = os.makedev(0, 57)
    assert procview.flushed_bytes(overlay, str(proc_root), str(sys_root)) == 100 * procview.PAGE
    assert procview.flushed_bytes(None, str(tmp_path / "none"), str(sys_root)) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("running", ("running", None)),
        ("0 0x7 0x7ffd 0x1000 0x0 0x0 0x0 0x7ffd 0x7f", ("read", 7)),
        ("74 0x1a 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f", ("fsync", 26)),
        ("202 0x55 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f", ("futex", None)),
        ("-1 0x7ffd 0x7f", ("none", None)),
        ("", (None, None)),
    ],
)
def test_system_calls_by_number(text: str, expected: tuple[str | None, int | None]) -> None:
    assert procview.parse_syscall(text, "x86_64") == expected


def test_arm_numbers_and_ipv6_peers() -> None:
    assert procview.parse_syscall("63 0x3 0x0", "aarch64") == ("read", 3)
    assert procview._address("0100007F:1F90", v6=False) == "127.0.0.1:8080"
    mapped = "0000000000000000FFFF00000100007F:0050"
    assert procview._address(mapped, v6=True) == "127.0.0.1:80"


# --- the observer over real processes -------------------------------------------------------------


def hello(pid: int, role: str = "process") -> Hello:
    return Hello(pid, os.getpid(), role, ("train.py",), None, None, "3.11", "python", time.time())


def beat(pid: int, calls: tuple[str, ...], op: str, gil_busy: int = 0) -> Heartbeat:
    return Heartbeat(
        pid, time.time(), 40, "train", "other", ("train.py:42 main",), 0.0, 0,
        ("__main__",), calls, op, 4, gil_busy, None,
    )  # fmt: skip


def observe(
    pids: list[int], states: dict[int, ProcessState], seconds: float = 1.3
) -> Silence | None:
    observer = SilenceObserver(
        lambda: [psutil.Process(p) for p in pids], lambda: states, lambda: {}
    )
    since = time.time()
    evidence = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        evidence = observer.observe(time.monotonic(), since) or evidence
        time.sleep(0.25)
    return None if evidence is None else evidence.silence


def test_real_processes_blocked_spinning_and_unclear() -> None:
    with child(READY + "import time; time.sleep(60)") as sleeper:
        states = {
            sleeper.pid: ProcessState(
                hello(sleeper.pid), None, beat(sleeper.pid, ("time", "sleep"), "CALL")
            )
        }
        assert observe([sleeper.pid], states) is Silence.BLOCKED
    with child(READY + "x = 0\nwhile True:\n    x += 1") as spinner:
        pid = spinner.pid
        states = {pid: ProcessState(hello(pid), None, beat(pid, (), "JUMP_BACKWARD", gil_busy=4))}
        assert observe([pid], states) is Silence.SPINNING
        # Without a probe the same process cannot be told from one that computes.
        assert observe([pid], {}) is Silence.UNCLEAR


def test_work_is_dated_by_the_heartbeat_that_showed_it() -> None:
    # The thread slept at the end of its last step when the silence's first
    # heartbeat was sent, then went into a loop; the heartbeat that shows the loop
    # was sent 0.2 s after the silence began but read 0.9 s later. The work is
    # that heartbeat's: dating it by the windows that read it pushed a hang's
    # verdict two seconds late.
    with child(READY + "import time; time.sleep(60)") as sleeper:
        pid = sleeper.pid
        since = 1000.0
        clock = {"now": 50.0, "wall": since}

        def at(wall: float, stack: str, work: int = 40) -> ProcessState:
            sleeping = stack.endswith("step")
            beat = Heartbeat(
                pid, wall, 40, "train", "other", (stack, "train.py:9 main"), 0.0, work,
                ("__main__", "__main__"), ("time", "sleep") if sleeping else (),
                "CALL" if sleeping else "JUMP_BACKWARD", 4, 0, None,
            )  # fmt: skip
            return ProcessState(hello(pid), None, beat)

        states = {pid: at(since + 0.05, "train.py:20 step")}
        observer = SilenceObserver(
            lambda: [psutil.Process(pid)],
            lambda: states,
            lambda: {},
            wall=lambda: clock["wall"],
        )

        def observe_at(offset: float):  # type: ignore[no-untyped-def]
            clock["wall"] = since + offset
            return observer.observe(50.0 + offset, since)

        assert observe_at(0.5) is None  # the window is too short yet
        first = observe_at(1.0)
        assert first is not None and first.silence is not Silence.WORK
        states[pid] = at(since + 0.2, "train.py:31 spin")
        evidence = observe_at(1.1)
        assert evidence is not None and evidence.silence is Silence.WORK
        assert "new code" in evidence.why
        assert evidence.at == pytest.approx(50.2)
        # Windows read later still count it, at the same moment.
        again = observe_at(1.9)
        assert again is not None and again.silence is Silence.WORK
        assert again.at == pytest.approx(50.2)
        # Forward/backward calls counted by a later heartbeat date from it.
        states[pid] = at(since + 1.2, "train.py:31 spin", work=43)
        counted = observe_at(2.3)
        assert counted is not None and "3 forward" in counted.why
        assert counted.at == pytest.approx(51.2)
