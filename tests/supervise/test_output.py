"""The job's bytes pass through unchanged; the panel and status lines never cut into them."""

from __future__ import annotations

import os
import select
import termios
import threading
from pathlib import Path

from trainmedic.supervise.launch.launcher import OutputStream
from trainmedic.supervise.output.stream import OutputPump, TerminalMux


class Pipes:
    """trainmedic's stdout and stderr, as pipes the test reads."""

    def __init__(self) -> None:
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        os.set_blocking(self.out_r, False)
        os.set_blocking(self.err_r, False)

    def read(self, fd: int) -> bytes:
        try:
            return os.read(fd, 1 << 20)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        for fd in (self.out_r, self.out_w, self.err_r, self.err_w):
            os.close(fd)


def test_status_lines_wait_for_the_end_of_the_jobs_line() -> None:
    p = Pipes()
    try:
        mux = TerminalMux(p.out_w, p.err_w)
        assert mux.write_job(p.err_w, b"epoch 1: 50%")
        assert mux.status_line("trainmedic [0:00:10] step 5") is False
        assert mux.write_job(p.err_w, b"\rdone\n")
        assert mux.status_line("trainmedic [0:00:10] step 5") is True
        assert p.read(p.err_r) == b"epoch 1: 50%\rdone\ntrainmedic [0:00:10] step 5\n"
    finally:
        p.close()


def test_no_panel_unless_stderr_is_a_terminal() -> None:
    p = Pipes()
    try:
        mux = TerminalMux(p.out_w, p.err_w, panel=True)
        assert mux.panel_enabled is False
        assert mux.show_panel(["x"]) is False
    finally:
        p.close()


def raw_pty() -> tuple[int, int]:
    """A pty pair whose slave passes bytes unchanged (no "\\n" -> "\\r\\n")."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def read_pty(master: int, size: int) -> bytes:
    """``size`` bytes from the pty (the kernel may hand them over in pieces)."""
    out = b""
    while len(out) < size:
        ready, _, _ = select.select([master], [], [], 5)
        assert ready, f"only {len(out)} of {size} bytes arrived"
        out += os.read(master, 4096)
    return out


def test_the_panel_is_erased_before_the_jobs_output_and_redrawn_after() -> None:
    master, slave = raw_pty()
    out_r, out_w = os.pipe()
    try:
        mux = TerminalMux(out_w, slave, panel=True)
        assert mux.show_panel(["line one", "line two"])
        mux.write_job(slave, b"job says hi")
        assert mux.show_panel(["again"]) is False  # mid-line: not now
        mux.write_job(slave, b"\n")
        assert mux.show_panel(["again"])
        mux.clear_panel()
        expected = (
            b"line one\nline two\n"
            b"\x1b[2F\x1b[J"  # erase the two panel lines ...
            b"job says hi\n"  # ... so the job's bytes land where the panel was
            b"again\n"
            b"\x1b[1F\x1b[J"
        )
        written = read_pty(master, len(expected))
    finally:
        for fd in (master, slave, out_r, out_w):
            os.close(fd)
    assert written == expected


def test_a_broken_stdout_is_reported_once_and_not_written_again() -> None:
    r, w = os.pipe()
    os.close(r)
    err_r, err_w = os.pipe()
    try:
        mux = TerminalMux(w, err_w)
        assert mux.write_job(w, b"data") is False
        assert w in mux.broken
        assert mux.write_job(w, b"more") is False
    finally:
        for fd in (w, err_r, err_w):
            os.close(fd)


def test_the_pump_copies_every_byte_to_the_terminal_and_the_log(tmp_path: Path) -> None:
    job_r, job_w = os.pipe()
    p = Pipes()
    payload = bytes(range(256)) * 300 + b"\rpartial"
    try:
        mux = TerminalMux(p.out_w, p.err_w)
        pump = OutputPump(OutputStream(job_r, False), p.out_w, tmp_path / "stdout.log", mux)
        pump.start()
        collected = bytearray()
        os.set_blocking(p.out_r, True)

        def drain() -> None:
            while len(collected) < len(payload):
                collected.extend(os.read(p.out_r, 1 << 16))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        for i in range(0, len(payload), 1000):
            os.write(job_w, payload[i : i + 1000])
        os.close(job_w)
        pump.join(10)
        reader.join(10)
    finally:
        p.close()
    assert not pump.is_alive()
    assert bytes(collected) == payload
    assert (tmp_path / "stdout.log").read_bytes() == payload
    assert oct((tmp_path / "stdout.log").stat().st_mode & 0o777) == "0o600"
