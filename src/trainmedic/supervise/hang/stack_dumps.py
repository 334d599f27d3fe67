"""Reading the stacks a hung job left, and the line that says where it hung.

:func:`read_stacks` gathers each process's threads from the best source there
is: the probe's JSON dump (``stacks-<pid>.json``: thread names and calls), else
faulthandler's text dump (``stacks.txt``), else the last heartbeat's frames.
:func:`summarize_stacks` turns the training thread's stack into the line the
report shows: ``hung in `dist.all_reduce` called from train.py:88 in main``.
:mod:`trainmedic.supervise.hang.forensics` takes the dumps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmedic.probe.forensics import JSON_PREFIX
from trainmedic.resilience.errorfile import is_user_code

STACKS_TEXT = "stacks.txt"
"""faulthandler's dumps of every process, each under a :data:`HEADER` line."""
HEADER = "=== trainmedic: stacks of pid {pid} ({role}) ==="
_HEADER_RE = re.compile(r"^=== trainmedic: stacks of pid (\d+) \((.*)\) ===$")
_THREAD_RE = re.compile(
    r"^(?:(Current thread|Thread) (0x[0-9a-fA-F]+) |Stack )\(most recent call first\):"
)
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

    The probe writes only the thread the signal interrupted (``Stack (most recent
    call first):``, no thread id): the main thread, which the supervisor signals.
    Dumps of every thread (``Thread 0x...``) do not name threads; there the main
    thread is the one whose outermost frame is not ``threading.py``'s ``_bootstrap``.
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
            # ident 0: the one thread of a ``Stack`` dump, the main thread signalled.
            main = ident == 0 or (
                outer is not None
                and not (
                    outer.function.startswith("_bootstrap") and outer.file.endswith("threading.py")
                )
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
            ident = int(thread[2], 16) if thread[2] else 0
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


_TRAINMEDIC_DIR = str(Path(__file__).resolve().parents[2]) + "/"
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


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
