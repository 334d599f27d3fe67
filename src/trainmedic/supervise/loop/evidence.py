"""What an attempt left behind, read after it ended: the evidence for classification.

Each reader is small and forgiving: evidence that cannot be read is
``None`` or empty, never an error (a decision must still be taken).

* :func:`stderr_tail` — the attempt's last stderr lines, from the log the
  output pump wrote (``stderr.log``, or ``output.log`` when both streams
  share one channel), starting at the attempt's offset;
* :func:`collect_error_reports` — the probes' error files of the attempt,
  moved into the attempt's directory so the next attempt starts clean;
* :class:`OomKillCounter` — the cgroup's ``oom_kill`` count (v2
  ``memory.events``, v1 ``memory.oom_control``), read before and after;
* :func:`read_kernel_log` — Xid and OOM-killer lines from ``/dev/kmsg``
  logged since the attempt began (usually only readable as root);
* :func:`gpu_faults` — ECC errors and row-remapping failures that appeared
  between the attempt's first and last GPU readings.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from trainmedic.gpu.types import GpuSample
from trainmedic.resilience.classify import STDERR_TAIL_LINES, GpuFault, GpuRef
from trainmedic.resilience.errorfile import ERRORS_SUBDIR, ErrorReport, read_error_reports

TAIL_BYTES = 256 * 1024
"""At most this much of the log's end is read for the tail."""
_KMSG_RELEVANT = re.compile(r"NVRM: Xid|Out of memory|oom-kill|Killed process|Memory cgroup out")


def stderr_tail(path: Path, start_offset: int, lines: int = STDERR_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines written to ``path`` after ``start_offset``."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            begin = max(start_offset, end - TAIL_BYTES)
            f.seek(begin)
            data = f.read(end - begin)
    except OSError:
        return ()
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    # A progress bar redraws with \r: each redraw is its own line for the classifier.
    return tuple(text.replace("\r", "\n").splitlines()[-lines:])


def log_size(path: Path) -> int:
    """The current size of ``path`` (0 when missing): an attempt's start offset."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def collect_error_reports(run_dir: Path, attempt_dir: Path) -> tuple[ErrorReport, ...]:
    """Read the error files the attempt's processes wrote into ``run_dir/errors``
    and move them to ``attempt_dir/errors``."""
    source = run_dir / ERRORS_SUBDIR
    reports = tuple(read_error_reports(source))
    if source.is_dir():
        target = attempt_dir / ERRORS_SUBDIR
        with contextlib.suppress(OSError):
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            for entry in source.iterdir():
                shutil.move(str(entry), str(target / entry.name))
            source.rmdir()
    return reports


class OomKillCounter:
    """The OOM-kill counter of the cgroup process ``pid`` (trainmedic's own,
    which the job shares) belongs to."""

    def __init__(self, pid: int | str = "self") -> None:
        self._location = None
        with contextlib.suppress(Exception):
            from trainmedic.host.cgroup import locate_cgroup

            self._location = locate_cgroup(pid=pid).memory

    def read(self) -> int | None:
        if self._location is None:
            return None
        try:
            from trainmedic.host.cgroup import read_memory

            return read_memory(self._location).oom_kills
        except Exception:
            return None


def oom_kill_delta(before: int | None, after: int | None) -> int | None:
    if before is None or after is None:
        return None
    return max(0, after - before)


def read_kernel_log(since_monotonic: float, kmsg: str = "/dev/kmsg") -> tuple[str, ...]:
    """Xid and OOM-killer lines the kernel logged after ``since_monotonic``
    (``time.monotonic()``, the clock of the kernel's timestamps); empty when
    ``/dev/kmsg`` cannot be read (it usually needs root)."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ()
    records: list[str] = []
    try:
        while len(records) < 100_000:
            try:
                record = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # a record was overwritten while we read: go on
            except OSError:
                break
            if not record:
                break
            records.append(record.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return relevant_kernel_lines(records, since_monotonic)


def relevant_kernel_lines(records: Iterable[str], since_monotonic: float) -> tuple[str, ...]:
    """The Xid and OOM-killer messages among ``/dev/kmsg`` records
    (``"<prio>,<seq>,<usec>,<flags>;<message>"``) logged at or after ``since_monotonic``."""
    found: list[str] = []
    since_us = since_monotonic * 1e6
    for record in records:
        head, _, message = record.partition(";")
        fields = head.split(",")
        try:
            stamp_us = float(fields[2])
        except (IndexError, ValueError):
            continue
        text = message.split("\n", 1)[0]
        if stamp_us >= since_us and _KMSG_RELEVANT.search(text):
            found.append(text)
    return tuple(found[-50:])


def gpu_faults(
    first: Mapping[int, GpuSample], last: Mapping[int, GpuSample]
) -> tuple[GpuFault, ...]:
    """Hardware faults that appeared between each GPU's first and last reading."""
    faults: list[GpuFault] = []
    for index, end in last.items():
        start = first.get(index)
        if start is None:
            continue
        ref = end.ref
        grew = _grew(start.ecc.volatile_uncorrected, end.ecc.volatile_uncorrected)
        if grew:
            faults.append(GpuFault(ref, f"volatile uncorrected ECC errors +{grew}"))
        if end.remapped_rows.failure and not start.remapped_rows.failure:
            faults.append(GpuFault(ref, "row remap failure"))
        if end.unreachable and not start.unreachable:
            faults.append(GpuFault(ref, f"unreachable: {end.unreachable}"))
    return tuple(faults)


def _grew(before: int | None, after: int | None) -> int:
    if before is None or after is None:
        return 0
    return max(0, after - before)


def gpu_refs(samples: Iterable[GpuSample]) -> tuple[GpuRef, ...]:
    """The machine's GPUs as the remedies name them."""
    return tuple(s.ref for s in samples)
