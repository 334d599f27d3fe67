"""The job's output on its way through: to the terminal (or pipe) and to the run directory.

One :class:`OutputPump` thread per stream reads the job's bytes as they come
and hands each chunk, unchanged, to :class:`TerminalMux` (trainmedic's own
stdout or stderr) and to ``stdout.log`` / ``stderr.log``. Partial lines and
carriage returns pass as they are, so progress bars still redraw in place.
Neither a closed stdout (``| head``) nor a full disk stops the job's writes:
the pump keeps reading, and stops only the destination that failed.

:class:`TerminalMux` is the only writer of trainmedic's stdout and stderr
while the job runs. It knows whether each stream stands at the start of a
line, and so where the live panel (or a plain status line) may go without
cutting into a line of the job: the panel is erased before the job's bytes
are written and drawn again only when every stream on that terminal is at a
line start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from trainmedic.record.guard import RecordGuard
from trainmedic.supervise.launch.launcher import OutputStream, same_destination

if TYPE_CHECKING:
    from trainmedic.supervise.output.keeper import OutputKeeper

_READ_BYTES = 64 * 1024
_ERASE_UP = "\x1b[{n}F\x1b[J"  # to the start of the line n lines up, then clear below


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]


def _same_terminal(a: int, b: int) -> bool:
    try:
        return os.fstat(a).st_rdev == os.fstat(b).st_rdev
    except OSError:
        return False


class TerminalMux:
    """Serialises every write to trainmedic's stdout and stderr.

    Args:
        out_fd / err_fd: trainmedic's stdout and stderr.
        panel: whether a live panel may be drawn on ``err_fd`` (a terminal).
    """

    def __init__(self, out_fd: int = 1, err_fd: int = 2, panel: bool = False) -> None:
        self.out_fd = out_fd
        self.err_fd = err_fd
        self._lock = threading.RLock()
        # Two descriptors leading to one place share one "where is the line" state.
        shared = same_destination(out_fd, err_fd)
        self._key = {out_fd: out_fd, err_fd: out_fd if shared else err_fd}
        self._line_start = {out_fd: True, err_fd: True}
        self.panel_enabled = panel and os.isatty(err_fd)
        # Streams whose bytes land on the panel's terminal.
        self._panel_streams = {err_fd}
        if self.panel_enabled and os.isatty(out_fd) and _same_terminal(out_fd, err_fd):
            self._panel_streams.add(out_fd)
        self._panel_lines = 0
        self.broken: set[int] = set()

    def at_line_start(self, fd: int) -> bool:
        return self._line_start.get(self._key.get(fd, fd), True)

    def write_job(self, fd: int, data: bytes) -> bool:
        """Write the job's ``data`` to ``fd`` unchanged; ``False`` once ``fd`` is broken."""
        if not data:
            return True
        with self._lock:
            if fd in self.broken:
                return False
            if fd in self._panel_streams:
                self._erase_panel()
            try:
                _write_all(fd, data)
            except OSError:
                # EPIPE (the reader went away), EIO (the terminal closed), ENOSPC
                # (``> file`` on a full disk), ...: stop writing there, for good;
                # the pump goes on reading, so the job never notices.
                self.broken.add(fd)
                return False
            self._line_start[self._key[fd]] = data.endswith(b"\n")
            return True

    def show_panel(self, lines: list[str]) -> bool:
        """Draw (or redraw) the panel when every stream on its terminal is at a line start."""
        with self._lock:
            if not self.panel_enabled or self.err_fd in self.broken:
                return False
            if not all(self.at_line_start(fd) for fd in self._panel_streams):
                return False
            self._erase_panel()
            text = "".join(line + "\n" for line in lines)
            try:
                _write_all(self.err_fd, text.encode("utf-8", "replace"))
            except OSError:
                self.broken.add(self.err_fd)
                return False
            self._panel_lines = len(lines)
            return True

    def clear_panel(self) -> None:
        with self._lock:
            self._erase_panel()

    def _erase_panel(self) -> None:
        if self._panel_lines:
            n, self._panel_lines = self._panel_lines, 0
            with contextlib.suppress(OSError):
                _write_all(self.err_fd, _ERASE_UP.format(n=n).encode())

    def status_line(self, text: str) -> bool:
        """Write one plain status line to stderr, only at a line start of the job's stderr."""
        with self._lock:
            if self.err_fd in self.broken or not self.at_line_start(self.err_fd):
                return False
            try:
                _write_all(self.err_fd, (text + "\n").encode("utf-8", "replace"))
            except OSError:
                self.broken.add(self.err_fd)
                return False
            return True

    def notice(self, text: str) -> None:
        """A line trainmedic must show now (a signal escalation), on a line of its own."""
        with self._lock:
            self._erase_panel()
            prefix = "" if self.at_line_start(self.err_fd) else "\n"
            with contextlib.suppress(OSError):
                _write_all(self.err_fd, f"{prefix}trainmedic: {text}\n".encode("utf-8", "replace"))
            self._line_start[self._key[self.err_fd]] = True


class OutputPump(threading.Thread):
    """Copies one of the job's streams to trainmedic's stream and to a log file.

    When trainmedic's own stream breaks (its reader went away: ``| head``),
    the pump stops forwarding but keeps reading into the log: the job writes
    into trainmedic's pipe, which stays open, so its writes go on succeeding
    and the log stays complete. Log writes go through ``guard``: a full disk
    stops the log, never the forwarding. ``keeper`` (when given) holds a
    copy of the stream for the case trainmedic itself is killed
    (:mod:`trainmedic.supervise.output.keeper`).
    """

    def __init__(
        self,
        stream: OutputStream,
        target_fd: int,
        log_path: Path,
        mux: TerminalMux,
        guard: RecordGuard | None = None,
        keeper: OutputKeeper | None = None,
    ) -> None:
        super().__init__(name=f"trainmedic-output-{target_fd}", daemon=True)
        self.stream = stream
        self.target_fd = target_fd
        self.log_path = log_path
        self.mux = mux
        self.guard = guard or RecordGuard()
        self.keeper = keeper
        self.bytes = 0
        self.forwarded = 0
        self._held: int | None = None
        if keeper is not None:
            self._held = keeper.hold(stream.fd, target_fd, log_path)

    def run(self) -> None:
        name = self.log_path.name
        log_fd: int | None = None

        def open_log() -> None:
            nonlocal log_fd
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        self.guard.attempt(name, open_log)
        forwarding = True
        try:
            while True:
                try:
                    data = os.read(self.stream.fd, _READ_BYTES)
                except InterruptedError:
                    continue
                except OSError:
                    break  # EIO: every writer of the pty is gone
                if not data:
                    break
                self.bytes += len(data)
                if log_fd is not None:
                    self.guard.write_all(log_fd, data, name)
                else:
                    self.guard.lose(name, size=len(data))
                if forwarding:
                    forwarding = self.mux.write_job(self.target_fd, data)
                    if forwarding:
                        self.forwarded += len(data)
        finally:
            if log_fd is not None:
                os.close(log_fd)
            if self.keeper is not None and self._held is not None:
                self.keeper.release(self._held)
            with contextlib.suppress(OSError):
                os.close(self.stream.fd)
