"""Finished steps written into the shared-memory ring, on the training thread.

Once the supervisor has taken the probe's ring (:mod:`trainmedic.channel.ring`),
each step the training thread ends is written there at once instead of
queued for the probe's thread: that thread then has nothing to do while the
job makes progress, and sleeps until the supervisor, the job's exit or a
message wakes it (:mod:`trainmedic.probe.agent`). The fields are the ones
:class:`~trainmedic.probe.steplines.StepLines` puts in a ``steps`` line.

A step the ring cannot hold (a source or phase name past its name table, a
value past a record's fields) goes to the outbox as before.
"""

from __future__ import annotations

import struct

from trainmedic.channel.ring import NONE, RECORD_BYTES, RECORDS_AT
from trainmedic.probe.segments import Segment, make_draft
from trainmedic.probe.steps import TRAIN, GapSteps

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections import deque
    from typing import Any

    from trainmedic.channel.ring import RingWriter
    from trainmedic.probe.segments import StepDraft
    from trainmedic.probe.steps import StepTracker

_NAN = float("nan")
GAP_SOURCE = "optimizer"
"""What ends a gap step (:class:`~trainmedic.probe.steps.GapSteps`)."""
GAP_PHASE = TRAIN


class RingSteps:
    """Writes each finished step into ``writer`` (one writing thread at a time).

    Also keeps running totals of the train steps' durations and data waits,
    which the stack sampler's :class:`~trainmedic.probe.sampling.StepStats`
    takes up (:meth:`take_totals`).

    Args:
        writer: the ring.
        wall_offset: Unix time minus the probe clock, seconds.
        overflow: where a step goes that the ring cannot name (the outbox).
    """

    __slots__ = ("_codes", "_gap_codes", "_taken", "overflow", "train_s", "train_steps", "wait_s",
                 "wall_offset", "writer")  # fmt: skip

    def __init__(self, writer: RingWriter, wall_offset: float, overflow: deque[Any]) -> None:
        self.writer = writer
        self.wall_offset = wall_offset
        self.overflow = overflow
        self._codes: dict[str, int] = {}
        source, phase = self._code(GAP_SOURCE), self._code(GAP_PHASE)
        self._gap_codes = None if source is None or phase is None else (source, phase)
        """The codes of a gap step's source and phase (``None``: the name table is full)."""
        self.train_s = 0.0
        """Summed duration of the train steps written, seconds."""
        self.wait_s = 0.0
        """Summed data wait of the train steps written, seconds."""
        self.train_steps = 0
        self._taken = (0.0, 0.0, 0)

    def __len__(self) -> int:
        """Never full: the ring overwrites what the supervisor did not read (as
        ``GapSteps.out`` it then always has room)."""
        return 0

    def append(self, draft: StepDraft) -> None:
        """A step without CUDA timing or allocator reading (the outbox's form)."""
        self.add(draft, None, None)

    def add(self, draft: StepDraft, timing: Any, alloc: Any) -> None:
        """Write one finished step (with its CUDA timing and allocator reading, if any)."""
        codes = self._codes
        source = codes.get(draft.source)
        phase = codes.get(draft.phase)
        if source is None or phase is None:
            source, phase = self._code(draft.source), self._code(draft.phase)
            if source is None or phase is None:
                self.overflow.append((draft, timing, alloc))
                return
        _, duration, outside, data_wait, compute = draft.times()
        gpu_time = _NAN
        if timing is not None:
            if timing.gpu_time_s is not None:
                gpu_time = timing.gpu_time_s
            idle = timing.idle_before_s
            if draft.loader_fetches == 0 and compute is not None and idle is not None:
                # The GPU's idle gap before the step, not host time spent in a sync.
                data_wait = min(outside, idle)
        samples = draft.samples
        autocast = draft.autocast
        if alloc is None:
            peak = reserved = retries = ooms = NONE
        else:
            peak, reserved, retries, ooms = (
                _count(alloc.alloc_peak_bytes), _count(alloc.reserved_peak_bytes),
                _count(alloc.alloc_retries), _count(alloc.ooms),
            )  # fmt: skip
        try:
            self.writer.write(
                draft.step, draft.t_end + self.wall_offset, duration, data_wait,
                _NAN if compute is None else compute, gpu_time,
                NONE if samples is None else samples, peak, reserved, retries, ooms,
                source, phase, NONE if autocast is None else int(autocast),
            )  # fmt: skip
        except (struct.error, TypeError, ValueError, OverflowError):
            # A value the record cannot hold (a count past 2**63, a float where a
            # count goes): the step goes as a line, which holds anything JSON does.
            self.overflow.append((draft, timing, alloc))
            return
        if draft.phase == "train":
            self.train_s += duration
            self.wait_s += data_wait
            self.train_steps += 1

    def gap(self, lead: object, left: int, last_end: float, long_s: float, out: Any) -> GapSteps:
        """What closes the gap steps :meth:`StepTracker.arm_gap
        <trainmedic.probe.steps.StepTracker.arm_gap>` arms (its ``make``): a
        :class:`RingGap` writing into this ring, or while the name table cannot
        name a gap step, a :class:`~trainmedic.probe.steps.GapSteps` handing this
        ring their drafts (``out``)."""
        if self._gap_codes is None:
            return GapSteps(lead, left, last_end, long_s, out)
        return RingGap(lead, left, last_end, long_s, out, self)

    def _code(self, name: str) -> int | None:
        code = self.writer.code(name)
        if code is not None:
            self._codes[name] = code
        return code

    def take_totals(self) -> tuple[float, float, int]:
        """(duration s, data wait s, train steps) added since the last call (one caller)."""
        now = (self.train_s, self.wait_s, self.train_steps)
        last, self._taken = self._taken, now
        return now[0] - last[0], now[1] - last[1], now[2] - last[2]


