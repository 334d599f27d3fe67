"""Stack samples of the training processes, taken by the supervisor from outside.

Why: a sampler thread inside the job must take the interpreter lock from the
training loop at each wake-up, and on millisecond steps the loop pays for it
in its own steps/s (docs/performance.md). Read from outside, the same samples
cost the job nothing: ``py-spy record --nonblocking`` reads each thread's
stack from the process's memory without pausing it, on a core of its own.

How: for each process whose steps come through the shared-memory ring (the
training processes; DataLoader workers keep their own sampler), one thread
runs py-spy in windows (:data:`FIRST_WINDOW_S`, then :data:`WINDOW_S`; :data:`RATE` samples a
second until :data:`KNOWN_WAIT_SAMPLES` of its waits are taken, then
:data:`KNOWN_RATE`) and
counts each window's waits for data (:mod:`trainmedic.supervise.observe.spy_trace`)
into a :class:`~trainmedic.record.types.LoaderActivity`, as the probe's
sampler would. After the first window that read the process it tells the
probe (:data:`~trainmedic.channel.wire.STACKS_OUTSIDE`), whose sampler then
rests while the training thread reads a DataLoader; until then, and wherever
py-spy cannot read the process (no py-spy, ptrace refused), the probe samples
as before. When what the samples show needs the probe's own view (a wait on a
socket: only the probe can tell which server answers it), or py-spy stops
working, the probe is handed the sampling back
(:data:`~trainmedic.channel.wire.STACKS_INSIDE`).

Cost: py-spy's own CPU (user + system, from the kernel's accounting of each
window) is summed and recorded with the run (the ``stacks_outside`` event at
the end); the rate is shared out so that all processes together take at most
:data:`TOTAL_RATE` samples a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmedic.channel.wire import STACKS_INSIDE, STACKS_OUTSIDE
from trainmedic.host.reaped import run_measured
from trainmedic.record.events import EventKind
from trainmedic.record.types import LoaderActivity, RunEvent
from trainmedic.supervise.observe.spy_trace import activities, count_waits, parse_chrometrace

RATE = 50
"""Samples a second of one process: at a 25 % data wait, about 12 samples of the
wait a second, the diagnosis's 20 in under two seconds."""
KNOWN_WAIT_SAMPLES = 320
"""Samples of a process's waits after which their make-up is known (the probe's
sampler slows down at the same count): the rate drops to :data:`KNOWN_RATE`."""
KNOWN_RATE = 20
"""Samples a second once the waits are known: a stall of half a second still gets ten.
py-spy's CPU follows its rate (about 1-1.5 ms a sample of a torch job on this VM)."""
TOTAL_RATE = 200
"""Samples a second of all processes together (eight ranks: 25 each)."""
MIN_RATE = 10
FIRST_WINDOW_S = 1
"""Seconds of the first window: its end is when the probe's own sampler can rest."""
WINDOW_S = 10
"""Seconds of the later windows: each start of py-spy costs it some 20-50 ms of CPU
reading the interpreter's layout, paid once a window (the records still come a
slice of 2 s apiece, :func:`~trainmedic.supervise.observe.spy_trace.activities`)."""
SOCKET_SHARE = 0.2
"""Share of the wait's samples on sockets from which the probe samples again."""
SOCKET_MIN_SAMPLES = 10
HANDOVER_AFTER_S = 2.0
"""Seconds a process trains (or reads a DataLoader) before the supervisor samples it
from outside: its probe's sampler takes the first samples, as often as every
millisecond on short steps, so that a run of a second of steps is diagnosed (a fixed
rate of 50 a second would give it a few); a long run pays for them once."""
PAUSE_S = 0.25
"""Seconds between two looks at a process not worth sampling yet (in the supervisor)."""
FAILURES_MAX = 3
"""Windows in a row that read nothing of a living process before it is handed back."""
TRACE_MAX_BYTES = 64 * 1024 * 1024
"""A window's trace larger than this is not read (a window holds a few hundred KiB)."""

Sender = Callable[[bytes], bool]
"""Sends bytes to the process's probe; ``False`` when its connection is gone."""


@dataclass(frozen=True)
class Window:
    """What one run of py-spy gave: its trace (``None``: none), its exit code, what
    it printed, and the CPU seconds it used."""

    trace: object | None
    code: int | None
    said: str
    cpu_s: float


Recorder = Callable[[int, int, int, Path, Callable[[subprocess.Popen[bytes]], None]], Window]
"""``(pid, seconds, rate, directory, started) -> Window``; ``started`` receives the
py-spy process, so that :meth:`OutsideStacks.stop` can end a window early."""


