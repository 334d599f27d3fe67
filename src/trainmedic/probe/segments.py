"""A step's accumulators on the training thread, and the draft made from them.

:class:`Segment` collects what happens from one step boundary to the next;
when the step ends, :class:`StepDraft` keeps the segment as it is and works
the step's times out only when they are read - by the probe's thread, when it
builds the record - so that a step's end costs the training thread little.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple


class StepDraft(NamedTuple):
    """A finished step as the host saw it; the probe turns it into a ``StepRecord``.

    Made on the training thread at every step's end, so it is a tuple (made
    in C, with no Python call: :data:`make_draft`) that keeps the step's raw
    accumulators and works its times out only when they are read (by the
    probe's thread, when it builds the record). Times are on the tracker's
    monotonic clock, in seconds.

    Attributes:
        step: the step's number in its phase, from 1.
        phase: ``train``, ``eval`` or the name given to ``trainmedic.phase``.
        source: what ended it: ``optimizer``, ``backward`` or ``api``.
        t_end: when it ended.
        segment: its accumulators (never changed once the step ended).
        loader_wait_s: time blocked in DataLoader ``__next__``.
        loader_fetches: batches fetched from DataLoaders in the step.
        outside_s: host time in neither compute nor a loader wait.
        data_wait_s: the step's data wait as the host measured it (see module doc).
        compute_s: ``None`` when no forward, backward or optimizer step was seen, or
            when the compute hooks were off for part of the step (``Segment.partial``).
        samples: the step's batch size, when known.
        autocast: whether autocast was on in the step's first forward call.
        start_marker: what the listener returned when the step's first compute began.
    """

    step: int
    phase: str
    source: str
    t_end: float
    segment: Segment

    def __repr__(self) -> str:
        return (
            f"StepDraft(step={self.step}, phase={self.phase!r}, source={self.source!r}, "
            f"duration_s={self.duration_s!r}, data_wait_s={self.data_wait_s!r}, "
            f"compute_s={self.compute_s!r}, samples={self.samples!r})"
        )

    def times(self) -> tuple[float, float, float, float, float | None]:
        """(t_start, duration_s, outside_s, data_wait_s, compute_s), worked out once.

        Kept on the segment: a segment ends in one step only."""
        seg = self.segment
        values = seg.times
        if values is None:
            # Conditionals, not min()/max(): the probe's thread runs this for every step.
            t_end = self.t_end
            t_start = seg.t_start
            if t_start is None:
                t_start = t_end
            duration = t_end - t_start - seg.excluded
            if duration < 0.0:
                duration = 0.0
            loader_wait = seg.loader_wait
            compute: float | None = None
            if seg.compute_seen and not seg.partial:
                compute = seg.compute if seg.compute > 0.0 else 0.0
                outside = duration - compute - loader_wait
            else:
                outside = duration - loader_wait
            if outside < 0.0:
                outside = 0.0
            if seg.fetches or loader_wait > 0.0:
                data_wait = loader_wait
            elif compute is not None:
                data_wait = outside
            else:
                data_wait = 0.0  # no compute seen (explicit API without torch): unknown
            if data_wait > duration:
                data_wait = duration
            values = (t_start, duration, outside, data_wait, compute)
            seg.times = values
        return values

    @property
    def t_start(self) -> float:
        return self.times()[0]

    @property
    def duration_s(self) -> float:
        return self.times()[1]

    @property
    def outside_s(self) -> float:
        return self.times()[2]

    @property
    def data_wait_s(self) -> float:
        return self.times()[3]

    @property
    def compute_s(self) -> float | None:
        return self.times()[4]

    @property
    def loader_wait_s(self) -> float:
        return self.segment.loader_wait

    @property
    def loader_fetches(self) -> int:
        return self.segment.fetches

    @property
    def samples(self) -> int | None:
        seg = self.segment
        if seg.fetches and seg.loader_samples is not None:
            return seg.loader_samples
        if seg.forward_samples is not None:
            return seg.forward_samples
        return seg.optimizer_forward_samples

    @property
    def autocast(self) -> bool | None:
        return self.segment.autocast

    @property
    def start_marker(self) -> object | None:
        return self.segment.start_marker


make_draft = functools.partial(tuple.__new__, StepDraft)
"""``make_draft((step, phase, source, t_end, segment))``: a :class:`StepDraft` made in C.

The class's own constructor is a Python function, a call frame more at
every step's end on the training thread."""


@dataclass(slots=True)
class Mark:
    """The state of a segment when its last gradient-free forward call ended."""

    t: float
    loader_wait: float
    fetches: int
    loader_samples: int | None
    compute: float
    compute_seen: bool


class Segment:
    """Accumulators from one boundary to the next (or to a held backward end).

    One is made per step, on the training thread: the defaults are class
    attributes and there is no ``__init__`` (a Python call), so making one is
    ``Segment()`` and a store of ``t_start``.
    """

    t_start: float | None = None
    excluded: float = 0.0
    loader_wait: float = 0.0
    fetches: int = 0
    loader_samples: int | None = None
    compute: float = 0.0
    compute_seen: bool = False
    """Whether a compute region began in the segment (the CUDA marker was taken then)."""
    partial: bool = False
    """Whether the compute hooks were off for some of the segment (:mod:`trainmedic.probe.detail`):
    its loader wait and length are known, its compute time is not."""
    forward_samples: int | None = None
    optimizer_forward_samples: int | None = None
    autocast: bool | None = None
    nograd_forwards: int = 0
    mark: Mark | None = None
    start_marker: object | None = None
    times: tuple[float, float, float, float, float | None] | None = None
    """The draft's times, once worked out (:meth:`StepDraft.times`)."""

    @classmethod
    def of(cls, t_start: float | None = None, **values: Any) -> Segment:
        """A segment with the accumulators in ``values`` set (splits, tests)."""
        seg = cls()
        if t_start is not None:
            seg.t_start = t_start
        for name, value in values.items():
            setattr(seg, name, value)
        return seg

    def begin(self, t: float) -> None:
        if self.t_start is None:
            self.t_start = t


def _add(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def merge(segments: list[Segment]) -> Segment:
    """One segment standing for ``segments`` in order (a step of several backward calls)."""
    out = Segment()
    for s in segments:
        if out.t_start is None:
            out.t_start = s.t_start
        out.excluded += s.excluded
        out.loader_wait += s.loader_wait
        out.fetches += s.fetches
        out.loader_samples = _add(out.loader_samples, s.loader_samples)
        out.compute += s.compute
        out.compute_seen = out.compute_seen or s.compute_seen
        out.partial = out.partial or s.partial
        # Each backward segment of gradient accumulation is one micro-batch.
        out.forward_samples = _add(out.forward_samples, s.forward_samples)
        if out.optimizer_forward_samples is None:
            out.optimizer_forward_samples = s.optimizer_forward_samples
        if s.autocast is not None:
            out.autocast = bool(out.autocast) or s.autocast
        out.nograd_forwards += s.nograd_forwards
        if out.start_marker is None:
            out.start_marker = s.start_marker
    return out
