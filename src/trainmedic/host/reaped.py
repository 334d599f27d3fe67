"""A helper command run to its end, with the CPU it used read from the kernel.

py-spy samples the job from outside (``trainmedic attach``, and the
supervisor's sampling of the training processes): what it costs is its own
CPU, which ``wait4`` reports for the reaped child (user + system seconds).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path


def run_measured(
    argv: list[str],
    log: Path,
    timeout_s: float,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> tuple[int, str, float] | None:
    """Run ``argv`` (its output to ``log``) and reap it with ``wait4``:
    ``(exit code, output, CPU seconds)``, or ``None`` when it ran past ``timeout_s``
    (it is killed). ``started`` receives the process once it runs (to signal it).

    Raises:
        OSError: the command could not be started.
    """
    with log.open("w+b") as sink:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            if started is not None:
                started(proc)
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        # Reaped here, not by Popen: tell it, so that it never waits on the pid again.
        proc.returncode = os.waitstatus_to_exitcode(status)
        sink.seek(0)
        said = sink.read(256 * 1024).decode(errors="replace")
    if killed.is_set():
        return None
    return proc.returncode, said, usage.ru_utime + usage.ru_stime