def find_py_spy() -> str | None:
    """py-spy beside this interpreter or on ``PATH`` (the hang forensics' look-up)."""
    from trainmedic.supervise.hang.forensics import find_py_spy as find

    return find()


def record_window(
    pid: int,
    seconds: int,
    rate: int,
    directory: Path,
    started: Callable[[subprocess.Popen[bytes]], None],
) -> Window:
    """One py-spy window on ``pid``; its output goes to a file in ``directory``."""
    py_spy = find_py_spy()
    if py_spy is None:
        return Window(None, None, "py-spy is not installed", 0.0)
    out = directory / f"stacks-{pid}.json"
    argv = [
        py_spy, "record", "--pid", str(pid), "--nonblocking", "--idle", "--threads",
        "--full-filenames", "--format", "chrometrace", "--rate", str(rate),
        "--duration", str(seconds), "--output", str(out),
    ]  # fmt: skip
    try:
        ran = run_measured(argv, directory / f"stacks-{pid}.log", seconds + 30.0, started)
    except OSError as exc:
        return Window(None, None, f"py-spy did not start: {exc.strerror or exc}", 0.0)
    if ran is None:
        return Window(None, None, "py-spy did not finish in time", 0.0)
    code, said, cpu_s = ran
    trace = None
    try:
        if out.stat().st_size <= TRACE_MAX_BYTES:
            with out.open("rb") as f:
                trace = json.load(f)
    except (OSError, ValueError, RecursionError):
        trace = None
    finally:
        with contextlib.suppress(OSError):
            out.unlink()
    return Window(trace, code, said, cpu_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _said(text: str) -> str:
    """py-spy's message in one line: its first ``Error:`` line, else its last words."""
    for line in text.splitlines():
        if line.startswith("Error:"):
            return line[len("Error:") :].strip()[:200]
    return " ".join(text.split())[-200:] or "no message"


class OutsideStacks:
    """The supervisor's sampling of the training processes' stacks (module doc).

    Args:
        emit: receives each window's loader activity (the message router's).
        event: receives the ``stacks_outside`` events.
        wall: Unix clock for the records' ``t``.
        recorder: one py-spy window (:func:`record_window`; tests pass their own).
        alive: whether a pid still runs.
        ready: whether a pid's waits are the supervisor's to sample now: it has trained
            or read a DataLoader for :data:`HANDOVER_AFTER_S`. Until then (and for ever,
            for a launcher such as torchrun's agent or a helper process) it is looked at
            every :data:`PAUSE_S` after its first window, instead of sampled.
    """

    def __init__(
        self,
        emit: Callable[[LoaderActivity], None],
        event: Callable[[RunEvent], None],
        wall: Callable[[], float],
        recorder: Recorder = record_window,
        alive: Callable[[int], bool] = _alive,
        ready: Callable[[int], bool] = lambda _pid: True,
        first_window_s: int = FIRST_WINDOW_S,
        window_s: int = WINDOW_S,
    ) -> None:
        self._emit = emit
        self._event = event
        self._wall = wall
        self._recorder = recorder
        self._alive = alive
        self._ready = ready
        self._first_window_s = first_window_s
        self._window_s = window_s
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: dict[int, threading.Thread] = {}
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._directory: Path | None = None
        self.cpu_s = 0.0
        """CPU seconds py-spy used so far, all windows."""
        self.windows = 0
        self.wait_samples = 0
        self.handed: set[int] = set()
        """Pids whose probes were told their stacks are sampled from outside."""

    def running(self) -> list[int]:
        """The pids of the py-spy processes sampling now (their CPU is trainmedic's)."""
        with self._lock:
            return [p.pid for p in self._running.values() if p.returncode is None]

    # --- the channel's side -----------------------------------------------------------------

    def ring_taken(self, pid: int, send: Sender) -> None:
        """A process's steps come through the ring: sample it from outside."""
        with self._lock:
            if self._stopping.is_set() or pid in self._threads:
                return
            if self._directory is None:
                try:
                    self._directory = Path(tempfile.mkdtemp(prefix="trainmedic-stacks-"))
                except OSError as exc:
                    self._note(pid, "not_started", f"no private directory: {exc}")
                    return
            thread = threading.Thread(
                target=self._watch, args=(pid, send, self._directory),
                name=f"trainmedic-outside-{pid}", daemon=True,
            )  # fmt: skip
            self._threads[pid] = thread
        thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End every window now (py-spy writes what it has on SIGINT), count the last
        samples, record what sampling from outside cost. Once: a second call returns."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            running = list(self._running.values())
            threads = list(self._threads.values())
        for proc in running:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)
        for thread in threads:
            thread.join(timeout_s)
        for proc in running:
            if proc.returncode is None:
                with contextlib.suppress(OSError):
                    proc.kill()
        if self.windows:
            self._event(
                RunEvent(
                    t=self._wall(),
                    kind=EventKind.STACKS_OUTSIDE,
                    message=(
                        f"stacks sampled from outside: {self.windows} windows, "
                        f"{self.wait_samples} samples of waits for data, "
                        f"py-spy used {self.cpu_s:.2f} s of CPU"
                    ),
                    data={
                        "state": "usage",
                        "windows": self.windows,
                        "wait_samples": self.wait_samples,
                        "cpu_s": round(self.cpu_s, 4),
                    },
                )
            )
        directory, self._directory = self._directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    # --- one process ----------------------------------------------------------------------------

    def _rate(self, known: bool) -> int:
        with self._lock:
            # Only the processes sampled now share the rate: a launcher waiting in the
            # pause, never handed over, takes none of it.
            handed = tuple(self.handed)  # copied in one C call: other watchers add to it
            active = max(1, sum(1 for pid in handed if self._threads[pid].is_alive()))
        return max(MIN_RATE, min(KNOWN_RATE if known else RATE, TOTAL_RATE // active))

    def _started(self, pid: int) -> Callable[[subprocess.Popen[bytes]], None]:
        def started(proc: subprocess.Popen[bytes]) -> None:
            with self._lock:
                self._running[pid] = proc
            if self._stopping.is_set():
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGINT)

        return started

    def _watch(self, pid: int, send: Sender, directory: Path) -> None:
        failures = 0
        seconds = self._first_window_s
        waits = 0  # this process's samples of waits so far
        checked = False  # a first window read the process
        try:
            while not self._stopping.is_set() and self._alive(pid):
                if checked and pid not in self.handed:
                    # Read once; its own sampler goes on until it has trained a while
                    # (or for ever: a launcher): no py-spy meanwhile, a look now and then.
                    while not self._ready(pid):
                        if not self._alive(pid) or self._stopping.wait(PAUSE_S):
                            return
                    if not send(STACKS_OUTSIDE):
                        return
                    self.handed.add(pid)
                    self._note(pid, "outside", f"py-spy, {self._rate(False)} samples a second")
                rate = self._rate(waits >= KNOWN_WAIT_SAMPLES)
                started = self._wall()
                window = self._recorder(pid, seconds, rate, directory, self._started(pid))
                with self._lock:
                    self._running.pop(pid, None)
                    self.cpu_s += window.cpu_s
                threads = parse_chrometrace(window.trace)
                if not threads:
                    if not self._alive(pid):
                        return
                    failures += 1
                    if pid not in self.handed or failures >= FAILURES_MAX:
                        self._give_back(pid, send, "not_read", _said(window.said))
                        return
                    continue
                failures = 0
                if not checked:
                    checked = True  # py-spy reads it; the probe sampled meanwhile
                    seconds = self._window_s
                    continue
                counts = count_waits(threads, rate)
                waits += counts.wait_samples
                with self._lock:
                    self.windows += 1
                    self.wait_samples += counts.wait_samples
                for record in activities(counts, started, self._wall(), pid):
                    self._emit(record)
                sockets = counts.states.get("socket_wait", 0)
                if counts.wait_samples >= SOCKET_MIN_SAMPLES and (
                    sockets >= SOCKET_SHARE * counts.wait_samples
                ):
                    self._give_back(
                        pid, send, "inside",
                        "the training thread waits on sockets: the probe names the server",
                    )  # fmt: skip
                    return
                seconds = self._window_s
        except Exception as exc:  # a bug here must cost the samples, never the run
            self._give_back(pid, send, "failed", f"{type(exc).__name__}: {exc}")

    def _give_back(self, pid: int, send: Sender, state: str, why: str) -> None:
        if pid in self.handed:
            self.handed.discard(pid)
            send(STACKS_INSIDE)
        self._note(pid, state, why)

    def _note(self, pid: int, state: str, why: str) -> None:
        words = {
            "outside": "stacks of process {pid} are sampled from outside: {why}",
            "inside": "stacks of process {pid} are sampled by its probe again: {why}",
            "not_read": "stacks of process {pid} are sampled by its probe: py-spy: {why}",
            "not_started": "stacks of process {pid} are sampled by its probe: {why}",
            "failed": "stacks of process {pid} are sampled by its probe: {why}",
        }
        self._event(
            RunEvent(
                t=self._wall(),
                kind=EventKind.STACKS_OUTSIDE,
                message=words[state].format(pid=pid, why=why),
                pid=pid,
                data={"state": state, "why": why},
            )
        )
