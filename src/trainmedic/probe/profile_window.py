"""A short torch.profiler window in a live job: what the GPU did in a few steps, no code change.

The probe's step timings say how long each step took and how much of it was
the data wait; they cannot say why a GPU idles inside a step (a host
synchronisation, launches, pageable copies, the allocator). A Kineto trace
can (:mod:`trainmedic.traces.kineto`, :mod:`trainmedic.diagnose.trace_rules`),
so on a CUDA job the probe records one itself:

* after :data:`FIRST_STEP` training steps - past the warm-up of cuDNN's
  autotuning, ``torch.compile`` and the allocator's growth - it starts
  ``torch.profiler.profile`` at a step's end with the schedule
  ``wait=0, warmup=1, active=ACTIVE_STEPS``, CPU and CUDA activities and
  Python stacks (for the synchronisations' call sites);
* each later step end is a ``prof.step()``, so the trace has the
  ``ProfilerStep#N`` spans the reader cuts steps by; after the active steps
  (or at the first step end past :data:`MAX_WINDOW_S`) the profiler stops;
* a thread of its own writes the trace to
  ``RUN_DIR/profiles/pid<PID>[-rank<R>]-step<N>.json.gz`` (private
  permissions, written whole or not at all) and sends a ``profile_window``
  event with what the window cost the job;
* the next window comes no sooner than :data:`REPEAT_S` later, and later
  still when the last one cost more than :data:`MAX_COST_SHARE` of the time
  between them; at most :data:`MAX_WINDOWS` per process.

The supervisor reads the traces at the run's end and adds their findings to
the run's (:mod:`trainmedic.traces.windows`, :mod:`trainmedic.diagnose.trace_windows`).

What a window costs (docs/performance.md): the profiler's start and stop on
the training thread, and the profiled steps' extra time (the profiler's
callbacks on every operator, CUPTI's on every kernel); both are measured
against the steps before the window and reported in its event.

:data:`trainmedic.probe.env.PROFILE` chooses: ``auto`` (the default) profiles jobs that use CUDA;
``always`` profiles any torch job, CPU activities alone where CUDA is not
used (how the window is tested without a GPU); ``off`` never.
``TRAINMEDIC_PROBE_DISABLE=profiler`` is the same as ``off``. A job that runs
a profiler of its own is left alone: no window starts while one records (one
still in its schedule's wait or warm-up is not seen; a job that starts its
profiler inside one of the window's few steps gets torch's error).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import statistics
import threading
import time
from collections import deque

from trainmedic.record.events import EventKind
from trainmedic.record.layout import PROFILES_DIR

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from trainmedic.probe.parts import Part
    from trainmedic.probe.segments import StepDraft

FIRST_STEP = 30
"""Training steps before the first window: the steps of the warm-up are not the job's."""
WARMUP_STEPS = 1
"""Profiled steps not kept: the first pays for CUPTI's start."""
ACTIVE_STEPS = 5
"""Steps recorded in each window."""
MAX_WINDOW_S = 20.0
"""Seconds after which a window ends at the next step end (once one step was recorded)."""
REPEAT_S = 1800.0
"""Seconds from one window's end to the next one's start, at least."""
MAX_COST_SHARE = 0.01
"""A window's cost is at most this share of the time until the next: a costly one waits longer."""
MAX_WINDOWS = 8
"""Windows per process, at most."""
MAX_TOTAL_BYTES = 512 * 1024 * 1024
"""Trace bytes per process after which no window starts."""
RECHECK_STEPS = 50
"""Steps after a window was not due (no CUDA yet, a profiler of the job's) before asking again."""
BASELINE_STEPS = 16
"""Steps before a window whose median time is the unprofiled step time."""
GZIP_LEVEL = 1
"""zlib's fastest level: a window's trace compresses about 10x at it, twice as fast as at 6."""
CHUNK_BYTES = 1 << 20
"""Bytes compressed at a time (zlib releases the GIL on each)."""
EXPORT_JOIN_S = 10.0
"""Seconds the job's exit waits for a trace still being written."""
EVENT = EventKind.PROFILE_WINDOW


