"""Forensics of a hung job, taken before it is stopped.

:func:`capture_hang` asks every Python process of the job for its stacks
(:data:`trainmedic.probe.forensics.STACK_SIGNAL`, one process at a time),
runs ``py-spy dump --native`` on them when py-spy is installed, and saves
in the attempt's directory:

* ``stacks.txt`` — every thread of every process, as faulthandler writes it
  (works even when the main thread is stuck in C code holding the GIL);
* ``stacks-<pid>.json`` — the same with thread names and what each frame is
  calling, when the process's interpreter could still run Python code;
* ``py-spy-<pid>.txt`` — native and Python frames, when py-spy is installed
  and allowed to attach (ptrace);
* ``hang.json`` — the verdict, the one-line summary, the main threads'
  stacks, the last steps and the last GPU readings.

:func:`summarize_stacks` turns the training thread's stack into the line the
report shows: ``hung in `dist.all_reduce` called from train.py:88 in main``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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
from trainmedic.optional import install_hint
from trainmedic.probe.forensics import JSON_PREFIX, STACK_SIGNAL
from trainmedic.resilience.errorfile import is_user_code
from trainmedic.supervise.stop import caught_signals

STACKS_TEXT = "stacks.txt"
HANG_FILE = "hang.json"
PY_SPY_TIMEOUT_S = 15.0
MAX_PY_SPY = 8
"""At most this many processes are dumped with py-spy (each takes a second or more)."""
DUMP_SETTLE_S = 0.06
"""A text dump is complete when the file stopped growing for this long."""
DUMP_WAIT_S = 1.0
"""Longest wait for one process's text dump."""
JSON_WAIT_S = 1.0
"""Longest wait for the JSON dumps (the probe's thread polls every 0.25 s)."""

_HEADER = "=== trainmedic: stacks of pid {pid} ({role}) ==="
_HEADER_RE = re.compile(r"^=== trainmedic: stacks of pid (\d+) \((.*)\) ===$")
_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


@dataclass(frozen=True)
class StackFrame:
    """One Python frame; ``calls`` is what it was calling when its bytecode told
    (``("time", "sleep")``)."""

    file: str
    line: int
    function: str
    calls: tuple[str, ...] = ()

    def where(self, full: bool = False) -> str:
        path = self.file if full else _short(self.file)
        return f"{path}:{self.line} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread; ``frames`` innermost first."""

    ident: int
    name: str
    main: bool
    training: bool
    frames: tuple[StackFrame, ...]


@dataclass(frozen=True)
class ProcessStacks:
    """The threads of one process, and where they were read from
    (``json``, ``faulthandler`` or ``heartbeat``)."""

    pid: int
    role: str
    source: str
    threads: tuple[ThreadStack, ...]

    @property
    def focus(self) -> ThreadStack | None:
        """The thread that matters: the training thread, else the main thread."""
        for t in self.threads:
            if t.training:
                return t
        for t in self.threads:
            if t.main:
                return t
        return self.threads[0] if self.threads else None


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


@dataclass(frozen=True)
class JobProcess:
    """A process of the job to ask for stacks.

    Attributes:
        role: ``process``, ``forked``, ``worker`` (from its probe's hello), or
            ``unknown`` for a process without a probe.
        heartbeat_stack: the innermost frames its last heartbeat carried
            (``"file:line function"``), a fallback when no dump arrives.
    """

    pid: int
    role: str = "unknown"
    heartbeat_stack: tuple[str, ...] = ()


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
                os.write(fd, f"\n{_HEADER.format(pid=proc.pid, role=proc.role)}\n".encode())
            finally:
                os.close(fd)
        try:
            os.kill(proc.pid, STACK_SIGNAL)
        except OSError:
            continue
        signalled.add(proc.pid)
        _wait_settled(cap, text_path, before)
    return signalled


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
            write_atomic(out, result.stdout)
        except OSError as exc:  # a full disk: the other files may still fit
            cap.notes.append(f"{out.name} not written: {exc}")
            continue
        cap.files.append(out.name)


# --- reading the dumps ----------------------------------------------------------------


def read_stacks(directory: Path, processes: Sequence[JobProcess]) -> list[ProcessStacks]:
    """Stacks per process: the JSON dump, else the text dump, else the last heartbeat."""
    text = parse_faulthandler_text(_read_text(directory / STACKS_TEXT))
    out = []
    for proc in processes:
        from_json = _from_json(directory / f"{JSON_PREFIX}{proc.pid}.json", proc)
        if from_json is not None:
            out.append(from_json)
        elif proc.pid in text:
            role, threads = text[proc.pid]
            out.append(ProcessStacks(proc.pid, role or proc.role, "faulthandler", threads))
        elif proc.heartbeat_stack:
            out.append(
                ProcessStacks(
                    proc.pid, proc.role, "heartbeat", (_heartbeat_thread(proc.heartbeat_stack),)
                )
            )
    return out


