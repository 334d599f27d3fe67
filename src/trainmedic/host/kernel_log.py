"""The kernel log, where the NVIDIA driver reports Xid errors.

``/dev/kmsg`` gives one record per ``read()`` as ``"<prio>,<seq>,<usec>,<flags>;<message>"``
(``usec``: ``CLOCK_MONOTONIC`` microseconds). It is usually readable only by
root (``kernel.dmesg_restrict``) and absent in many containers: every reader
here answers ``None`` or nothing then, never an error.

* :func:`read_driver_lines` - the NVIDIA driver's Xid lines since boot (for
  doctor), from ``/dev/kmsg``, else from ``journalctl -k`` when the user may
  read the journal;
* :class:`KmsgFollower` - new records as they are logged (for a run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

KMSG = "/dev/kmsg"
MAX_RECORDS = 100_000
"""At most this many records are read at once (the ring buffer holds far fewer)."""
DRIVER_MARKERS = ("NVRM: Xid", "NVRM: GPU at")
"""Driver lines worth keeping: Xids, and the line naming a GPU's UUID before its first Xid."""


def split_record(record: str) -> tuple[float | None, str]:
    """(monotonic seconds, message) of one ``/dev/kmsg`` record."""
    head, sep, message = record.partition(";")
    if not sep:
        return None, record.rstrip("\n")
    fields = head.split(",")
    try:
        stamp = float(fields[2]) / 1e6
    except (IndexError, ValueError):
        stamp = None
    return stamp, message.split("\n", 1)[0]


def _read_available(fd: int, limit: int = MAX_RECORDS) -> list[str]:
    records: list[str] = []
    while len(records) < limit:
        try:
            record = os.read(fd, 8192)  # one record per read
        except BlockingIOError:
            break
        except BrokenPipeError:
            continue  # records were overwritten while we read: go on with the next
        except OSError:
            break
        if not record:
            break
        # /dev/kmsg gives one record (and its " KEY=value" continuation lines) per
        # read; a saved log file gives many: keep every record's first line.
        text = record.decode("utf-8", "replace")
        records += [line for line in text.split("\n") if line and not line.startswith(" ")]
    return records


def driver_lines(messages: Iterable[str]) -> tuple[str, ...]:
    """The NVIDIA driver's Xid and GPU-identity lines among ``messages``."""
    return tuple(m for m in messages if any(k in m for k in DRIVER_MARKERS))


def read_driver_lines(kmsg: str = KMSG, journal: bool = True) -> tuple[str, ...] | None:
    """The driver's Xid lines since boot, oldest first; ``None`` when no log is readable."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return _journal_lines() if journal else None
    try:
        records = _read_available(fd)
    finally:
        os.close(fd)
    return driver_lines(split_record(r)[1] for r in records)


def _journal_lines() -> tuple[str, ...] | None:
    """The same from systemd's journal (readable to the adm/systemd-journal groups)."""
    exe = shutil.which("journalctl")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "-k", "-b", "--no-pager", "-o", "cat", "-g", "NVRM: (Xid|GPU at)"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # 1: no match; anything else without output: no permission or no journal.
    if done.returncode not in (0, 1) or (done.returncode == 1 and done.stderr.strip()):
        return None
    return driver_lines(done.stdout.splitlines())


class KmsgFollower:
    """Kernel log records logged after it was opened, read as they come.

    ``opened`` is ``False`` when ``/dev/kmsg`` cannot be read; :meth:`poll`
    then returns nothing.
    """

    def __init__(self, kmsg: str = KMSG) -> None:
        self._fd: int | None = None
        try:
            fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)  # only what is logged from now on
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    @property
    def opened(self) -> bool:
        return self._fd is not None

    def poll(self) -> list[str]:
        """Messages logged since the last call (first lines only)."""
        if self._fd is None:
            return []
        return [split_record(r)[1] for r in _read_available(self._fd)]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
