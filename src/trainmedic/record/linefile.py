"""The JSON-lines files of a run record: private, appended whole lines, torn lines healed.

Each line goes through the :class:`~trainmedic.record.guard.RecordGuard`, so a
full disk stops the record at a line boundary and never the run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmedic.record.guard import RecordGuard

FILE_MODE = 0o600
"""Permissions of every file of a run record."""
_BUFFER_BYTES = 64 * 1024


def dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def open_private(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        # O_CREAT's mode is only used for new files; an existing one is tightened.
        os.fchmod(fd, FILE_MODE)
        drop_partial_line(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LineFile:
    """One JSON-lines file of the record: lines buffered, written through the guard.

    Nothing but whole lines is handed to the guard, and after a failed write
    nothing more is written, so the file ends at most with one cut line (which
    the loader skips).
    """

    def __init__(self, fd: int, name: str, guard: RecordGuard) -> None:
        self.fd = fd
        self.name = name
        self._guard = guard
        self._buffer = bytearray()
        self._lines = 0

    def write(self, line: str) -> None:
        # A lone surrogate (an undecodable byte of a path) becomes a JSON \udcXX escape.
        self._buffer += line.encode("utf-8", "backslashreplace")
        self._lines += 1
        if len(self._buffer) >= _BUFFER_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        data, lines = bytes(self._buffer), self._lines
        self._buffer.clear()
        self._lines = 0
        self._guard.write_all(self.fd, data, self.name, lines=lines)

    def sync(self) -> None:
        self.flush()
        if not self._guard.tripped:
            self._guard.attempt(self.name, lambda: os.fsync(self.fd))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def drop_partial_line(fd: int) -> None:
    """End the file's last line if a crash left it without its newline: a whole
    record gets the newline, a cut one is removed. Appending to a record
    written before (a resumed run) then never glues a new line onto it."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - 4096)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    else:
        keep = 0
    if keep == size:
        return
    try:
        json.loads(os.pread(fd, size - keep, keep))
    except ValueError:
        os.ftruncate(fd, keep)
    else:
        os.write(fd, b"\n")
