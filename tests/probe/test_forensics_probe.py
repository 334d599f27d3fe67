"""The probe's stack dumps: faulthandler text from the signal, JSON from the probe's thread."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainmedic.probe.forensics import STACK_SIGNAL, collect, json_path, write_json

# Installs the handlers, then blocks in time.sleep; the request callback writes a
# marker so the test sees that the Python-level handler ran too.
CHILD = """
import os, sys, time
from trainmedic.probe.forensics import StackDumps
stacks = sys.argv[1]
dumps = StackDumps(stacks, lambda: open(stacks + ".requested", "w").close())
assert dumps.install()
def wait_here():
    print("ready", flush=True)
    time.sleep(30)
wait_here()
"""


def test_the_signal_writes_every_threads_stack_and_requests_the_json(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(stacks)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(STACK_SIGNAL)
        deadline = time.monotonic() + 10
        while not Path(f"{stacks}.requested").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.poll() is None  # the process lives on after the dump
        text = stacks.read_text()
        assert "(most recent call first):" in text
        assert "in wait_here" in text and 'File "<string>", line 10 in <module>' in text
    finally:
        proc.kill()
        proc.wait()


def test_collect_names_threads_frames_and_the_call_in_progress(tmp_path: Path) -> None:
    ready = threading.Event()
    release = threading.Event()

    def blocked_worker() -> None:
        ready.set()
        release.wait(30)

    t = threading.Thread(target=blocked_worker, name="loader-7")
    t.start()
    collected: list[dict[str, Any]] = []
    # collect() leaves out the thread that calls it (the probe's own, in a job).
    probe = threading.Thread(
        target=lambda: collected.append(
            collect(123, "process", threading.main_thread().ident, {"phase": "eval"})
        ),
        name="trainmedic-probe",
    )
    try:
        assert ready.wait(10)
        probe.start()
        probe.join(10)
    finally:
        release.set()
        t.join()
    data = collected[0]
    assert data["pid"] == 123 and data["phase"] == "eval"
    threads = {th["name"]: th for th in data["threads"]}
    assert "trainmedic-probe" not in threads
    assert data["threads"][0]["main"]  # the main thread first
    worker = threads["loader-7"]
    frames = worker["frames"]
    caller = next(f for f in frames if f["function"] == "blocked_worker")
    assert caller["calls"] == ["release", "wait"]  # a Python-level call, named as written
    assert caller["file"] == __file__
    path = json_path(str(tmp_path / "stacks.txt"), 123)
    write_json(path, data)
    assert json.loads(Path(path).read_text())["threads"][0]["main"]
