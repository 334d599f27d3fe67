"""Ending the processes a test started, all of them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` and every process below it: torchrun starts its ranks in sessions of
    their own, which killing its process group misses (a rank asleep for good would
    outlive the test)."""
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        below = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(psutil.Error):
            child.kill()
    proc.wait(10)
