"""The output keeper's process: standard library only, run as ``python -I -S keeper_main.py FD``.

See :mod:`trainmedic.supervise.output.keeper` for what it is for. It reads its
instructions from the SOCK_SEQPACKET socket ``FD`` (one message each, the
file descriptors it is to hold attached), and does nothing else while the
supervisor lives. Messages (fields separated by spaces, text fields hex-coded
UTF-8 with surrogate escapes):

* ``run RUN_DIR SOCKET_PATH RESERVE_PATH EVENT_KIND SUPERVISOR_PID`` — once, first;
* ``hold ID LOG_PATH`` with two descriptors attached: the job's stream (what
  the supervisor reads) and the supervisor's stdout or stderr it goes to;
* ``drop ID`` — that stream ended in the supervisor;
* ``done`` — the run ended in order: exit.

The end of the socket without ``done`` means the supervisor died. The keeper
then takes over: it appends one event to the record's ``events.jsonl``,
removes the dead supervisor's socket and reserve file, and copies every held
stream to its log and to the supervisor's stdout/stderr (stopping only a
destination that fails) until the job's last writer is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time

_READ = 64 * 1024
_MAX_FDS = 2


def _text(field: str) -> str:
    if field == "-":
        return ""
    try:
        return bytes.fromhex(field).decode("utf-8", "surrogateescape")
    except ValueError:
        return ""


class _Stream:
    def __init__(self, fd: int, target: int, log_path: str) -> None:
        self.fd = fd
        self.target: int | None = target
        self.log_path = log_path
        self.log: int | None = None

    def open_log(self) -> None:
        try:
            self.log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            self.log = None

    def pass_on(self, data: bytes) -> None:
        for attr in ("log", "target"):
            fd = getattr(self, attr)
            if fd is None:
                continue
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                setattr(self, attr, None)  # a full disk, a closed pipe: that one stops

    def close(self) -> None:
        for fd in (self.fd, self.log, self.target):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTSTP):
        # The terminal's keys are for the supervisor, which decides what the job gets.
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[1]))
    run: list[str] = []
    held: dict[str, _Stream] = {}
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 65536, _MAX_FDS)
        except InterruptedError:
            continue
        except OSError:
            msg, fds = b"", []
        if not msg:
            break
        fields = msg.decode("ascii", "replace").split()
        kind = fields[0] if fields else ""
        if kind == "done":
            return 0
        if kind == "run":
            run = fields[1:]
        elif kind == "hold" and len(fields) == 3 and len(fds) == 2:
            held[fields[1]] = _Stream(fds[0], fds[1], _text(fields[2]))
            continue
        elif kind == "drop" and len(fields) == 2:
            stream = held.pop(fields[1], None)
            if stream is not None:
                stream.close()
        for fd in fds:
            os.close(fd)
    take_over(run, list(held.values()))
    return 0


def take_over(run: list[str], streams: list[_Stream]) -> None:
    """The supervisor is gone: note it in the record, clean up after it, carry the output."""
    if len(run) == 5:
        run_dir, sock_path, reserve, kind, pid = (
            _text(run[0]),
            _text(run[1]),
            _text(run[2]),
            _text(run[3]),
            run[4],
        )
        _note(run_dir, kind, int(pid) if pid.isdigit() else None, len(streams))
        for path in (sock_path, reserve):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        if sock_path and os.path.basename(os.path.dirname(sock_path)).startswith("trainmedic-"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(sock_path))  # the private temporary directory
    for stream in streams:
        stream.open_log()
    selector = selectors.DefaultSelector()
    for stream in streams:
        selector.register(stream.fd, selectors.EVENT_READ, stream)
    while selector.get_map():
        for key, _ in selector.select():
            stream = key.data
            try:
                data = os.read(stream.fd, _READ)
            except OSError:
                data = b""  # EIO: the pty's last writer is gone
            if data:
                stream.pass_on(data)
            else:
                selector.unregister(stream.fd)
                stream.close()


def _note(run_dir: str, kind: str, pid: int | None, streams: int) -> None:
    """Append one event to the record's events.jsonl (after ending a cut last line)."""
    path = os.path.join(run_dir, "events.jsonl")
    event = {
        "t": round(time.time(), 6),
        "kind": kind,
        "message": (
            f"the supervisor (pid {pid}) ended without finishing the run: the job ran on "
            "unsupervised (no hang detection, no restarts); its output went on to the "
            "logs and the terminal"
        ),
        "pid": pid,
        "data": {"streams": streams},
    }
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        if size:
            tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
            if not tail.endswith(b"\n"):
                # The supervisor died in the middle of a line: drop the cut piece.
                cut = tail.rfind(b"\n")
                os.ftruncate(fd, size - len(tail) + cut + 1 if cut >= 0 else size - len(tail))
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
