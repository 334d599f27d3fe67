"""Stacks on demand: what every thread of a process is doing, when the supervisor asks.

Before it stops a hung job, the supervisor sends :data:`STACK_SIGNAL` to each
of the job's Python processes. The probe installs two handlers for it at
start-up, each covering cases the other cannot:

1. **faulthandler** (C level, ``chain=True``): writes the Python stack of the
   thread the signal interrupts as text to the attempt's stacks file from
   inside the signal handler itself. It needs neither the GIL nor the
   interpreter's attention, so it works when the main thread is stuck in C
   code that holds the GIL (a blocking call made through ``ctypes.PyDLL``, a C
   extension that never releases it) as well as in a busy Python loop,
   ``time.sleep``, a lock or a socket. The supervisor sends the signal to the
   main thread (``tgkill``). Only that thread is written: faulthandler reads
   other threads' frames without the GIL while those threads run on, and a
   frame being made or freed there (the stack sampler's work) crashed the
   job with a segmentation fault. The other threads are in the JSON dump.
2. **a Python-level handler**, called after faulthandler by the chain: it only
   sets a flag; the probe's own thread sees it within a quarter of a second
   and writes a structured JSON dump (thread names, every frame, what the
   innermost frame is calling, the phase and activity) next to the text file.
   It runs whenever the interpreter gets to run Python code, i.e. in every
   case above except C code holding the GIL, where the text dump stands alone.
   Doing the work on the probe's thread keeps the handler itself trivial: a
   handler that took locks or imported modules could deadlock the thread it
   interrupts.

Both handlers are inherited by forked children (DataLoader workers): they
write to the same file, opened with ``O_APPEND``; the supervisor signals one
process at a time and writes a header before each, so the dumps never mix.
A process started by ``exec`` installs its own. The supervisor checks that a
process catches the signal (``SigCgt`` in ``/proc/<pid>/status``) before
sending it, since an uncaught real-time signal would kill it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType
    from typing import Any

STACKS_ENV = "TRAINMEDIC_PROBE_STACKS"
"""Path of the attempt's text stacks file; the JSON dumps go to the same directory."""

_SIGRTMIN = getattr(signal, "SIGRTMIN", None)
STACK_SIGNAL: int = int(_SIGRTMIN) + 6 if _SIGRTMIN is not None else int(signal.SIGUSR2)
"""A real-time signal nothing in Python, torch or NCCL uses (``SIGUSR2`` where
real-time signals are missing); an uncaught one would end the process, which
is why the supervisor checks first."""

JSON_PREFIX = "stacks-"
"""JSON dump of process ``<pid>``: ``stacks-<pid>.json`` next to the text file."""
MAX_FRAMES = 64
"""Frames kept per thread, innermost first."""


def json_path(stacks_file: str, pid: int) -> str:
    """Where the JSON dump of process ``pid`` goes."""
    return os.path.join(os.path.dirname(stacks_file), f"{JSON_PREFIX}{pid}.json")


class StackDumps:
    """The two handlers of :data:`STACK_SIGNAL` in one process.

    Args:
        stacks_file: the attempt's text file (``$TRAINMEDIC_PROBE_STACKS``).
        on_request: called from the Python-level handler (must not block or
            take locks: it sets a flag the probe's thread polls).
    """

    def __init__(self, stacks_file: str, on_request: Callable[[], None]) -> None:
        self.stacks_file = stacks_file
        self._on_request = on_request
        self._fd: int | None = None

    def install(self) -> bool:
        """Install both handlers (main thread only); ``False`` when that is impossible."""
        if threading.current_thread() is not threading.main_thread():
            return False
        import faulthandler

        # The Python-level handler first: faulthandler chains to whatever was
        # installed before it, and calls it after writing the text dump.
        signal.signal(STACK_SIGNAL, self._handler)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._fd = os.open(self.stacks_file, flags, 0o600)
        faulthandler.register(STACK_SIGNAL, file=self._fd, all_threads=False, chain=True)
        return True

    def _handler(self, _signum: int, _frame: object) -> None:
        self._on_request()


def collect(
    pid: int,
    role: str,
    training_ident: int | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every thread's stack in this process as JSON-ready data.

    Threads come with their names and whether they are the main or the
    training thread; frames are innermost first, each ``{"file", "line",
    "function", "calls"}``, where ``calls`` names what the frame is calling
    (``["time", "sleep"]``) when its bytecode tells.
    """
    from trainmedic.probe.frames import callee_names

    # threading._active without its lock: a dump must never wait on a lock the
    # stuck thread may hold.
    names = {ident: t.name for ident, t in dict(getattr(threading, "_active", {})).items()}
    main_ident = threading.main_thread().ident
    me = threading.get_ident()
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the probe's own thread, writing this dump
        frames: list[dict[str, Any]] = []
        f: FrameType | None = frame
        while f is not None and len(frames) < MAX_FRAMES:
            code = f.f_code
            frames.append(
                {
                    "file": code.co_filename,
                    "line": f.f_lineno or 0,
                    "function": code.co_name,
                    "calls": list(callee_names(code, _instruction_at(code, f.f_lasti))),
                }
            )
            f = f.f_back
        del f, frame
        threads.append(
            {
                "ident": ident,
                "name": names.get(ident, "?"),
                "main": ident == main_ident,
                "training": ident == training_ident,
                "frames": frames,
            }
        )
    threads.sort(key=lambda t: (not t["main"], not t["training"], str(t["name"])))
    return {
        "pid": pid,
        "ppid": os.getppid(),
        "role": role,
        "t": time.time(),
        "argv": [str(a) for a in sys.argv],
        "threads": threads,
        **(extra or {}),
    }


_OFFSETS: dict[CodeType, list[int]] = {}


def _instruction_at(code: CodeType, lasti: int) -> int:
    """The offset of the instruction ``lasti`` falls in: a frame calling Python code
    points into its CALL's inline caches (Python 3.11+), not at the CALL."""
    import bisect
    import dis

    offsets = _OFFSETS.get(code)
    if offsets is None:
        if len(_OFFSETS) > 4096:
            _OFFSETS.clear()
        offsets = _OFFSETS[code] = [i.offset for i in dis.get_instructions(code)]
    i = bisect.bisect_right(offsets, lasti) - 1
    return offsets[i] if i >= 0 else lasti


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all (temporary file, then rename).

    Not ``fsync``-ed: the supervisor reads the dump at once, and a hung job's
    disk must not hold the dump up.
    """
    import json

    # Imported here, on the probe's thread: nothing extra at the job's start-up.
    from trainmedic.atomicfile import atomic_writer

    with atomic_writer(path, durable=False) as f:
        json.dump(data, f, indent=1, default=repr)
        f.write("\n")
