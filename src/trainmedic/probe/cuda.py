"""GPU time per step from CUDA events, read without adding synchronisation.

When the job has initialised CUDA (the probe never does), an event is
recorded when a step's first compute begins and another when the step ends,
on the current stream of the device the step's tensors live on (the
optimizer's parameters tell it: a job on ``cuda:1`` without ``set_device``
would otherwise be timed on device 0's idle stream). The step's record
waits in a queue until ``event.query()`` says its end event has completed
on the GPU - checked at later step ends, never waited for - so the GPU is
never stalled for us.

While a CUDA graph is being captured (``torch.cuda.graph``, also around
``optimizer.step()``), nothing CUDA-side happens: recording or querying an
event then would invalidate the job's capture.

From the two events: ``gpu_time_s`` is the GPU time from the step's first
compute to its end. For a step that fetched no DataLoader batch, the time
from the previous step's end event to this step's start event is how long
the GPU sat idle waiting for the host to prepare the next batch; the step's
``data_wait_s`` becomes the smaller of that and the host time outside
compute (a sync such as ``loss.item()`` keeps the host waiting while the GPU
is busy, and must not count as waiting for data).

Allocator statistics (peak allocated/reserved, ``num_alloc_retries``,
``num_ooms``) come from ``torch.cuda.memory_stats(device)`` of the same
device (without one, ``memory_stats()`` would read the current device: 0 for
a job on ``cuda:1`` without ``set_device``), on at most a share
:data:`ALLOC_BUDGET` of the time, measured from the cost of a reading. The
peaks are the process's running peaks: resetting them would change what the
job itself reads from ``torch.cuda.max_memory_allocated()``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainmedic.probe.parts import Part
from trainmedic.probe.steps import StepDraft

MAX_PENDING = 64
"""Steps waiting for their events beyond which the oldest goes without GPU time."""
ALLOC_BUDGET = 0.002
"""Share of wall time that reading allocator statistics may take."""


@dataclass(frozen=True)
class AllocStats:
    """One reading of the CUDA caching allocator (bytes, counts)."""

    alloc_peak_bytes: int | None
    reserved_peak_bytes: int | None
    alloc_retries: int | None
    ooms: int | None


@dataclass(frozen=True)
class GpuTiming:
    """What a step's CUDA events measured, seconds (``None`` when unknown)."""

    gpu_time_s: float | None
    idle_before_s: float | None


@dataclass
class _Pending:
    draft: StepDraft
    start: Any
    end: Any
    prev_end: Any
    alloc: AllocStats | None
    queued_at: float


MakeRecord = Callable[[StepDraft, "GpuTiming | None", "AllocStats | None"], None]


