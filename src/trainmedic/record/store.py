"""The run record on disk: the bounded writer.

:class:`RunRecordWriter` receives every measurement of a run from the
supervisor's threads and appends it to JSON-lines files in a private run
directory. It keeps the record bounded (a day at 100 steps/s stays far under
100 MB) while keeping every anomalous step exactly: the first steps of each
process and every step that stands out against a running median are written
as they are; ordinary steps are folded into :class:`StepWindow` aggregates
(the rule and its state: :mod:`trainmedic.record.retention`; the files:
:mod:`trainmedic.record.linefile`).
:func:`load_run_record` (:mod:`trainmedic.record.reader`, importable from here
too) reads a directory back into a :class:`RunRecord`.
The layout, every key and the bounding rule are in docs/run-record.md.
"""

from __future__ import annotations

import json
import os
import threading
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
from trainmedic.record.linefile import FILE_MODE, LineFile, dumps, open_private
from trainmedic.record.reader import load_run_record
from trainmedic.record.retention import (
    Baseline,
    Decimator,
    ProcessSteps,
    RecordCounts,
    RetentionPolicy,
    WindowBuilder,
    discrete_state,
)
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunEvent,
    RunMeta,
    StepRecord,
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
        self._files: dict[str, LineFile] = {}
        try:
            for name in LINE_FILES:
                self._files[name] = LineFile(open_private(self.run_dir / name), name, self.guard)
        except OSError as exc:
            self._close_files()
            raise RunDirectoryError(
                f"cannot write run directory {self.run_dir}: {exc.strerror or exc}"
            ) from exc
        self._processes: dict[int, ProcessSteps] = {}
        self._gpu_encoder = codec.GpuSampleEncoder()
        self._gpu_decimators: dict[int, Decimator] = {}
        self._gpu_state: dict[int, tuple[Any, ...]] = {}
        self._host_decimator = Decimator(
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
            with atomic_writer(target, binary=True, mode=FILE_MODE) as f:
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
                proc = self._processes[step.pid] = ProcessSteps()
            proc.seen += 1
            exact = proc.seen <= policy.head_steps or self._is_anomalous(proc, step)
            phase_changed = proc.phase is not None and proc.phase != step.phase
            proc.phase = step.phase
            proc.alloc_retries = step.alloc_retries
            proc.ooms = step.ooms
            baseline = proc.baselines.get(step.phase)
            if baseline is None:
                baseline = proc.baselines[step.phase] = Baseline(policy.baseline_steps)
            baseline.add(step, policy.baseline_refresh_steps)
            if phase_changed and proc.window is not None:
                self._close_window(proc)
            if exact:
                if counts.steps_exact < policy.max_exact_steps:
                    counts.steps_exact += 1
                    self._files[STEPS_FILE].write(dumps(codec.encode_step(step)))
                    return
                counts.anomalies_dropped += 1
            self._fold(proc, step)

    def _is_anomalous(self, proc: ProcessSteps, step: StepRecord) -> bool:
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

    def _fold(self, proc: ProcessSteps, step: StepRecord) -> None:
        policy = self.retention
        window = proc.window
        if window is not None and (
            window.count >= policy.window_max_steps
            or step.t - window.t_start >= policy.window_max_s
        ):
            self._close_window(proc)
            window = None
        if window is None:
            window = proc.window = WindowBuilder(step)
        window.add(step)
        self.counts.steps_windowed += 1

    def _close_window(self, proc: ProcessSteps) -> None:
        if proc.window is None:
            return
        self._files[WINDOWS_FILE].write(dumps(codec.encode_window(proc.window.build())))
        self.counts.windows += 1
        proc.window = None

    # --- samples ---------------------------------------------------------------------

    def add_gpu(self, sample: GpuSample) -> None:
        """Keep a GPU reading (decimated after ``full_rate_s``; state changes always kept)."""
        with self._lock:
            if self._closed:
                return
            self.counts.gpu_seen += 1
            state = discrete_state(sample)
            changed = self._gpu_state.get(sample.index) != state
            self._gpu_state[sample.index] = state
            decimator = self._gpu_decimators.get(sample.index)
            if decimator is None:
                decimator = self._gpu_decimators[sample.index] = Decimator(
                    self.retention.full_rate_s,
                    self.retention.decimated_interval_s,
                    self.retention.max_forced_gpu_samples,
                )
            if not decimator.keep(sample.timestamp, forced=changed):
                return
            self.counts.gpu_kept += 1
            self._files[GPU_FILE].write(dumps(self._gpu_encoder.encode(sample)))

    def add_host(self, sample: HostSample) -> None:
        """Keep a host reading (decimated after ``full_rate_s``)."""
        with self._lock:
            if self._closed:
                return
            self.counts.host_seen += 1
            if not self._host_decimator.keep(sample.t):
                return
            self.counts.host_kept += 1
            self._files[HOST_FILE].write(dumps(codec.encode_host(sample)))

    def add_loader(self, info: LoaderInfo) -> None:
        with self._lock:
            if self._closed:
                return
            if self._loaders >= self.retention.max_loaders:
                self.counts.loaders_dropped += 1
                return
            self._loaders += 1
            self._files[LOADERS_FILE].write(dumps(codec.encode_loader(info)))

    def add_loader_activity(self, a: LoaderActivity) -> None:
        with self._lock:
            if self._closed:
                return
            line = dumps(codec.encode_loader_activity(a))
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
        return dumps(codec.encode_event(short))

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
