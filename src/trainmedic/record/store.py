"""The run record on disk: the bounded writer.

:class:`RunRecordWriter` receives every measurement of a run from the
supervisor's threads and appends it to JSON-lines files in a private run
directory. It keeps the record bounded (a day at 100 steps/s stays far under
100 MB) while keeping every anomalous step exactly: the first steps of each
process and every step that stands out against a running median are written
as they are; ordinary steps are folded into :class:`StepWindow` aggregates.
:func:`load_run_record` (:mod:`trainmedic.record.reader`, importable from here
too) reads a directory back into a :class:`RunRecord`.
The layout, every key and the bounding rule are in docs/run-record.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmedic.atomicfile import atomic_writer
from trainmedic.errors import RunDirectoryError
from trainmedic.gpu.types import GpuSample
from trainmedic.record import codec
from trainmedic.record.guard import RecordGuard
from trainmedic.record.layout import (
    CAPPED_EVENT,
    EVENTS_FILE,
    GPU_FILE,
    HOST_FILE,
    LINE_FILES,
    LOADER_ACTIVITY_FILE,
    LOADERS_FILE,
    META_FILE,
    STEPS_FILE,
    WINDOWS_FILE,
)
from trainmedic.record.reader import load_run_record
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunEvent,
    RunMeta,
    StepRecord,
    StepWindow,
)

__all__ = [
    "CAPPED_EVENT",
    "EVENTS_FILE",
    "GPU_FILE",
    "HOST_FILE",
    "LINE_FILES",
    "LOADERS_FILE",
    "LOADER_ACTIVITY_FILE",
    "META_FILE",
    "STEPS_FILE",
    "WINDOWS_FILE",
    "RecordCounts",
    "RetentionPolicy",
    "RunRecordWriter",
    "load_run_record",
]

_DIR_MODE = 0o700
_FILE_MODE = 0o600
_BUFFER_BYTES = 64 * 1024


@dataclass(frozen=True)
class RetentionPolicy:
    """How the writer bounds a run record (docs/run-record.md, "Bounding").

    Kept exactly: each process's head, every step outside the ``train`` phase
    or at a phase change, every step where ``alloc_retries`` or ``ooms`` grew,
    and every step that stands out against the running medians below.

    Attributes:
        head_steps: steps of each process (pid) kept exactly from its start.
        window_max_steps / window_max_s: an open window of ordinary steps is
            closed when it holds this many steps or spans this many seconds.
        baseline_steps: recent steps per (pid, phase) the running medians use.
        baseline_refresh_steps: medians are recomputed every this many steps
            (amortises the sort; a median moves slowly anyway).
        min_baseline_steps: below this many baseline steps every step of that
            (pid, phase) is kept (no baseline to compare against yet).
        slow_factor: a step whose duration (or GPU time) exceeds this multiple of
            the running median is anomalous.
        data_wait_factor / data_wait_min_share: a step whose data wait exceeds
            both ``data_wait_factor`` × the median data wait and the median data
            wait + ``data_wait_min_share`` × the median step is anomalous.
        max_exact_steps: cap on steps kept exactly over the whole run (head and
            anomalies); beyond it anomalies are folded and counted as dropped.
        full_rate_s: GPU and host samples are kept at full rate for this long
            from the first sample of each stream, seconds.
        decimated_interval_s: after that, at most one sample per stream per this
            many seconds, except GPU samples whose discrete state changed
            (clock event reasons, ECC, remapped rows, PCIe link, processes).
        max_forced_gpu_samples: cap per GPU on samples kept for a state change
            while decimating (a clock reason flapping every second stays bounded).
        max_events / max_loaders / max_loader_activity: caps on those records.
        max_event_bytes / max_loader_activity_bytes: caps on the bytes of those
            files (tracebacks and stack frames can be long).
        max_event_text_chars: longer strings in an event's message or data are
            cut to their first and last characters around a ``…`` marker.
    """

    head_steps: int = 2000
    window_max_steps: int = 1000
    window_max_s: float = 10.0
    baseline_steps: int = 256
    baseline_refresh_steps: int = 64
    min_baseline_steps: int = 16
    slow_factor: float = 3.0
    data_wait_factor: float = 3.0
    data_wait_min_share: float = 0.5
    max_exact_steps: int = 200_000
    full_rate_s: float = 3600.0
    decimated_interval_s: float = 5.0
    max_forced_gpu_samples: int = 2_000
    max_events: int = 10_000
    max_event_bytes: int = 8 * 1024 * 1024
    max_event_text_chars: int = 4096
    max_loaders: int = 1_000
    max_loader_activity: int = 10_000
    max_loader_activity_bytes: int = 8 * 1024 * 1024


@dataclass
class RecordCounts:
    """What the writer has seen, kept and dropped so far (all counts)."""

    steps_seen: int = 0
    steps_exact: int = 0
    steps_windowed: int = 0
    windows: int = 0
    anomalies_dropped: int = 0
    gpu_seen: int = 0
    gpu_kept: int = 0
    host_seen: int = 0
    host_kept: int = 0
    events_dropped: int = 0
    loaders_dropped: int = 0
    loader_activity_dropped: int = 0


class _Baseline:
    """Running medians of one (pid, phase): duration, data wait, GPU time."""

    def __init__(self, size: int) -> None:
        self.durations: deque[float] = deque(maxlen=size)
        self.waits: deque[float] = deque(maxlen=size)
        self.gpu_times: deque[float] = deque(maxlen=size)
        self.since_refresh = 0
        self.duration = 0.0
        self.wait = 0.0
        self.gpu_time: float | None = None

    def add(self, step: StepRecord, refresh_every: int) -> None:
        self.durations.append(step.duration_s)
        self.waits.append(step.data_wait_s)
        if step.gpu_time_s is not None:
            self.gpu_times.append(step.gpu_time_s)
        self.since_refresh += 1
        if self.since_refresh >= refresh_every or len(self.durations) <= refresh_every:
            self.since_refresh = 0
            self.duration = statistics.median(self.durations)
            self.wait = statistics.median(self.waits)
            self.gpu_time = statistics.median(self.gpu_times) if self.gpu_times else None


class _WindowBuilder:
    """Sums of the ordinary steps of one process since its window opened."""

    def __init__(self, step: StepRecord) -> None:
        self.pid = step.pid
        self.phase = step.phase
        self.t_start = step.t - step.duration_s
        self.t = step.t
        self.count = 0
        self.first_step = step.step
        self.last_step = step.step
        self.duration_sum = 0.0
        self.duration_min = step.duration_s
        self.duration_max = step.duration_s
        self.wait_sum = 0.0
        self.compute_sum: float | None = None
        self.gpu_sum: float | None = None
        self.samples_sum: int | None = None

    def add(self, step: StepRecord) -> None:
        self.count += 1
        self.t = max(self.t, step.t)
        self.first_step = min(self.first_step, step.step)
        self.last_step = max(self.last_step, step.step)
        self.duration_sum += step.duration_s
        self.duration_min = min(self.duration_min, step.duration_s)
        self.duration_max = max(self.duration_max, step.duration_s)
        self.wait_sum += step.data_wait_s
        # Sums over the steps that had the value: GPU time in particular
        # arrives late and is missing on some steps.
        if step.compute_s is not None:
            self.compute_sum = (self.compute_sum or 0.0) + step.compute_s
        if step.gpu_time_s is not None:
            self.gpu_sum = (self.gpu_sum or 0.0) + step.gpu_time_s
        if step.samples is not None:
            self.samples_sum = (self.samples_sum or 0) + step.samples

    def build(self) -> StepWindow:
        return StepWindow(
            t_start=self.t_start,
            t=self.t,
            count=self.count,
            first_step=self.first_step,
            last_step=self.last_step,
            duration_sum_s=self.duration_sum,
            duration_min_s=self.duration_min,
            duration_max_s=self.duration_max,
            data_wait_sum_s=self.wait_sum,
            compute_sum_s=self.compute_sum,
            gpu_time_sum_s=self.gpu_sum,
            samples_sum=self.samples_sum,
            pid=self.pid,
            phase=self.phase,
        )


class _ProcessSteps:
    """Per-process state: how many steps seen, baselines, the open window."""

    def __init__(self) -> None:
        self.seen = 0
        self.phase: str | None = None
        self.alloc_retries: int | None = None
        self.ooms: int | None = None
        self.baselines: dict[str, _Baseline] = {}
        self.window: _WindowBuilder | None = None


class _Decimator:
    """Full rate for ``full_rate_s``, then one sample per ``interval_s``."""

    def __init__(self, full_rate_s: float, interval_s: float, max_forced: int = 0) -> None:
        self._full_rate_s = full_rate_s
        self._interval_s = interval_s
        self._forced_left = max_forced
        self._first: float | None = None
        self._last_kept = 0.0

    def keep(self, t: float, forced: bool = False) -> bool:
        """Whether to keep a sample taken at ``t``; ``forced`` asks to keep it anyway."""
        if self._first is None:
            self._first = t
        # A sampler's period jitters; 1 % slack keeps "every 5 s" from
        # becoming "every 6 s" when a reading comes a little early.
        if t - self._first < self._full_rate_s or t - self._last_kept >= self._interval_s * 0.99:
            self._last_kept = t
            return True
        if forced and self._forced_left > 0:
            self._forced_left -= 1
            self._last_kept = t
            return True
        return False


def _discrete_state(s: GpuSample) -> tuple[Any, ...]:
    """The GPU state whose every change is kept, even when decimating."""
    return (
        s.clock_event_reasons,
        s.ecc,
        s.remapped_rows,
        s.retired_pages_pending,
        s.pcie.gen_current,
        s.pcie.width_current,
        tuple(p.pid for p in s.processes),
        s.persistence_mode,
    )


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def _open_private(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, _FILE_MODE)
    try:
        # O_CREAT's mode is only used for new files; an existing one is tightened.
        os.fchmod(fd, _FILE_MODE)
        _drop_partial_line(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _LineFile:
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


def _drop_partial_line(fd: int) -> None:
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


class RunRecordWriter:
    """Writes one run's record into ``run_dir``; safe to call from several threads.

    ``run_dir`` is created with mode 0700 (and its missing parents) when it
    does not exist; every file is created with mode 0600. Appends are buffered:
    call :meth:`flush` to push them to the files (the live view and a crash
    lose at most what was not flushed) and :meth:`close` at the end. Records
    added after :meth:`close` are ignored, so a sampler thread finishing late
    cannot break the shutdown. :meth:`write_meta` works at any time.

    Appends never raise for the run directory: every line goes through
    ``guard`` (:class:`~trainmedic.record.guard.RecordGuard`), whose first
    failed write (a full disk) stops the recording and counts what is lost.
    """

    def __init__(
        self,
        run_dir: Path,
        retention: RetentionPolicy | None = None,
        guard: RecordGuard | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.retention = retention or RetentionPolicy()
        self.counts = RecordCounts()
        self.guard = guard or RecordGuard()
        if not self.run_dir.exists():
            self.run_dir.mkdir(mode=_DIR_MODE, parents=True)
            # mkdir's mode is filtered by the umask; make it exactly 0700.
            os.chmod(self.run_dir, _DIR_MODE)
        elif not self.run_dir.is_dir():
            raise RunDirectoryError(f"run directory {self.run_dir} exists and is not a directory")
        self._lock = threading.RLock()
        self._closed = False
        self._files: dict[str, _LineFile] = {}
        try:
            for name in LINE_FILES:
                self._files[name] = _LineFile(_open_private(self.run_dir / name), name, self.guard)
        except OSError as exc:
            self._close_files()
            raise RunDirectoryError(
                f"cannot write run directory {self.run_dir}: {exc.strerror or exc}"
            ) from exc
        self._processes: dict[int, _ProcessSteps] = {}
        self._gpu_encoder = codec.GpuSampleEncoder()
        self._gpu_decimators: dict[int, _Decimator] = {}
        self._gpu_state: dict[int, tuple[Any, ...]] = {}
        self._host_decimator = _Decimator(
            self.retention.full_rate_s, self.retention.decimated_interval_s
        )
        self._last_step_t = 0.0
        self._events = 0
        self._event_bytes = 0
        self._loaders = 0
        self._loader_activity = 0
        self._loader_activity_bytes = 0

    # --- meta ------------------------------------------------------------------------

    def write_meta(self, meta: RunMeta) -> None:
        """Replace meta.json atomically (temp file, fsync, rename, fsync of the directory).

        Raises:
            OSError: it could not be written (the earlier meta.json stays).
        """
        # ``default=str`` keeps an odd value in ``environment`` from failing the run.
        data = json.dumps(codec.encode_meta(meta), indent=2, ensure_ascii=False, default=str)
        raw = (data + "\n").encode("utf-8", "backslashreplace")
        with self._lock:
            target = self.run_dir / META_FILE
            with atomic_writer(target, binary=True, mode=_FILE_MODE) as f:
                # Through the guard's write function, the seam of every record write.
                view = memoryview(raw)
                while view:
                    view = view[self.guard.write(f.fileno(), view) :]

    # --- steps -----------------------------------------------------------------------

    def add_step(self, step: StepRecord) -> None:
        """Keep ``step`` exactly when it is in its process's head or anomalous, else fold it."""
        with self._lock:
            if self._closed:
                return
            policy = self.retention
            counts = self.counts
            counts.steps_seen += 1
            self._last_step_t = max(self._last_step_t, step.t)
            proc = self._processes.get(step.pid)
            if proc is None:
                proc = self._processes[step.pid] = _ProcessSteps()
            proc.seen += 1
            exact = proc.seen <= policy.head_steps or self._is_anomalous(proc, step)
            phase_changed = proc.phase is not None and proc.phase != step.phase
            proc.phase = step.phase
            proc.alloc_retries = step.alloc_retries
            proc.ooms = step.ooms
            baseline = proc.baselines.get(step.phase)
            if baseline is None:
                baseline = proc.baselines[step.phase] = _Baseline(policy.baseline_steps)
            baseline.add(step, policy.baseline_refresh_steps)
            if phase_changed and proc.window is not None:
                self._close_window(proc)
            if exact:
                if counts.steps_exact < policy.max_exact_steps:
                    counts.steps_exact += 1
                    self._files[STEPS_FILE].write(_dumps(codec.encode_step(step)))
                    return
                counts.anomalies_dropped += 1
            self._fold(proc, step)

    def _is_anomalous(self, proc: _ProcessSteps, step: StepRecord) -> bool:
        """Whether ``step`` stands out: see docs/run-record.md, "Bounding"."""
        policy = self.retention
        # Evaluation and checkpoint steps are few and each one matters.
        if step.phase != "train" or step.phase != proc.phase:
            return True
        if _increased(proc.alloc_retries, step.alloc_retries) or _increased(proc.ooms, step.ooms):
            return True
        baseline = proc.baselines.get(step.phase)
        if baseline is None or len(baseline.durations) < policy.min_baseline_steps:
            return True
        if step.duration_s > policy.slow_factor * baseline.duration:
            return True
        wait_limit = max(
            policy.data_wait_factor * baseline.wait,
            baseline.wait + policy.data_wait_min_share * baseline.duration,
        )
        if step.data_wait_s > wait_limit:
            return True
        return (
            step.gpu_time_s is not None
            and baseline.gpu_time is not None
            and step.gpu_time_s > policy.slow_factor * baseline.gpu_time
        )

    def _fold(self, proc: _ProcessSteps, step: StepRecord) -> None:
        policy = self.retention
        window = proc.window
        if window is not None and (
            window.count >= policy.window_max_steps
            or step.t - window.t_start >= policy.window_max_s
        ):
            self._close_window(proc)
            window = None
        if window is None:
            window = proc.window = _WindowBuilder(step)
        window.add(step)
        self.counts.steps_windowed += 1

    def _close_window(self, proc: _ProcessSteps) -> None:
        if proc.window is None:
            return
        self._files[WINDOWS_FILE].write(_dumps(codec.encode_window(proc.window.build())))
        self.counts.windows += 1
        proc.window = None

    # --- samples ---------------------------------------------------------------------

    def add_gpu(self, sample: GpuSample) -> None:
        """Keep a GPU reading (decimated after ``full_rate_s``; state changes always kept)."""
        with self._lock:
            if self._closed:
                return
            self.counts.gpu_seen += 1
            state = _discrete_state(sample)
            changed = self._gpu_state.get(sample.index) != state
            self._gpu_state[sample.index] = state
            decimator = self._gpu_decimators.get(sample.index)
            if decimator is None:
                decimator = self._gpu_decimators[sample.index] = _Decimator(
                    self.retention.full_rate_s,
                    self.retention.decimated_interval_s,
                    self.retention.max_forced_gpu_samples,
                )
            if not decimator.keep(sample.timestamp, forced=changed):
                return
            self.counts.gpu_kept += 1
            self._files[GPU_FILE].write(_dumps(self._gpu_encoder.encode(sample)))

    def add_host(self, sample: HostSample) -> None:
        """Keep a host reading (decimated after ``full_rate_s``)."""
        with self._lock:
            if self._closed:
                return
            self.counts.host_seen += 1
            if not self._host_decimator.keep(sample.t):
                return
            self.counts.host_kept += 1
            self._files[HOST_FILE].write(_dumps(codec.encode_host(sample)))

    def add_loader(self, info: LoaderInfo) -> None:
        with self._lock:
            if self._closed:
                return
            if self._loaders >= self.retention.max_loaders:
                self.counts.loaders_dropped += 1
                return
            self._loaders += 1
            self._files[LOADERS_FILE].write(_dumps(codec.encode_loader(info)))

    def add_loader_activity(self, a: LoaderActivity) -> None:
        with self._lock:
            if self._closed:
                return
            line = _dumps(codec.encode_loader_activity(a))
            size = len(line.encode("utf-8", "backslashreplace"))
            policy = self.retention
            if (
                self._loader_activity >= policy.max_loader_activity
                or self._loader_activity_bytes + size > policy.max_loader_activity_bytes
            ):
                self.counts.loader_activity_dropped += 1
                return
            self._loader_activity += 1
            self._loader_activity_bytes += size
            self._files[LOADER_ACTIVITY_FILE].write(line)

    def add_event(self, e: RunEvent) -> None:
        with self._lock:
            if self._closed:
                return
            line = self._event_line(e)
            size = len(line.encode("utf-8", "backslashreplace"))
            policy = self.retention
            if (
                self._events >= policy.max_events
                or self._event_bytes + size > policy.max_event_bytes
            ):
                self.counts.events_dropped += 1
                return
            self._events += 1
            self._event_bytes += size
            self._files[EVENTS_FILE].write(line)

    def _event_line(self, e: RunEvent) -> str:
        limit = self.retention.max_event_text_chars
        data = _shorten(_plain_json(dict(e.data)), limit)
        short = RunEvent(
            t=e.t, kind=e.kind, message=_shorten(e.message, limit), pid=e.pid, data=data
        )
        return _dumps(codec.encode_event(short))

    # --- lifecycle -------------------------------------------------------------------

    def flush(self) -> None:
        """Push buffered lines to the files (open windows stay open)."""
        with self._lock:
            if self._closed:
                return
            for f in self._files.values():
                f.flush()

    def close(self) -> None:
        """Write the open windows and a ``record_capped`` event if a cap dropped
        records, then flush, fsync and close the files. Idempotent, and never
        raises for the run directory: a failed write trips :attr:`guard`."""
        with self._lock:
            if self._closed:
                return
            try:
                for proc in self._processes.values():
                    self._close_window(proc)
                c = self.counts
                if c.anomalies_dropped or c.events_dropped or c.loader_activity_dropped:
                    # Past the event caps on purpose: this one says what the caps cost.
                    self._files[EVENTS_FILE].write(self._event_line(self._capped_event()))
                for f in self._files.values():
                    f.sync()
            finally:
                self._closed = True
                self._close_files()

    def __enter__(self) -> RunRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _capped_event(self) -> RunEvent:
        c = self.counts
        return RunEvent(
            t=self._last_step_t,
            kind=CAPPED_EVENT,
            message=(
                f"record caps reached: {c.anomalies_dropped} anomalous step(s) folded into "
                f"windows, {c.events_dropped} event(s) and "
                f"{c.loader_activity_dropped} loader reading(s) dropped"
            ),
            data={
                "anomalies_dropped": c.anomalies_dropped,
                "events_dropped": c.events_dropped,
                "loaders_dropped": c.loaders_dropped,
                "loader_activity_dropped": c.loader_activity_dropped,
                "max_exact_steps": self.retention.max_exact_steps,
            },
        )

    def _close_files(self) -> None:
        for f in self._files.values():
            f.close()


def _increased(before: int | None, now: int | None) -> bool:
    return before is not None and now is not None and now > before


def _plain_json(value: Any) -> Any:
    """``value`` as plain JSON data; what JSON cannot hold becomes its ``repr``."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=repr, skipkeys=True))


def _shorten(value: Any, limit: int) -> Any:
    """Cut strings inside ``value`` longer than ``limit`` characters.

    Keeps a quarter from the start and the rest from the end: the end of a
    traceback says what failed.
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        head = limit // 4
        return value[:head] + "…" + value[len(value) - (limit - head - 1) :]
    if isinstance(value, dict):
        return {k: _shorten(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v, limit) for v in value]
    return value
