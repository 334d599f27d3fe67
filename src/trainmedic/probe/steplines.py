"""Finished steps written as ``steps`` lines: the probe's thread's work for every step.

The probe's thread turns each step the training thread queued (a
:class:`~trainmedic.probe.segments.StepDraft`, with its CUDA timing and
allocator reading when there are any) into one row of a ``steps`` line
(:func:`trainmedic.channel.wire.encode_steps`). It does this for every step
of the job, and while it runs Python it holds the interpreter lock the
training thread needs, so a row is kept cheap:

- times go out as integer nanoseconds, ``t`` counted from the line's first
  step: JSON writes an integer about four times faster than a float's
  shortest form;
- a step with no GPU timing and no allocator reading (a CPU job) leaves out
  the five columns it would fill with nulls
  (:data:`~trainmedic.channel.wire.HOST_STEP_COLUMNS`);
- a line holds at most :data:`LINE_ROWS` rows, and the caller lets the
  training thread have the lock after each line.

Measured on a 0.7 ms CPU step (``benchmarks/flush_cost.py``): 1.4 µs of the
probe thread's CPU and 65 bytes per step, against 2.4 µs and 117 bytes for
float rows of every column.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from typing import Any

    from trainmedic.probe.segments import StepDraft

LINE_ROWS = 256
"""Rows per ``steps`` line at most: about 0.2 ms of the probe thread's work."""


class StepLines:
    """The ``steps`` lines of one send, built a step at a time.

    Also sums the train steps' durations and data waits for the stack
    sampler's :class:`~trainmedic.probe.sampling.StepStats`.

    Args:
        pid: the process the steps are from.
        rank: its distributed rank, when set.
        wall_offset: Unix time minus the probe clock, seconds.
        out: receives each finished line (bytes), in order with the caller's others.
    """

    __slots__ = (
        "_base",
        "_host",
        "_out",
        "_rows",
        "pid",
        "rank",
        "train_s",
        "train_steps",
        "wait_s",
        "wall_offset",
    )

    def __init__(self, pid: int, rank: int | None, wall_offset: float, out: list[bytes]) -> None:
        self.pid = pid
        self.rank = rank
        self.wall_offset = wall_offset
        self._out = out
        self._rows: list[list[Any]] = []
        self._host = True
        self._base = 0.0
        self.train_s = 0.0
        """Summed duration of the train steps added, seconds."""
        self.wait_s = 0.0
        """Summed data wait of the train steps added, seconds."""
        self.train_steps = 0

    def add(self, draft: StepDraft, timing: Any, alloc: Any) -> bool:
        """Add a step; ``True`` when that finished a line (the caller may yield then)."""
        _, duration, outside, data_wait, compute = draft.times()
        host = timing is None and alloc is None
        rows = self._rows
        if rows and host is not self._host:
            self.close()
            rows = self._rows
        t_end = draft.t_end
        if not rows:
            self._host = host
            self._base = t_end
        gpu_time: float | None = None
        if timing is not None:
            gpu_time = timing.gpu_time_s
            idle = timing.idle_before_s
            if draft.loader_fetches == 0 and compute is not None and idle is not None:
                # The GPU's idle gap before the step, not host time spent in a sync.
                data_wait = min(outside, idle)
        step = draft.step
        t_ns = int((t_end - self._base) * 1e9)
        duration_ns = int(duration * 1e9)
        wait_ns = int(data_wait * 1e9)
        compute_ns = None if compute is None else int(compute * 1e9)
        if host:
            rows.append([
                step, t_ns, duration_ns, wait_ns, compute_ns,
                draft.samples, draft.source, draft.phase, draft.autocast,
            ])  # fmt: skip
        else:
            rows.append([
                step, t_ns, duration_ns, wait_ns, compute_ns,
                None if gpu_time is None else int(gpu_time * 1e9), draft.samples, draft.source,
                draft.phase,
                *((None, None, None, None) if alloc is None else (
                    alloc.alloc_peak_bytes, alloc.reserved_peak_bytes, alloc.alloc_retries,
                    alloc.ooms,
                )),
                draft.autocast,
            ])  # fmt: skip
        if draft.phase == "train":
            self.train_s += duration
            self.wait_s += data_wait
            self.train_steps += 1
        if len(rows) < LINE_ROWS:
            return False
        self.close()
        return True

    def close(self) -> None:
        """Write the rows added since the last line, if any, as a line."""
        rows = self._rows
        if not rows:
            return
        from trainmedic.channel.wire import HOST_STEP_COLUMNS, STEP_COLUMNS, encode_steps

        self._rows = []
        cols = HOST_STEP_COLUMNS if self._host else STEP_COLUMNS
        self._out.append(
            encode_steps(self.pid, self.rank, rows, cols, self._base + self.wall_offset)
        )
