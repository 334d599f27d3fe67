"""Forensics of a hung job, taken before it is stopped.

:func:`capture_hang` asks every Python process of the job for its stacks
(:data:`trainmedic.probe.forensics.STACK_SIGNAL`, one process at a time),
runs ``py-spy dump --native`` on them when py-spy is installed, and saves
in the attempt's directory:

* ``stacks.txt`` — the main thread of every process, as faulthandler writes it
  (works even when that thread is stuck in C code holding the GIL);
* ``stacks-<pid>.json`` — every thread, with names and what each frame is
  calling, when the process's interpreter could still run Python code;
* ``py-spy-<pid>.txt`` — native and Python frames, when py-spy is installed
  and allowed to attach (ptrace);
* ``hang.json`` — the verdict, the one-line summary, the main threads'
  stacks, the last steps and the last GPU readings.

:mod:`trainmedic.supervise.hang.stack_dumps` reads the dumps back and says in one line
where the training thread hung.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainmedic.atomicfile import write_atomic
from trainmedic.host.tgkill import signal_thread
from trainmedic.optional import install_hint
from trainmedic.probe.forensics import JSON_PREFIX, STACK_SIGNAL
from trainmedic.supervise.hang.stack_dumps import (
    HEADER,
    STACKS_TEXT,
    ProcessStacks,
    read_stacks,
    summarize_stacks,
)
from trainmedic.supervise.hang.stack_dumps import JobProcess as JobProcess  # its users' import path
from trainmedic.supervise.launch.stop import caught_signals

HANG_FILE = "hang.json"
PY_SPY_TIMEOUT_S = 15.0
MAX_PY_SPY = 8
"""At most this many processes are dumped with py-spy (each takes a second or more)."""
DUMP_SETTLE_S = 0.06
"""A text dump is complete when the file stopped growing for this long."""
DUMP_WAIT_S = 1.0
"""Longest wait for one process's text dump."""
JSON_WAIT_S = 1.5
"""Longest wait for the JSON dumps: the probe's thread looks for the request every
0.25 s in a process that stopped making progress (a hung one, a peer blocked on
it), every second in one still making progress (``probe.agent.STEADY_S``)."""


@dataclass(frozen=True)
class HangForensics:
    """What was saved about a hang.

    Attributes:
        summary: one line for the report (``hung in ... called from ...``).
        location: the training thread's innermost frame in the user's code,
            ``path:line in function`` (how repeated hangs are recognised).
        processes: stacks per process, the lead process first.
        files: the files written, relative to the attempt's directory.
        notes: what could not be done (no handler, py-spy missing or refused).
        took_s: seconds the capture took.
    """

    summary: str
    location: str | None
    processes: tuple[ProcessStacks, ...] = ()
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    took_s: float = 0.0