class ProfileWindow:
    """Opens, steps, closes and writes the profiler windows of one process.

    Args:
        torch: the torch module the job imported.
        part: the ``profiler`` probe part: any error switches windows off for good.
        run_dir: the run directory (the traces go to its :data:`PROFILES_DIR`).
        name: the trace's file name stem (``pid<PID>`` and the rank when known).
        uses_cuda: whether the job uses CUDA now (asked at each step end before a window).
        capturing: whether a CUDA graph capture is in progress (no window then).
        send_event: sends ``(kind, message, data)`` as a run event; any thread.
        mode: ``auto`` or ``always`` (see the module docstring).
        clock: seconds, monotonic, for the profiler's start and stop; the schedule runs on
            the step ends' times (``StepDraft.t_end``).
    """

    def __init__(
        self,
        torch: Any,
        part: Part,
        run_dir: str,
        name: str,
        uses_cuda: Callable[[], bool],
        capturing: Callable[[], bool],
        send_event: Callable[[EventKind, str, dict[str, Any]], None],
        mode: str = "auto",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._torch = torch
        self._part = part
        self._dir = os.path.join(run_dir, PROFILES_DIR)
        self._name = name
        self._uses_cuda = uses_cuda
        self._capturing = capturing
        self._send = send_event
        self._mode = mode
        self._clock = clock
        self.steps = 0
        """Training steps ended in this process."""
        self.windows = 0
        self.bytes = 0
        self._next_step = FIRST_STEP
        self._next_time = 0.0
        self._last_end: float | None = None
        self._recent: deque[float] = deque(maxlen=BASELINE_STEPS)
        self._prof: Any = None
        self._ready = False  # the profiler handed over its trace (on_trace_ready)
        self._first = 0  # the step after which the window opened
        self._opened = 0.0
        self._start_s = 0.0
        self._stop_s = 0.0
        self._calls = 0  # prof.step() calls in this window
        self._durations: list[float] = []
        self._cuda = False
        self._writer: threading.Thread | None = None

    @property
    def open(self) -> bool:
        """Whether a window is recording now."""
        return self._prof is not None

    def step_ended(self, draft: StepDraft) -> None:
        """At each step's end, on the training thread: open, step or close a window."""
        if draft.phase != "train":
            return
        if self._part.fault:
            self._part.check()
        now = draft.t_end
        last = self._last_end
        self._last_end = now
        self.steps += 1
        prof = self._prof
        if prof is None:
            if last is not None:
                self._recent.append(now - last)
            if self.steps >= self._next_step and now >= self._next_time:
                if self._due():
                    self._start(now)
                else:
                    self._next_step = self.steps + RECHECK_STEPS
            return
        if last is not None:
            self._durations.append(now - last)
        self._advance(prof, now)

    def _due(self) -> bool:
        if self.windows >= MAX_WINDOWS or self.bytes >= MAX_TOTAL_BYTES:
            return False
        cuda = self._uses_cuda()
        if self._mode == "auto" and not cuda:
            return False
        if cuda and self._capturing():
            return False
        # A profiler of the job's own: two cannot run at once, and the job's comes first.
        return not self._torch.autograd.profiler._is_profiler_enabled

    def _start(self, now: float) -> None:
        profiler = self._torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        cuda = self._uses_cuda()
        if cuda:
            activities.append(profiler.ProfilerActivity.CUDA)
        prof = profiler.profile(
            activities=activities,
            schedule=profiler.schedule(wait=0, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1),
            on_trace_ready=self._on_ready,
            record_shapes=False,
            # Memory events would add a quarter to the trace and the profiled steps'
            # time; the probe's allocator readings already cover the memory rules.
            profile_memory=False,
            with_stack=True,
        )
        t0 = self._clock()
        try:
            prof.start()
        except Exception:
            with contextlib.suppress(Exception):
                prof.stop()
            raise
        self._start_s = self._clock() - t0
        self._prof = prof
        self._ready = False
        self._cuda = cuda
        self._first = self.steps
        self._opened = now
        self._calls = 0
        self._durations = []

    def _advance(self, prof: Any, now: float) -> None:
        self._calls += 1
        recorded = self._calls > WARMUP_STEPS
        t0 = self._clock()
        if self._calls >= WARMUP_STEPS + ACTIVE_STEPS:
            prof.step()  # the schedule's end: the trace is stopped and handed over
            prof.stop()
        elif recorded and now - self._opened >= MAX_WINDOW_S:
            prof.stop()  # long steps: the ones recorded so far are enough
        else:
            prof.step()
            return
        self._stop_s = self._clock() - t0
        self._close(prof, now + self._stop_s)

    def _on_ready(self, prof: Any) -> None:
        self._ready = True

    def _close(self, prof: Any, now: float) -> None:
        self._prof = None
        self.windows += 1
        recorded = self._durations[WARMUP_STEPS:]
        before = statistics.median(self._recent) if self._recent else None
        extra = sum(self._durations) - before * len(self._durations) if before is not None else None
        cost = self._start_s + self._stop_s + max(extra or 0.0, 0.0)
        self._next_time = now + max(REPEAT_S, cost / MAX_COST_SHARE)
        self._next_step = self.steps + 1
        self._recent.clear()
        info: dict[str, Any] = {
            "first_step": self._first,
            "steps": len(recorded),
            "cuda": self._cuda,
            "start_s": round(self._start_s, 6),
            "stop_s": round(self._stop_s, 6),
            "step_s_before": round(before, 6) if before is not None else None,
            "step_s_profiled": round(statistics.median(recorded), 6) if recorded else None,
            "extra_s": round(extra, 6) if extra is not None else None,
            "cost_s": round(cost, 6),
            "next_in_s": round(self._next_time - now, 1),
        }
        if not self._ready or not recorded:
            self._event("no trace: the profiler recorded no step", info)
            return
        path = os.path.join(self._dir, f"{self._name}-step{self._first}.json.gz")
        self._writer = threading.Thread(
            target=self._write, args=(prof, path, info), name="trainmedic-profile", daemon=True
        )
        self._writer.start()

    def _write(self, prof: Any, path: str, info: dict[str, Any]) -> None:
        # Off the training thread. torch's own ".gz" export copies its JSON into gzip
        # line by line in Python, contending for the GIL with the training thread for
        # seconds (a 48 MB trace: 14 s, the job's steps 3x slower meanwhile); its plain
        # JSON export is one C++ call, and zlib compresses megabyte chunks without the
        # GIL (1.3 s, the steps unchanged: docs/performance.md).
        stem = os.path.join(self._dir, f".{os.path.basename(path)}.{os.getpid()}")
        raw, tmp = f"{stem}.json", f"{stem}.tmp.gz"
        t0 = self._clock()
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            prof.export_chrome_trace(raw)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with (
                open(raw, "rb") as src,
                os.fdopen(fd, "wb") as dst,
                gzip.GzipFile(fileobj=dst, mode="wb", compresslevel=GZIP_LEVEL) as out,
            ):
                shutil.copyfileobj(src, out, CHUNK_BYTES)
            os.replace(tmp, path)
            size = os.path.getsize(path)
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
            self._event("the trace could not be written", info)
            return
        finally:
            for leftover in (raw, tmp):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        self.bytes += size
        info.update(path=os.path.join(PROFILES_DIR, os.path.basename(path)), bytes=size,
                    write_s=round(self._clock() - t0, 3))  # fmt: skip
        self._event(f"{info['steps']} steps profiled after step {info['first_step']}", info)

    def _event(self, message: str, info: dict[str, Any]) -> None:
        try:
            self._send(EVENT, f"profiler window: {message}", info)
        except Exception as exc:
            self._part.fail(exc)

    def finish(self) -> None:
        """At the process's exit: close a window still open, wait for its trace to be written."""
        prof = self._prof
        if prof is not None:
            t0 = self._clock()
            prof.stop()
            self._stop_s = self._clock() - t0
            self._close(prof, (self._last_end or 0.0) + self._stop_s)
        writer = self._writer
        if writer is not None:
            writer.join(EXPORT_JOIN_S)

    def stop_quietly(self) -> None:
        """After an error of its own: a window left open would profile the job to its end."""
        prof, self._prof = self._prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.stop()

    def abandon(self) -> None:
        """In a forked child: the parent's profiler is not this process's to stop."""
        self._prof = None
        self._writer = None
        self.windows = MAX_WINDOWS