class RingGap(GapSteps):
    """Closes gap steps straight into a :class:`RingSteps`' ring, from their segments.

    What a gap step always is (:meth:`StepTracker.arm_gap
    <trainmedic.probe.steps.StepTracker.arm_gap>`): a train step ended by the
    lead optimizer, without the compute hooks (partial: no compute time), that
    fetched at least one batch (its data wait is the loader wait), with no CUDA
    timing or allocator reading and no forward call seen (no autocast state, no
    forward batch size). :meth:`close` writes the record :meth:`RingSteps.add`
    writes for such a step's draft, without making one, and the segment, whose
    loader fields alone moved, starts the next step in place of a new one: on
    sub-millisecond steps each object and call fewer on the training thread is
    memory the step's kernels find in their caches (docs/performance.md).
    What it needs of the ring (the writer, its mapping and packer, the codes,
    the clock offset) is held here, read once when armed.
    """

    __slots__ = ("capacity", "map", "pack", "phase", "source", "steps", "wall_offset", "writer")

    def __init__(
        self, lead: object, left: int, last_end: float, long_s: float, out: Any, steps: RingSteps
    ) -> None:
        super().__init__(lead, left, last_end, long_s, out)
        assert steps._gap_codes is not None  # RingSteps.gap() tells
        self.source, self.phase = steps._gap_codes
        self.steps = steps
        writer = self.writer = steps.writer
        self.map = writer.map
        self.pack = writer.pack
        self.capacity = writer.capacity
        self.wall_offset = steps.wall_offset

    def close(self, tracker: StepTracker, now: float, optimizer: object) -> bool:
        # GapSteps.close's tests and counts, then RingSteps.add's record for the
        # step's draft (StepDraft.times() for such a segment, RingWriter.write's
        # record between its two seq stamps), written out: the hook's one call.
        seg = tracker.segment
        left = self.left
        t_start = seg.t_start
        if not left or not seg.fetches or optimizer != self.lead or t_start is None:
            return False
        if now - self.last_end >= self.long_s:
            return False
        self.left = left - 1
        self.last_end = now
        tracker.wants_batch = True
        by_phase = tracker.steps_by_phase
        number = by_phase[TRAIN] + 1
        by_phase[TRAIN] = number
        duration = now - t_start - seg.excluded
        if duration < 0.0:
            duration = 0.0
        wait = seg.loader_wait
        if wait > duration:
            wait = duration
        samples = seg.loader_samples
        writer = self.writer
        written = writer.written
        seq = written + 1
        try:
            self.pack(
                self.map, RECORDS_AT + (written % self.capacity) * RECORD_BYTES, seq, number,
                now + self.wall_offset, duration, wait, _NAN, _NAN,
                NONE if samples is None else samples, NONE, NONE, NONE, NONE,
                self.source, self.phase, NONE, seq,
            )  # fmt: skip
        except (struct.error, TypeError, ValueError, OverflowError):
            # A value the record cannot hold: the step goes as a line (RingSteps.add).
            self.steps.overflow.append((_gap_draft(number, now, seg), None, None))
            tracker.segment = new = Segment()
            new.t_start = now
            new.partial = True
            return True
        writer.written = seq
        steps = self.steps
        steps.train_s += duration
        steps.wait_s += wait
        steps.train_steps += 1
        # The next step's segment: this one as Segment() would begin it. Inside a gap
        # only the loader's fields move (any other event disarms it), and it
        # began as the fresh, partial segment the general close left.
        seg.t_start = now
        seg.loader_wait = 0.0
        seg.fetches = 0
        seg.loader_samples = None
        return True


def _gap_draft(step: int, t_end: float, seg: Segment) -> StepDraft:
    return make_draft((step, GAP_PHASE, GAP_SOURCE, t_end, seg))


def _count(value: int | None) -> int:
    return NONE if value is None else value
