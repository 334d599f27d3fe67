"""Run a ``trainmedic tune`` command in a child process that its budget can stop.

``tune`` calls the user's code - a factory, a ``Dataset.__getitem__``, a model's
step - and any of it may block for good (a lock, a network read, a batch larger
than the dataset). Within one process nothing can stop a Python call that does
not return, so the command runs again in a child (``TRAINMEDIC_TUNE_CHILD=1``)
in a session of its own; the parent passes its output through line by line
(as the user's terminal, or a test's captured streams, would get it) and, past
the budget and a start-up allowance, stops the child's whole process group
(DataLoader workers too) and says so in one line. What was measured by then
has been printed already, trial by trial.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

CHILD_ENV = "TRAINMEDIC_TUNE_CHILD"
DONE_FD_ENV = "TRAINMEDIC_TUNE_DONE_FD"
"""A pipe the child writes ``done`` into when its command finished: one that exits 0
without it was ended by the user's code (``os._exit``), not by trainmedic."""
STARTUP_S = 20.0
"""Seconds allowed beyond the budget: the interpreter, torch and the user's module
to import, the factory to build its dataset."""
STOP_GRACE_S = 3.0
"""Seconds between SIGTERM and SIGKILL for the child's processes."""
CHILD_MAIN = (
    "import sys; del sys.path[0]; from trainmedic.cli.main import main; "
    "sys.exit(main(sys.argv[1:]))"
)
"""The child's entry: as the ``trainmedic`` console script, without the current
directory first on ``sys.path`` (``-m`` and ``-c`` put it there), where a user's
``json.py`` would hide the standard library's from trainmedic and torch."""
OVERRUN_EXIT = 3
"""Exit status of a command stopped at its budget."""


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def mark_done() -> None:
    """In the child: the command finished and said what it had to say."""
    fd = os.environ.get(DONE_FD_ENV)
    if fd and fd.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(fd), b"done")


def _pump(source: IO[bytes], sink: IO[str]) -> None:
    for raw in iter(source.readline, b""):
        with contextlib.suppress(OSError, ValueError):
            sink.write(raw.decode("utf-8", "replace"))
            sink.flush()


def run_bounded(args: Sequence[str], budget_s: float, what: str) -> int:
    """``trainmedic ARGS`` in a child, stopped after ``budget_s`` + :data:`STARTUP_S`;
    its exit status, or :data:`OVERRUN_EXIT` when it had to be stopped."""
    done_r, done_w = os.pipe()
    env = {**os.environ, CHILD_ENV: "1", DONE_FD_ENV: str(done_w)}
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD_MAIN, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            pass_fds=(done_w,),
            start_new_session=True,  # one group: its DataLoader workers stop with it
        )
    finally:
        os.close(done_w)
    try:
        return _watch(child, budget_s, what, done_r)
    finally:
        os.close(done_r)


def _watch(child: subprocess.Popen[bytes], budget_s: float, what: str, done_r: int) -> int:
    assert child.stdout is not None and child.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(child.stdout, sys.stdout), daemon=True),
        threading.Thread(target=_pump, args=(child.stderr, sys.stderr), daemon=True),
    ]
    for p in pumps:
        p.start()
    limit = budget_s + STARTUP_S
    try:
        code = child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        _stop(child)
        for p in pumps:
            p.join(timeout=STOP_GRACE_S)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                f"trainmedic: error: {what} was stopped at its budget ({budget_s:g} s, and "
                f"{STARTUP_S:g} s to start): your code did not return in time (a call that "
                "blocks, or a batch larger than the dataset); what was measured is above\n"
            )
        return OVERRUN_EXIT
    except BaseException:  # Ctrl-C: the child is in its own session, stop it too
        _stop(child)
        raise
    # What the child left behind (a DataLoader worker it did not stop) would hold the
    # pipes open: the command is over, so is its process group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    for p in pumps:
        p.join(timeout=STOP_GRACE_S)
    os.set_blocking(done_r, False)
    try:
        done = os.read(done_r, 16) == b"done"
    except OSError:  # nothing written (EAGAIN): the child never got there
        done = False
    if code == 0 and not done:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                f"trainmedic: error: {what} ended without a result: your code ended the "
                "process (os._exit, or a library that exits) before it finished\n"
            )
        return 1
    return 128 - code if code < 0 else code


def _stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's process group, SIGKILL to what is left after the grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)
        try:
            child.wait(timeout=STOP_GRACE_S)
            if sig == signal.SIGTERM:
                # The leader is gone; its workers may not be: the group gets SIGKILL too.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