class CudaSteps:
    """Records CUDA events at step starts and ends and finishes steps when they complete.

    Args:
        torch: the torch module the job imported.
        part: the ``cuda`` probe part (an error disables GPU timing only).
        finish: turns a draft plus GPU readings into a record and sends it.
        on_ready: called once, when the job is first seen with CUDA initialised.
    """

    def __init__(
        self,
        torch: Any,
        part: Part,
        finish: MakeRecord,
        on_ready: Callable[[], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._torch = torch
        self._cuda = torch.cuda
        self._part = part
        self._finish = finish
        self._on_ready = on_ready
        self._clock = clock
        self._ready = False
        self._pending: deque[_Pending] = deque()
        self._prev_end: Any = None
        self._alloc_next = 0.0
        self._device: Any = None
        self.captures = 0
        """Graph captures in progress that :mod:`trainmedic.probe.graphs` saw begin."""

    def use_device(self, device: Any) -> None:
        """Time steps on ``device`` (a CUDA ``torch.device``) and read its allocator from now on."""
        self._device = device

    def capturing(self) -> bool:
        """A CUDA graph capture is in progress: no CUDA call may be made now."""
        return self.captures > 0 or bool(self._cuda.is_current_stream_capturing())

    def reset(self) -> None:
        """Forget the parent's events (in a forked child, where CUDA is unusable)."""
        self._pending = deque()
        self._prev_end = None
        self._ready = False
        self._alloc_next = 0.0

    def active(self) -> bool:
        """Whether CUDA timing applies now (the job initialised CUDA, part on)."""
        if not self._part.on:
            return False
        if not self._ready:
            # Not during a capture either: on_ready asks CUDA about the devices.
            if not self._cuda.is_initialized() or self.capturing():
                return False
            self._ready = True
            self._on_ready()
        return True

    def _record_event(self) -> object | None:
        if self.capturing():
            return None  # recording a timing event would break the graph capture
        event: Any = self._cuda.Event(enable_timing=True)
        if self._device is None:
            event.record()
        else:
            event.record(self._cuda.current_stream(self._device))
        recorded: object = event
        return recorded

    # --- the StepListener side --------------------------------------------------------------

    def segment_started(self) -> object | None:
        if not self.active():
            return None
        try:
            self._part.check()
            return self._record_event()
        except Exception as exc:
            self._fail(exc)
            return None

    # --- steps ----------------------------------------------------------------------------------

    def add(self, draft: StepDraft) -> None:
        """A step ended on the host: queue it until its events complete."""
        if not self.active():
            self._flush_pending()
            self._finish(draft, None, None)
            return
        try:
            capturing = self.capturing()
            end = None if capturing else self._record_event()
            alloc = None if capturing else self._maybe_alloc(draft.t_end)
            self._pending.append(
                _Pending(draft, draft.start_marker, end, self._prev_end, alloc, self._clock())
            )
            if end is not None:
                self._prev_end = end
            if not capturing:  # event queries are illegal during capture
                self.poll()
        except Exception as exc:
            self._fail(exc)
            if not any(p.draft is draft for p in self._pending):
                self._finish(draft, None, None)

    def poll(self) -> None:
        """Finish every queued step whose events have completed (oldest first)."""
        pending = self._pending
        while pending:
            head = pending[0]
            done = head.end is None or head.end.query()
            if not done and len(pending) <= MAX_PENDING:
                return
            pending.popleft()
            self._finish(head.draft, self._timing(head) if done else None, head.alloc)

    def flush(self) -> None:
        """Finish everything queued now (at exit): completed events give GPU time."""
        try:
            while self._pending:
                head = self._pending.popleft()
                done = head.end is None or bool(head.end.query())
                self._finish(head.draft, self._timing(head) if done else None, head.alloc)
        except Exception as exc:
            self._fail(exc)

    def _flush_pending(self) -> None:
        while self._pending:
            head = self._pending.popleft()
            self._finish(head.draft, None, head.alloc)

    def _fail(self, exc: BaseException) -> None:
        self._part.fail(exc)
        self._flush_pending()

    @staticmethod
    def _elapsed_s(a: Any, b: Any) -> float | None:
        if a is None or b is None:
            return None
        try:
            if not a.query() or not b.query():
                return None
            return max(0.0, float(a.elapsed_time(b)) / 1000.0)
        except RuntimeError:
            return None  # events on different devices, or never recorded

    def _timing(self, p: _Pending) -> GpuTiming:
        return GpuTiming(
            gpu_time_s=self._elapsed_s(p.start, p.end),
            idle_before_s=self._elapsed_s(p.prev_end, p.start),
        )

    # --- allocator ------------------------------------------------------------------------------

    def _maybe_alloc(self, now: float) -> AllocStats | None:
        if now < self._alloc_next:
            return None
        t0 = self._clock()
        device = self._device  # None until an optimizer told it: the current device
        stats = self._cuda.memory_stats() if device is None else self._cuda.memory_stats(device)
        cost = self._clock() - t0
        self._alloc_next = now + cost / ALLOC_BUDGET

        def get(key: str) -> int | None:
            value = stats.get(key)
            return None if value is None else int(value)

        return AllocStats(
            alloc_peak_bytes=get("allocated_bytes.all.peak"),
            reserved_peak_bytes=get("reserved_bytes.all.peak"),
            alloc_retries=get("num_alloc_retries"),
            ooms=get("num_ooms"),
        )
