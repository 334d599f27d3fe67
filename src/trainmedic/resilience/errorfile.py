"""The error file: how a dying training process tells the supervisor why.

The probe (:mod:`trainmedic.probe.crash`) writes one file per process that
ends with an uncaught exception, ``<run dir>/errors/error-<pid>.json``, in
torch.distributed.elastic's layout plus a few top-level fields of ours, so
tools that read torchelastic's error files read ours and a job that already
uses ``@record`` is understood too (docs/restarts.md, "Error file"):

.. code-block:: json

    {
      "message": {
        "message": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ...",
        "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n ...",
                      "timestamp": "1717000000"}
      },
      "pid": 4242,
      "type": "torch.OutOfMemoryError",
      "argv": ["train.py", "--lr", "0.1"]
    }

Optional top-level fields, read when present: ``t`` (Unix seconds with a
fraction, finer than ``timestamp``), ``rank``, ``step`` (last completed step)
and ``phase``. The supervisor reads every file after the job exits and hands
the reports to :func:`trainmedic.resilience.classify.classify_failure`, which
takes the earliest as the root cause (later ones are usually other ranks
reacting to it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmedic import jsonfile

ERRORS_SUBDIR = "errors"
"""Subdirectory of the run directory holding the error files."""

_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+),? in (\S+)')
# The job's paths, not this process's: libraries are recognised by path shape.
_LIBRARY_PATH_RE = re.compile(r"[/\\](?:site-packages|dist-packages|lib[/\\]python3[.\d]*)[/\\]")


@dataclass(frozen=True)
class Frame:
    """One traceback frame; :attr:`ErrorReport.frames` lists them outermost first.

    Attributes:
        user_code: the path is neither an installed package nor the standard
            library: most likely the user's own script.
    """

    file: str
    line: int
    function: str
    user_code: bool


@dataclass(frozen=True)
class ErrorReport:
    """An uncaught exception in one process of the job.

    Attributes:
        t: Unix time it was recorded, seconds.
        pid: the process.
        exc_type: qualified type name (``torch.OutOfMemoryError``; builtins
            without a module: ``KeyError``).
        message: the exception's message, without the type.
        traceback: the formatted traceback, chained exceptions included.
        rank / step / phase: distributed rank, last completed step and phase,
            when the probe knew them.
    """

    t: float
    pid: int
    exc_type: str
    message: str
    traceback: str = ""
    rank: int | None = None
    step: int | None = None
    phase: str | None = None

    @property
    def frames(self) -> tuple[Frame, ...]:
        """The frames of the traceback text, outermost first."""
        return tuple(
            Frame(m[1], int(m[2]), m[3], is_user_code(m[1]))
            for line in self.traceback.splitlines()
            if (m := _FRAME_RE.match(line))
        )

    @property
    def location(self) -> str | None:
        """Innermost frame in user code (else the innermost) as ``file:line in function``."""
        frames = self.frames
        chosen = next((f for f in reversed(frames) if f.user_code), frames[-1] if frames else None)
        return None if chosen is None else f"{chosen.file}:{chosen.line} in {chosen.function}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, pid: int = 0) -> ErrorReport:
        """Parse an error file's JSON; raise ``ValueError`` naming what is wrong.

        ``pid`` is used when the data does not name one (torchelastic's own files).
        """
        if not isinstance(data, Mapping) or "message" not in data:
            raise ValueError("no 'message': not an error file")
        message = data["message"]
        callstack = ""
        timestamp: Any = data.get("timestamp")
        if isinstance(message, Mapping):
            extra = message.get("extraInfo")
            extra = {} if extra is None else extra
            if not isinstance(extra, Mapping):
                raise ValueError("message.extraInfo is not an object")
            callstack = str(extra.get("py_callstack") or "")
            timestamp = extra.get("timestamp", timestamp)
            message = message.get("message", "")
        text = str(message)
        exc_type = data.get("type")
        if exc_type is not None and not isinstance(exc_type, str):
            raise ValueError("type is not a string")
        head, sep, rest = text.partition(": ")
        if exc_type:
            exc_type = exc_type.removeprefix("builtins.")
            # The message starts with the type's short name: keep only the message.
            if sep and exc_type.rsplit(".", 1)[-1] == head.rsplit(".", 1)[-1]:
                text = rest
        elif sep and " " not in head:
            exc_type, text = head, rest
        else:
            exc_type = "Exception"
        try:
            t = float(data["t"]) if data.get("t") is not None else float(timestamp or 0.0)
            return cls(
                t=t,
                pid=int(data.get("pid") or pid),
                exc_type=exc_type,
                message=text,
                traceback=callstack,
                rank=None if data.get("rank") is None else int(data["rank"]),
                step=None if data.get("step") is None else int(data["step"]),
                phase=None if data.get("phase") is None else str(data["phase"]),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"a field has the wrong type ({e})") from e


MAX_ERROR_FILE_BYTES = 8 * 1024 * 1024
"""Largest error file read, bytes (the probe shortens tracebacks far below)."""


def is_user_code(path: str) -> bool:
    """Whether a traceback path is the user's code (not a package, not the standard library)."""
    return not (path.startswith("<") or _LIBRARY_PATH_RE.search(path))


def read_error_file(path: str | os.PathLike[str]) -> ErrorReport:
    """Read one error file; raise ``ValueError`` (or ``OSError``) when it is unusable."""
    p = Path(path)
    try:
        data = jsonfile.read_json(p, max_bytes=MAX_ERROR_FILE_BYTES)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from e
    except ValueError as e:  # not UTF-8, too large, nested too deeply
        raise ValueError(f"{p}: {jsonfile.describe(e)}") from e
    digits = p.stem.removeprefix("error-")
    try:
        return ErrorReport.from_dict(data, pid=int(digits) if digits.isdigit() else 0)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from e


def read_error_reports(directory: str | os.PathLike[str]) -> list[ErrorReport]:
    """Every readable ``error-*.json`` in ``directory``, earliest first.

    Unreadable files are skipped: a report is evidence, and missing evidence
    must not stop the supervisor from deciding.
    """
    reports = []
    try:
        paths = sorted(Path(directory).glob("error-*.json"))
    except OSError:
        return []
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            reports.append(read_error_file(path))
    reports.sort(key=lambda r: r.t)
    return reports