def _from_json(path: Path, proc: JobProcess) -> ProcessStacks | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        threads = []
        for t in data["threads"]:
            frames = tuple(
                StackFrame(
                    str(f["file"]),
                    int(f["line"]),
                    str(f["function"]),
                    tuple(str(n) for n in f.get("calls") or ()),
                )
                for f in t["frames"]
            )
            threads.append(
                ThreadStack(
                    int(t["ident"]), str(t["name"]), bool(t["main"]), bool(t["training"]), frames
                )
            )
        return ProcessStacks(proc.pid, str(data.get("role") or proc.role), "json", tuple(threads))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def parse_faulthandler_text(text: str) -> dict[int, tuple[str, tuple[ThreadStack, ...]]]:
    """Threads per pid from ``stacks.txt`` (faulthandler's format under our headers).

    faulthandler does not name threads; the main thread is the one whose
    outermost frame is not ``threading.py``'s ``_bootstrap``.
    """
    out: dict[int, tuple[str, tuple[ThreadStack, ...]]] = {}
    pid: int | None = None
    role = ""
    threads: list[ThreadStack] = []
    ident: int | None = None
    frames: list[StackFrame] = []

    def close_thread() -> None:
        nonlocal ident, frames
        if ident is not None:
            outer = frames[-1] if frames else None
            main = outer is not None and not (
                outer.function.startswith("_bootstrap") and outer.file.endswith("threading.py")
            )
            threads.append(ThreadStack(ident, "?", main, False, tuple(frames)))
        ident, frames = None, []

    def close_process() -> None:
        nonlocal threads
        close_thread()
        if pid is not None and threads:
            out[pid] = (role, tuple(threads))
        threads = []

    for line in text.splitlines():
        header = _HEADER_RE.match(line)
        if header:
            close_process()
            pid, role = int(header[1]), header[2]
            continue
        thread = _THREAD_RE.match(line)
        if thread:
            close_thread()
            ident = int(thread[2], 16)
            continue
        frame = _FRAME_RE.match(line)
        if frame and ident is not None:
            frames.append(StackFrame(frame[1], int(frame[2]), frame[3].strip()))
    close_process()
    return out


def _heartbeat_thread(stack: Sequence[str]) -> ThreadStack:
    frames = []
    for entry in stack:
        where, _, function = entry.rpartition(" ")
        path, _, line = where.rpartition(":")
        frames.append(StackFrame(path, int(line) if line.isdigit() else 0, function))
    return ThreadStack(0, "main", True, True, tuple(frames))


# --- the summary ------------------------------------------------------------------------


_TRAINMEDIC_DIR = str(Path(__file__).resolve().parent.parent) + "/"
_DEMO_DIR = _TRAINMEDIC_DIR + "demo/"


def is_users(path: str) -> bool:
    """The user's own code: not a library, the standard library, ``<string>``, or
    trainmedic itself (its API and probe; the demo's training scripts are a user's)."""
    p = path.replace("\\", "/")
    if p.startswith(_TRAINMEDIC_DIR) and not p.startswith(_DEMO_DIR):
        return False
    return is_user_code(p) and not p.startswith("<")


def summarize_stacks(
    lead: ProcessStacks | None, others: Sequence[ProcessStacks] = ()
) -> tuple[str, str | None]:
    """(one line for the report, the user frame where the training thread hung)."""
    thread = lead.focus if lead is not None else None
    if thread is None or not thread.frames:
        return "hung; no stack could be read (no probe in the job?)", None
    frames = thread.frames
    user_i = next((i for i, f in enumerate(frames) if is_users(f.file)), None)
    inner = frames[0]
    if user_i is None:
        what = f"`{_dotted(inner)}`"
        summary = f"hung in {what} ({inner.where()})"
        location = inner.where(full=True)
    else:
        user = frames[user_i]
        location = user.where(full=True)
        if user.calls:
            callee = ".".join(user.calls)
        elif user_i > 0:
            callee = _dotted(frames[user_i - 1])
        else:
            callee = ""
        if callee:
            summary = f"hung in `{callee}` called from {user.where()}"
        else:
            summary = f"hung at {user.where()} (Python code or a C call without a Python frame)"
        if user_i > 1 and not user.calls:
            summary += f"; innermost {inner.where()}"
    if lead is not None and lead.source == "heartbeat":
        summary += " (from the last heartbeat: the process answered no stack request)"
    for other in others:
        t = other.focus
        if other.role != "worker" or t is None:
            continue
        frame = next((f for f in t.frames if is_users(f.file)), None)
        if frame is not None:
            summary += f"; DataLoader worker {other.pid} at {frame.where()}"
            break
    return summary, location


def _dotted(frame: StackFrame) -> str:
    """``torch.distributed.distributed_c10d.all_reduce`` for a library frame."""
    p = frame.file.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            module = p.split(marker, 1)[1]
            break
    else:
        module = re.sub(r"^.*/lib/python3[.\d]*/", "", p) if "/lib/python3" in p else _short(p)
    module = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return f"{module}.{frame.function}"


def _short(path: str) -> str:
    parts = path.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 and parts[-2] else parts[-1]


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
    write_atomic(directory / HANG_FILE, json.dumps(data, indent=1, default=repr) + "\n")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def find_py_spy() -> str | None:
    """py-spy's path, when installed: beside this interpreter first (a virtual
    environment's ``bin``, not on ``PATH`` unless activated), else on ``PATH``."""
    for directory in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        candidate = os.path.join(directory, "py-spy")
        if directory and os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    return shutil.which("py-spy")
