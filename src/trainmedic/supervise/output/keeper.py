"""The output keeper: the job's output outlives a killed supervisor.

The job writes into pipes (or pseudo-terminals) that ``trainmedic run``
reads. Were the supervisor killed (SIGKILL, the kernel's OOM killer), the
job's next write would meet a pipe without a reader — ``BrokenPipeError``
or SIGPIPE — and the user's training would die because its monitor did.

So the session starts one small process, the keeper
(:mod:`trainmedic.supervise.output.keeper_main`, a standard-library script of a few
MB), and hands it a copy of each output stream of each attempt as the stream
opens (``SCM_RIGHTS`` over a ``SOCK_SEQPACKET`` socket). While the supervisor
lives the keeper only waits on that socket: it reads nothing and costs
nothing. At the orderly end the supervisor says ``done`` and the keeper exits.
When the socket ends without ``done`` the supervisor is gone: the keeper
notes it in the record (a ``supervisor_lost`` event), removes the dead
socket, and carries the job's output on to the logs and the terminal until
the job's last writer is gone. The job itself never notices; the probe in it
notices its broken socket and switches itself off.

The keeper is not part of the job: it is excluded from the job's processes
(:func:`~trainmedic.supervise.launch.launcher.exclude_from_job`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

from trainmedic.supervise.launch.launcher import exclude_from_job

SUPERVISOR_LOST = "supervisor_lost"
"""Event kind the keeper appends to the record when it takes over."""
SCRIPT = Path(__file__).with_name("keeper_main.py")
CLOSE_WAIT_S = 5.0


def _field(text: str) -> str:
    """A message field: hex of the text (``-`` for empty), so spaces and any byte pass."""
    return text.encode("utf-8", "surrogateescape").hex() if text else "-"


class OutputKeeper:
    """The supervisor's end of the keeper; see the module docstring.

    Use :meth:`start`; every method is a no-op once the keeper is gone (the
    run goes on without it).
    """

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self._sock: socket.socket | None = sock
        self._ids = itertools.count(1)

    @classmethod
    def start(cls, run_dir: Path, socket_path: str | None, reserve: Path | None) -> OutputKeeper:
        """Start the keeper process for the run in ``run_dir``.

        Raises:
            OSError: it could not be started (the caller runs without it).
        """
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SCRIPT), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        exclude_from_job(proc.pid)
        keeper = cls(proc, mine)
        fields = [
            str(run_dir.resolve()),
            socket_path or "",
            "" if reserve is None else str(reserve.resolve()),
            SUPERVISOR_LOST,
        ]
        keeper._send(" ".join(["run", *(_field(f) for f in fields), str(os.getpid())]))
        return keeper

    def hold(self, stream_fd: int, target_fd: int, log_path: Path) -> int | None:
        """Give the keeper a copy of a stream; the id for :meth:`release`, or ``None``."""
        ident = next(self._ids)
        sent = self._send(f"hold {ident} {_field(str(log_path.resolve()))}", [stream_fd, target_fd])
        return ident if sent else None

    def release(self, ident: int) -> None:
        """The stream ended: the keeper closes its copy."""
        self._send(f"drop {ident}")

    def close(self) -> None:
        """The run ended in order: the keeper exits without taking over."""
        self._send("done")
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        try:
            self.proc.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _send(self, text: str, fds: list[int] | None = None) -> bool:
        sock = self._sock
        if sock is None:
            return False
        try:
            socket.send_fds(sock, [text.encode("ascii")], fds or [])
        except OSError:
            with contextlib.suppress(OSError):
                sock.close()
            self._sock = None
            return False
        return True
