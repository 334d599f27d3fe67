"""A signal to one thread of another process: faulthandler writes the stack of the
thread the signal interrupted, so its dump says which thread got it."""

from __future__ import annotations

import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainmedic.host.tgkill import TGKILL, signal_thread

pytestmark = pytest.mark.skipif(
    platform.machine() not in TGKILL or not sys.platform.startswith("linux"),
    reason="tgkill is called by number on Linux only",
)

CHILD = """
import faulthandler, signal, sys, threading, time
out = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR2, file=out, all_threads=False)
def helper_waits():
    time.sleep(60)
t = threading.Thread(target=helper_waits, daemon=True)
t.start()
def main_waits():
    print(t.native_id, flush=True)
    time.sleep(60)
main_waits()
"""


def wait_for(path: Path, text: str) -> str:
    deadline = time.monotonic() + 10
    while text not in (content := path.read_text()):
        assert time.monotonic() < deadline, content
        time.sleep(0.02)
    return content


def test_the_signal_reaches_the_thread_named(tmp_path: Path) -> None:
    out = tmp_path / "stacks.txt"
    out.touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        helper = int(proc.stdout.readline())
        assert signal_thread(proc.pid, helper, signal.SIGUSR2)
        first = wait_for(out, "in helper_waits")
        assert "in main_waits" not in first
        assert signal_thread(proc.pid, proc.pid, signal.SIGUSR2)
        wait_for(out, "in main_waits")
        assert proc.poll() is None
        with pytest.raises(ProcessLookupError):
            signal_thread(proc.pid, 2**22 + 7, signal.SIGUSR2)
    finally:
        proc.kill()
        proc.wait()
