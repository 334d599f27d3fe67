"""Steps through shared memory: the probe writes fixed-size records, the supervisor reads them.

Why it exists: a step sent over the socket needs a thread in the job to
encode and send it, and every time that thread runs it takes the interpreter
lock from the training loop. Written into a ring of shared memory instead,
a step costs the training thread one ``struct.pack_into`` (about 0.6 µs with
its times worked out, measured on a 0.7 ms CPU step) and wakes nothing: the
supervisor's channel thread reads the ring on its own clock.

The memory is an anonymous file (``memfd_create``) the probe maps and hands
to the supervisor over the Unix socket with its hello (``SCM_RIGHTS``): no
name in any file system, nothing to clean up, readable by no one else.
Where any of that is missing (no ``memfd_create``, a TCP channel) the probe
keeps sending steps as lines.

The layout, little-endian:

* a header of :data:`HEADER_BYTES`: the magic, the record size and the capacity;
* a name table of :data:`NAME_SLOTS` slots of :data:`NAME_BYTES` (a length byte,
  then UTF-8): a record's source and phase are indices into it, filled in by
  the writer before the first record that uses them;
* :data:`CAPACITY` records of :data:`RECORD` (``seq``, the step's fields,
  ``seq`` again). Record ``seq`` (from 1) sits in slot ``(seq - 1) % capacity``.

There is one writer (the training thread) and one reader, and no lock: the
reader takes a record only when both of its ``seq`` stamps are the one it
expects, so a record being written, or overwritten by a writer that went
round the ring past the reader, is never taken; records the writer
overwrote unread are counted as lost. Python issues no memory barriers, so
on a CPU that reorders stores (Arm) a record whose stamps are both visible
could, rarely, still show an older value in between; on x86 stores are seen
in order.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from typing import Any

    from trainmedic.record.types import StepRecord

MAGIC = b"TMSTEPS1"
HEADER = struct.Struct("<8sII")
HEADER_BYTES = 64
NAME_SLOTS = 64
NAME_BYTES = 32
RECORD = struct.Struct("<QqdddddqqqqqBBb5xQ")
"""seq, step, t (Unix s), duration_s, data_wait_s, compute_s, gpu_time_s (NaN: none),
samples, alloc_peak_bytes, reserved_peak_bytes, alloc_retries, ooms (-1: none),
source, phase (name indices), autocast (-1: none), seq."""
CAPACITY = 16384
"""Records the ring holds: 1.8 MiB, about 12 s of 0.7 ms steps (the supervisor
reads it every :data:`~trainmedic.channel.server.DRAIN_S`)."""
NONE = -1
RECORD_BYTES = RECORD.size
_NAMES_AT = HEADER_BYTES
RECORDS_AT = HEADER_BYTES + NAME_SLOTS * NAME_BYTES
"""Where record slot 0 begins, bytes from the start of the file."""


def ring_bytes(capacity: int) -> int:
    """The size of a ring of ``capacity`` records, bytes."""
    return RECORDS_AT + capacity * RECORD.size


_SEALS = (
    getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
    | getattr(fcntl, "F_SEAL_SEAL", 0)
)  # fmt: skip


def available() -> bool:
    """Whether this platform can make a ring (Linux's ``memfd_create`` and file seals)."""
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


class RingWriter:
    """The probe's end: one anonymous shared file, written by one thread.

    Attributes:
        fd: the file's descriptor, to send to the supervisor (:meth:`close_fd` after).
        written: records written so far.
        map: the mapping; ``pack(map, offset, *fields)`` writes a record at
            ``offset`` (:data:`RECORD`'s ``pack_into``). :meth:`write` is the way to
            write one; a writer that must save its call (the probe's step of a
            gap, on the training thread at every step) does what it does inline.
    """

    __slots__ = ("_codes", "capacity", "fd", "map", "pack", "written")

    def __init__(self, capacity: int = CAPACITY) -> None:
        fd = os.memfd_create("trainmedic-steps", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, ring_bytes(capacity))
            # Sealed at its size: the supervisor maps it, and a file that shrank
            # under a mapping would kill the reader with SIGBUS.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self.map = mmap.mmap(fd, ring_bytes(capacity))
        except BaseException:
            os.close(fd)
            raise
        HEADER.pack_into(self.map, 0, MAGIC, RECORD.size, capacity)
        self.fd: int | None = fd
        self.capacity = capacity
        self.written = 0
        self._codes: dict[str, int] = {}
        self.pack = RECORD.pack_into

    def close_fd(self) -> None:
        """Close the descriptor (the mapping stays): once the supervisor has its copy."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def code(self, name: str) -> int | None:
        """The index of ``name`` in the name table, added when new; ``None`` when the
        table is full or the name too long."""
        code = self._codes.get(name)
        if code is not None:
            return code
        raw = name.encode("utf-8", "surrogatepass")
        code = len(self._codes)
        if code >= NAME_SLOTS or len(raw) >= NAME_BYTES:
            return None
        at = _NAMES_AT + code * NAME_BYTES
        # The text before its length: a reader that sees the length sees the name.
        self.map[at + 1 : at + 1 + len(raw)] = raw
        self.map[at] = len(raw)
        self._codes[name] = code
        return code

    def write(
        self,
        step: int,
        t: float,
        duration_s: float,
        data_wait_s: float,
        compute_s: float,
        gpu_time_s: float,
        samples: int,
        alloc_peak: int,
        reserved_peak: int,
        retries: int,
        ooms: int,
        source: int,
        phase: int,
        autocast: int,
    ) -> None:
        """Write one record (NaN and :data:`NONE` for missing values; names as codes)."""
        seq = self.written + 1
        self.pack(
            self.map, RECORDS_AT + (self.written % self.capacity) * RECORD_BYTES, seq, step, t,
            duration_s, data_wait_s, compute_s, gpu_time_s, samples, alloc_peak,
            reserved_peak, retries, ooms, source, phase, autocast, seq,
        )  # fmt: skip
        self.written = seq


class RingError(ValueError):
    """The shared file is not a step ring this version can read."""


class RingReader:
    """The supervisor's end: reads the records a probe wrote, in order.

    Args:
        fd: the descriptor the probe sent; the reader maps it and closes it.
        pid / rank: whose steps these are.

    Raises:
        RingError: the file is too small, or its header is not a ring's.
    """

    def __init__(self, fd: int, pid: int, rank: int | None) -> None:
        try:
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK == 0:
                raise RingError("a step ring must be sealed against shrinking")
            size = os.fstat(fd).st_size
            if size < RECORDS_AT:
                raise RingError(f"a step ring of {size} bytes is too small")
            view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, record, capacity = HEADER.unpack_from(view, 0)
        if magic != MAGIC or record != RECORD.size or capacity < 1:
            view.close()
            raise RingError("not a step ring of this version")
        if ring_bytes(capacity) > size:
            view.close()
            raise RingError(f"a step ring of {size} bytes cannot hold {capacity} records")
        self._map = view
        self.capacity = capacity
        self.pid = pid
        self.rank = rank
        self.read = 0
        """Records taken (or lost) so far."""
        self.lost = 0
        """Records the writer overwrote before they were read."""
        self.malformed = 0
        """Records skipped for values no step can have."""
        self._names: dict[int, str] = {}

    def close(self) -> None:
        self._map.close()

    def _name(self, code: int) -> str | None:
        name = self._names.get(code)
        if name is None and 0 <= code < NAME_SLOTS:
            at = _NAMES_AT + code * NAME_BYTES
            length = self._map[at]
            if 0 < length < NAME_BYTES:
                name = self._map[at + 1 : at + 1 + length].decode("utf-8", "replace")
                self._names[code] = name
        return name

    def drain(self) -> list[StepRecord]:
        """The records written since the last call, oldest first."""
        from trainmedic.record.types import StepRecord

        view, capacity, unpack = self._map, self.capacity, RECORD.unpack_from
        out: list[StepRecord] = []
        while True:
            expected = self.read + 1
            at = RECORDS_AT + ((expected - 1) % capacity) * RECORD_BYTES
            values = unpack(view, at)
            seq = values[0]
            if seq != values[-1] or seq < expected:
                break  # being written, or not yet
            if seq > expected:
                # The writer went round the ring past us: the records up to a ring's
                # length before this one are gone; the later ones may still be there.
                self.lost += seq - capacity - expected + 1
                self.read = seq - capacity
                continue
            self.read = seq
            step = self._record(values, StepRecord)
            if step is None:
                self.malformed += 1
            else:
                out.append(step)
        return out

    def _record(self, values: tuple[Any, ...], cls: type[StepRecord]) -> StepRecord | None:
        (_, step, t, duration, wait, compute, gpu, samples, peak, reserved, retries, ooms,
         source_code, phase_code, autocast, _) = values  # fmt: skip
        source, phase = self._name(source_code), self._name(phase_code)
        if (
            source is None
            or phase is None
            or step < 0
            or not (math.isfinite(t) and math.isfinite(duration) and math.isfinite(wait))
            or duration < 0.0
            or wait < 0.0
            or not (math.isnan(compute) or 0.0 <= compute < math.inf)
            or not (math.isnan(gpu) or 0.0 <= gpu < math.inf)
        ):
            return None
        record = object.__new__(cls)
        # As the lines' decoder makes them (codec.decode_step_rows): the frozen
        # dataclass's __init__ would set each field through object.__setattr__.
        record.__dict__.update(
            step=step,
            t=t,
            duration_s=duration,
            data_wait_s=wait,
            compute_s=None if math.isnan(compute) else compute,
            gpu_time_s=None if math.isnan(gpu) else gpu,
            samples=None if samples < 0 else samples,
            source=source,
            phase=phase,
            pid=self.pid,
            rank=self.rank,
            alloc_peak_bytes=None if peak < 0 else peak,
            reserved_peak_bytes=None if reserved < 0 else reserved,
            alloc_retries=None if retries < 0 else retries,
            ooms=None if ooms < 0 else ooms,
            autocast=None if autocast < 0 else bool(autocast),
        )
        return record
