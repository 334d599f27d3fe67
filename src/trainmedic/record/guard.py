"""When the run directory stops taking writes: a full disk, a quota, a read-only remount.

The job's exit status and its terminal output never depend on the run
directory. One :class:`RecordGuard` per run is shared by every writer into
the run directory (the record writer, the output logs, the attempt files);
the first write that fails trips it, and from then on:

* recording stops: later writes are not attempted (a record with a gap in
  the middle would be misread as a stall), only counted as lost;
* the guard keeps the note of what was lost (which file failed, when, why,
  how many record lines and log bytes were not written), for the one line
  the person is shown and for the findings document;
* the run's end gets room to write its findings and final metadata if at all
  possible: :meth:`RecordGuard.reserve` set aside a small file at the start,
  and :meth:`RecordGuard.release` removes it when the guard tripped.

The write function is a seam (``os.write`` by default), so tests trip the
guard with an injected ``ENOSPC`` instead of a full filesystem.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainmedic.findings.model import Finding

WriteFn = Callable[[int, bytes | memoryview], int]
"""``os.write``'s shape: write some of ``data`` to ``fd``, return how many bytes."""

RESERVE_NAME = ".trainmedic-reserve"
RESERVE_BYTES = 256 * 1024
"""Space set aside at the start of a run for its final metadata and findings, bytes."""


@dataclass(frozen=True)
class RecordLoss:
    """What a tripped guard knows: when recording stopped, why, what was lost.

    Attributes:
        error: ``strerror`` of the failed write (``No space left on device``).
        errno_name: ``ENOSPC``, ``EDQUOT``, ``EROFS``, ...
        file: the file whose write failed, relative to the run directory.
        t: Unix time the first write failed.
        lost_lines: record lines not written, per file.
        lost_bytes: output bytes not written, per log file.
    """

    error: str
    errno_name: str
    file: str
    t: float
    lost_lines: dict[str, int]
    lost_bytes: dict[str, int]

    def message(self, run_dir: Path, started_at: float | None = None) -> str:
        """The one line the person is shown."""
        from trainmedic.ostext import printable

        when = ""
        if started_at is not None:
            when = f" {_clock(max(0.0, self.t - started_at))} into the run"
        lines = sum(self.lost_lines.values())
        size = sum(self.lost_bytes.values())
        lost = []
        if lines:
            lost.append(f"{lines} record line(s)")
        if size:
            lost.append(f"{_size(size)} of the job's output in the logs")
        what = f"; not written: {' and '.join(lost)}" if lost else ""
        return (
            f"the run directory {printable(str(run_dir))} stopped taking writes{when} "
            f"({self.error} writing {self.file}): recording stopped there{what}; "
            "the job's exit status and its output on this terminal are complete"
        )

    def to_data(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "errno": self.errno_name,
            "file": self.file,
            "t": round(self.t, 3),
            "lost_lines": dict(self.lost_lines),
            "lost_bytes": dict(self.lost_bytes),
        }


class RecordGuard:
    """Shared by the writers of one run directory; see the module docstring.

    Args:
        write: the write function every guarded write goes through.
        wall: the clock stamping when the guard tripped.
    """

    def __init__(self, write: WriteFn = os.write, wall: Callable[[], float] = time.time) -> None:
        self.write = write
        self._wall = wall
        self._lock = threading.Lock()
        self._error: OSError | None = None
        self._file = ""
        self._t = 0.0
        self._lost_lines: Counter[str] = Counter()
        self._lost_bytes: Counter[str] = Counter()
        self._reserve: Path | None = None

    @property
    def tripped(self) -> bool:
        return self._error is not None

    def write_all(self, fd: int, data: bytes, what: str, lines: int = 0) -> bool:
        """Write ``data`` whole to ``fd``; ``False`` when the guard is (now) tripped.

        ``what`` names the file (for the note); ``lines`` is how many record
        lines ``data`` holds (counted as lost when it is not written; otherwise
        its bytes are counted).
        """
        if self._error is not None:
            self.lose(what, lines=lines, size=0 if lines else len(data))
            return False
        view = memoryview(data)
        while view:
            try:
                n = self.write(fd, view)
            except InterruptedError:
                continue
            except OSError as exc:
                self.trip(exc, what)
                self.lose(what, lines=lines, size=0 if lines else len(view))
                return False
            view = view[n:]
        return True

    def attempt(self, what: str, action: Callable[[], object]) -> bool:
        """Run ``action`` (a write into the run directory); an ``OSError`` trips the guard."""
        if self._error is not None:
            return False
        try:
            action()
        except OSError as exc:
            self.trip(exc, what)
            return False
        return True

    def trip(self, exc: OSError, what: str) -> None:
        """Record the first failure; later ones add nothing."""
        with self._lock:
            if self._error is None:
                self._error = exc
                self._file = what
                self._t = self._wall()

    def lose(self, what: str, lines: int = 0, size: int = 0) -> None:
        with self._lock:
            if lines:
                self._lost_lines[what] += lines
            if size:
                self._lost_bytes[what] += size

    def loss(self) -> RecordLoss | None:
        """What was lost, or ``None`` while every write succeeded."""
        with self._lock:
            exc = self._error
            if exc is None:
                return None
            return RecordLoss(
                error=exc.strerror or str(exc),
                errno_name=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                file=self._file,
                t=self._t,
                lost_lines=dict(self._lost_lines),
                lost_bytes=dict(self._lost_bytes),
            )

    # --- room for the end of the run ---------------------------------------------------------

    def reserve(self, run_dir: Path, size: int = RESERVE_BYTES) -> bool:
        """Set ``size`` bytes aside in ``run_dir`` (a private file); ``False``: no room."""
        path = run_dir / RESERVE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return False
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except (AttributeError, OSError):
                block = b"\0" * 65536
                for _ in range(0, size, len(block)):
                    os.write(fd, block)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            return False
        os.close(fd)
        self._reserve = path
        return True

    @property
    def reserve_path(self) -> Path | None:
        """The reserve file while it exists."""
        return self._reserve

    def release(self) -> None:
        """Give the reserved space back (at the end of the run, or to write its findings)."""
        path, self._reserve = self._reserve, None
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def record_loss_finding(loss: RecordLoss, run_dir: str, started_at: float | None) -> Finding:
    """The finding that tells a reader of the report that the record has a hole."""
    from trainmedic.findings.model import Category, Finding, Severity

    when = ""
    if started_at is not None:
        when = f" {_clock(max(0.0, loss.t - started_at))} into the run"
    return Finding(
        id="record.incomplete",
        category=Category.IO,
        severity=Severity.WARNING,
        title=f"The run directory stopped taking writes{when} ({loss.error}): the record "
        "ends there, and the diagnosis sees only the run before it",
        evidence={
            "error": loss.errno_name,
            "file": loss.file,
            "lost_record_lines": sum(loss.lost_lines.values()),
            "lost_log_bytes": sum(loss.lost_bytes.values()),
        },
        fix=f"Free space where {run_dir} lives, or give --out a directory on a disk with "
        "room; checkpoints written to that disk fail the same way.",
        subject=run_dir,
    )