@dataclass
class _Capture:
    directory: Path
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def capture_hang(
    directory: Path,
    processes: Sequence[JobProcess],
    *,
    lead_pid: int | None,
    verdict: Mapping[str, Any],
    last_steps: Sequence[Mapping[str, Any]] = (),
    gpu: Sequence[Mapping[str, Any]] = (),
    py_spy: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HangForensics:
    """Collect stacks of ``processes`` into ``directory`` and write ``hang.json``.

    Args:
        directory: the attempt's directory (exists; the probes' stacks file is
            ``directory / stacks.txt``).
        lead_pid: the process whose training thread the summary describes.
        verdict: the watchdog's verdict, saved as it is.
        last_steps / gpu: the last step records and GPU readings, JSON-ready.
        py_spy: path of py-spy (``shutil.which("py-spy")``), ``None`` to skip.
    """
    cap = _Capture(directory, clock, sleep)
    t0 = clock()
    text_path = directory / STACKS_TEXT
    signalled = _signal_each(cap, processes, text_path)
    _wait_json(cap, signalled)
    if py_spy is not None:
        _py_spy(
            cap, py_spy, [p.pid for p in processes if p.pid in signalled or p.role != "unknown"]
        )
    elif processes:
        cap.notes.append(f"py-spy is not installed: no native stacks ({install_hint('native')})")
    stacks = read_stacks(directory, processes)
    ordered = sorted(stacks, key=lambda s: (s.pid != lead_pid, s.pid))
    lead = next((s for s in ordered if s.pid == lead_pid), ordered[0] if ordered else None)
    summary, location = summarize_stacks(lead, [s for s in ordered if s is not lead])
    if text_path.exists() and text_path.stat().st_size > 0:
        cap.files.insert(0, STACKS_TEXT)
    forensics = HangForensics(
        summary=summary,
        location=location,
        processes=tuple(ordered),
        files=tuple(cap.files),
        notes=tuple(cap.notes),
        took_s=clock() - t0,
    )
    try:
        _write_hang_file(directory, forensics, verdict, last_steps, gpu)
    except OSError as exc:  # a full disk must not keep a hung job from being stopped
        forensics = replace(forensics, notes=(*forensics.notes, f"hang.json not written: {exc}"))
    return forensics


def _signal_each(cap: _Capture, processes: Sequence[JobProcess], text_path: Path) -> set[int]:
    """Send the stack signal to each process that catches it, one at a time."""
    signalled: set[int] = set()
    for proc in processes:
        caught = caught_signals(proc.pid)
        if caught is None or STACK_SIGNAL not in caught:
            if proc.role != "unknown":
                cap.notes.append(f"pid {proc.pid} has no stack handler (probe not loaded there)")
            continue
        before = _size(text_path)
        with contextlib.suppress(OSError):
            fd = os.open(text_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, f"\n{HEADER.format(pid=proc.pid, role=proc.role)}\n".encode())
            finally:
                os.close(fd)
        try:
            _signal_main_thread(proc.pid)
        except OSError:
            continue
        signalled.add(proc.pid)
        _wait_settled(cap, text_path, before)
    return signalled


def _signal_main_thread(pid: int) -> None:
    """The stack signal to the process's main thread, the one its text dump shows
    (the probe's handler dumps only the thread it interrupts: a dump of threads that
    run on meanwhile can read a frame half made and crash the job). A process whose
    main thread has ended gets it as a process."""
    try:
        signal_thread(pid, pid, STACK_SIGNAL)
    except ProcessLookupError:
        os.kill(pid, STACK_SIGNAL)


def _wait_settled(cap: _Capture, path: Path, before: int) -> None:
    """Wait until ``path`` grew and then stopped growing (the dump is whole)."""
    t0 = cap.clock()
    last, stable_since = _size(path), cap.clock()
    while cap.clock() - t0 < DUMP_WAIT_S:
        cap.sleep(0.01)
        size = _size(path)
        if size != last:
            last, stable_since = size, cap.clock()
        elif size > before + 80 and cap.clock() - stable_since >= DUMP_SETTLE_S:
            return


def _wait_json(cap: _Capture, pids: set[int]) -> None:
    t0 = cap.clock()
    while pids and cap.clock() - t0 < JSON_WAIT_S:
        if all((cap.directory / f"{JSON_PREFIX}{pid}.json").exists() for pid in pids):
            break
        cap.sleep(0.05)
    for pid in sorted(pids):
        if (cap.directory / f"{JSON_PREFIX}{pid}.json").exists():
            cap.files.append(f"{JSON_PREFIX}{pid}.json")


def _py_spy(cap: _Capture, py_spy: str, pids: Sequence[int]) -> None:
    for pid in list(pids)[:MAX_PY_SPY]:
        out = cap.directory / f"py-spy-{pid}.txt"
        result = None
        for extra in (["--native"], []):
            try:
                result = subprocess.run(
                    [py_spy, "dump", "--pid", str(pid), *extra],
                    capture_output=True,
                    timeout=PY_SPY_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                cap.notes.append(f"py-spy on pid {pid} failed: {type(exc).__name__}")
                result = None
                break
            if result.returncode == 0:
                break
        if result is None:
            continue
        if result.returncode != 0:
            reason = result.stderr.decode("utf-8", "replace").strip().splitlines()
            cap.notes.append(
                f"py-spy could not read pid {pid}: {reason[-1] if reason else 'failed'}"
                " (it needs ptrace permission: CAP_SYS_PTRACE in containers)"
            )
            continue
        try:
            # No fsync on the way to stopping a hung job: a stalled disk must not hold it up.
            write_atomic(out, result.stdout, durable=False)
        except OSError as exc:  # a full disk: the other files may still fit
            cap.notes.append(f"{out.name} not written: {exc}")
            continue
        cap.files.append(out.name)


# --- files ------------------------------------------------------------------------------


def _write_hang_file(
    directory: Path,
    forensics: HangForensics,
    verdict: Mapping[str, Any],
    last_steps: Sequence[Mapping[str, Any]],
    gpu: Sequence[Mapping[str, Any]],
) -> None:
    data = {
        "summary": forensics.summary,
        "location": forensics.location,
        "verdict": dict(verdict),
        "processes": [
            {
                "pid": p.pid,
                "role": p.role,
                "source": p.source,
                "focus": None
                if p.focus is None
                else [f.where(full=True) for f in p.focus.frames[:32]],
            }
            for p in forensics.processes
        ],
        "last_steps": list(last_steps),
        "gpu": list(gpu),
        "files": list(forensics.files),
        "notes": list(forensics.notes),
        "took_s": round(forensics.took_s, 3),
    }
    write_atomic(
        directory / HANG_FILE, json.dumps(data, indent=1, default=repr) + "\n", durable=False
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def find_py_spy() -> str | None:
    """py-spy's path, when installed: beside this interpreter first (a virtual
    environment's ``bin``, not on ``PATH`` unless activated), else on ``PATH``."""
    for directory in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        candidate = os.path.join(directory, "py-spy")
        if directory and os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    return shutil.which("py-spy")
