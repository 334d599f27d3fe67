"""The job's uncaught exceptions: an event on the channel and an error file on disk.

The probe chains ``sys.excepthook`` and ``threading.excepthook``
(:mod:`trainmedic.probe.runtime`): the previous hook still runs, so the
traceback prints exactly as before, after the exception was recorded here.
The error file (``<run dir>/errors/error-<pid>.json``) uses
torchelastic's layout (``{"message": {"message", "extraInfo": {"py_callstack",
"timestamp"}}}``) so tools that read those read ours, and it survives a
channel that is gone by the time the process dies.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from trainmedic.atomicfile import atomic_writer
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent

ERRORS_DIR = "errors"


def describe(exc_type: type[BaseException], exc: BaseException | None) -> str:
    """``"Type: message"`` on one line."""
    text = " ".join(str(exc).split()) if exc is not None else ""
    return f"{exc_type.__qualname__}: {text}" if text else exc_type.__qualname__


def exception_event(
    kind: EventKind,
    exc_type: type[BaseException],
    exc: BaseException | None,
    tb: TracebackType | None,
    pid: int,
    thread: str | None = None,
) -> RunEvent:
    """The event recording one uncaught exception."""
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    data: dict[str, Any] = {
        "type": f"{exc_type.__module__}.{exc_type.__qualname__}",
        "traceback": text,
    }
    if thread is not None:
        data["thread"] = thread
    return RunEvent(t=time.time(), kind=kind, message=describe(exc_type, exc), pid=pid, data=data)


def write_error_file(run_dir: str, event: RunEvent, argv: list[str]) -> Path:
    """Write the torchelastic-style error file for ``event``; returns its path."""
    directory = Path(run_dir) / ERRORS_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / f"error-{event.pid}.json"
    body = {
        "message": {
            "message": event.message,
            "extraInfo": {
                "py_callstack": event.data.get("traceback", ""),
                "timestamp": str(int(event.t)),
            },
        },
        "pid": event.pid,
        "argv": argv,
        "type": event.data.get("type"),
    }
    # Called from the exception hooks, with the interpreter still whole: a
    # temporary file and a rename are as safe there as anywhere, and a reader
    # (or a second exception from another thread) never sees half a file. No
    # fsync: a slow disk must not hold up the dying process's exit.
    with atomic_writer(path, durable=False) as f:
        json.dump(body, f, indent=2)
        f.write("\n")
    return path
