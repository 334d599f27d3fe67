"""Evidence about a silence: every process of the job, a few times a second.

:class:`SilenceObserver` is the supervisor's side of the silence classifier
(:mod:`trainmedic.resilience.silence`). While the job is silent (no step for
half a second) the watchdog calls :meth:`SilenceObserver.observe` at each of
its checks; the observer reads each process of the job from ``/proc``
(:mod:`..observe.procview`), takes its probe's latest heartbeat from the process
table, and builds one :class:`~trainmedic.resilience.silence.ProcessWindow`
per process over the last second:

* CPU, bytes and dirtied pages are differences between the snapshot taken
  about :data:`WINDOW_S` ago and now, the probe thread's own share removed;
* files open for writing are sized, and the storage under a file the main
  thread writes or syncs is asked how much it flushed, only when that thread
  is in file I/O (a descriptor scan per process is the costly part);
* the heartbeat is *fresh* when sent within :data:`HEARTBEAT_FRESH_S`: a late
  one (the probe's thread starved of CPU or of the interpreter lock, or the
  supervisor behind in reading — the heartbeat's send and receive times tell
  which) describes the past, and the classifier then trusts only the kernel;
* *work* counts forward/backward/optimizer calls and batches between two
  heartbeats sent during the silence, and *novel* code is a call chain the
  silence had not shown before (the first heartbeat of a silence is its
  baseline: the hang's own stack is new at that moment by definition). Both
  are dated by the heartbeat that showed them (its send time, on the
  observer's clock), not by the window that read it: a heartbeat arrives up to
  a second after it was sent and counts for a further second of windows, and
  dating the work by those windows pushed a hang's verdict up to two seconds
  past the job's last sign of life.

Nothing is read while steps flow: the cost is paid only in silences.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trainmedic.gpu.types import GpuSample
from trainmedic.host import ps
from trainmedic.resilience.places import Place, PlaceKind, classify_place
from trainmedic.resilience.silence import classify_job
from trainmedic.resilience.silence_evidence import JobEvidence, KernelView, ProcessWindow, StackView
from trainmedic.supervise.observe import procview
from trainmedic.supervise.observe.processes import ProcessState

WINDOW_S = 1.0
"""Seconds over which CPU and bytes are compared."""
MIN_WINDOW_S = 0.4
"""No evidence from a window shorter than this (the first samples of a silence)."""
HEARTBEAT_FRESH_S = 2.5
"""A heartbeat sent longer ago than this describes the past."""
TREE_REFRESH_S = 1.0
GPU_BUSY_PCT = 10.0
_LINE = re.compile(r":\d+ ")


@dataclass
class _History:
    """What was seen of one process during the current silence."""

    snapshots: deque[tuple[float, procview.ProcSnapshot]] = field(
        default_factory=lambda: deque(maxlen=16)
    )
    files: dict[tuple[int, int], int] | None = None
    flushed: tuple[int | None, int] | None = None
    heartbeats: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=8))
    """``(received, sent, work)``: when the observer read it and when the probe sent
    it (both on the observer's clock), and its work count."""
    last_hb_t: float | None = None
    chains: set[tuple[str, ...]] = field(default_factory=set)
    places: set[tuple[str, ...]] = field(default_factory=set)
    novel_at: float | None = None
    novel_sent: float | None = None


class SilenceObserver:
    """Builds the windows of one attempt's silences and classifies them.

    Args:
        tree: the attempt's processes (``Job.descendants``).
        processes: the probes' processes of this attempt, by pid.
        gpus: the last GPU readings, by index.
        proc_root / sys_root: ``/proc`` and ``/sys`` (seams for tests).
    """

    def __init__(
        self,
        tree: Callable[[], list[ps.Process]],
        processes: Callable[[], Mapping[int, ProcessState]],
        gpus: Callable[[], Mapping[int, GpuSample]],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
    ) -> None:
        self._tree = tree
        self._processes = processes
        self._gpus = gpus
        self._clock = clock
        self._wall = wall
        self._proc = proc_root
        self._sys = sys_root
        self._since: float | None = None
        self._history: dict[int, _History] = {}
        self._pids: list[int] = []
        self._pids_at: float | None = None
        self.last: JobEvidence | None = None

    def reset(self) -> None:
        self._since = None
        self._history.clear()
        self._pids_at = None
        self.last = None

    def observe(self, now: float, since_wall: float) -> JobEvidence | None:
        """The job's evidence over the last second of a silence that began at
        ``since_wall`` (Unix s); ``None`` until a window is long enough."""
        if since_wall != self._since:
            self._since = since_wall
            self._history.clear()
        procs = self._processes()
        pids = self._job_pids(now, procs)
        wall = self._wall()
        windows: list[ProcessWindow] = []
        complete = True
        for pid in pids:
            state = procs.get(pid)
            hb = state.last_heartbeat if state is not None else None
            snap = procview.read_process(
                pid,
                hb.probe_tid if hb else None,
                self._proc,
                sampler_tid=hb.sampler_tid if hb else None,
            )
            if snap is None:
                continue
            history = self._history.setdefault(pid, _History())
            history.snapshots.append((now, snap))
            base = _base(history.snapshots, now)
            if base is None:
                complete = False
                continue
            stack = self._stack(history, state, wall, since_wall, now)
            kernel = self._kernel(pid, history, base, now, snap)
            if (
                kernel.target is None
                and stack is not None
                and stack.fresh
                and classify_place(stack.place) is PlaceKind.SOCKET
            ):
                peers = procview.socket_peers(pid, self._proc)
                if peers:
                    kernel = dataclasses.replace(kernel, target="socket " + ", ".join(peers))
            windows.append(
                ProcessWindow(
                    pid=pid,
                    role=state.hello.role if state is not None else "unknown",
                    rank=state.hello.rank if state is not None else None,
                    probed=state is not None,
                    kernel=kernel,
                    stack=stack,
                    gpu_busy=self._gpu_busy(pid),
                )
            )
        if not windows or not complete:
            return None
        self.last = classify_job(windows)
        return self.last

    # --- the parts of a window -------------------------------------------------------------------

    def _job_pids(self, now: float, procs: Mapping[int, ProcessState]) -> list[int]:
        if self._pids_at is None or now - self._pids_at >= TREE_REFRESH_S:
            self._pids_at = now
            self._pids = sorted({p.pid for p in self._tree()} | set(procs))
        return self._pids

    def _kernel(
        self,
        pid: int,
        history: _History,
        base: tuple[float, procview.ProcSnapshot],
        now: float,
        snap: procview.ProcSnapshot,
    ) -> KernelView:
        t0, old = base
        span = now - t0
        target, dev = (None, None)
        if snap.fd is not None:
            target, dev = procview.fd_target(pid, snap.fd, self._proc)
        growth = flushed = None
        if snap.state == "D" or snap.syscall in (
            "write",
            "pwrite64",
            "writev",
            "fsync",
            "fdatasync",
            "sync_file_range",
            "close",
        ):
            growth = self._growth(pid, history)
            flushed = self._flushed(history, dev)
        else:
            history.files = None
            history.flushed = None
        return KernelView(
            span_s=span,
            cpu_s=_delta(snap.cpu_s, old.cpu_s, snap.probe_cpu_s, old.probe_cpu_s),
            run_wait_s=_delta(snap.run_wait_s, old.run_wait_s),
            wakeups=_int(_delta(snap.wakeups, old.wakeups)),
            io_bytes=_int(_delta(snap.io_chars, old.io_chars, snap.probe_io_chars,
                                 old.probe_io_chars)),
            dirtied_bytes=_int(_delta(snap.dirtied_bytes, old.dirtied_bytes)),
            growth_bytes=growth,
            state=snap.state,
            syscall=snap.syscall,
            target=target,
            flushed_bytes=flushed,
        )  # fmt: skip

    def _growth(self, pid: int, history: _History) -> int | None:
        sizes = procview.written_files(pid, self._proc)
        before = history.files
        history.files = sizes
        if before is None:
            return None
        return sum(max(0, size - before.get(key, size)) for key, size in sizes.items())

    def _flushed(self, history: _History, dev: int | None) -> int | None:
        now = procview.flushed_bytes(dev, self._proc, self._sys)
        before = history.flushed
        history.flushed = None if now is None else (dev, now)
        if now is None or before is None or before[0] != dev:
            return None
        return max(0, now - before[1])

    def _stack(
        self,
        history: _History,
        state: ProcessState | None,
        wall: float,
        since_wall: float,
        now: float,
    ) -> StackView | None:
        hb = state.last_heartbeat if state is not None else None
        received = state.heartbeat_received if state is not None else None
        if hb is None:
            return None
        if hb.t != history.last_hb_t:
            history.last_hb_t = hb.t
            if hb.t > since_wall:
                sent = now - max(0.0, wall - hb.t)
                history.heartbeats.append((now, sent, hb.work))
                chain = (_LINE.sub(" ", hb.stack[0]), *hb.stack[1:]) if hb.stack else ()
                if history.chains and chain not in history.chains:
                    history.novel_at = now
                    history.novel_sent = sent
                history.chains.add(chain)
                if len(history.places) < 64:
                    history.places.add(hb.stack[:3])
        # Windows are chosen by when a heartbeat was read (a late one still counts
        # once); the work is dated by when it was sent.
        work = 0
        work_at = None
        recent = [(sent, w) for t, sent, w in history.heartbeats if t >= now - WINDOW_S]
        older = [w for t, _, w in history.heartbeats if t < now - WINDOW_S]
        if recent:
            start = older[-1] if older else history.heartbeats[0][2]
            work = max(0, recent[-1][1] - start)
            if work:
                work_at = next(sent for sent, w in recent if w == recent[-1][1])
        novel = history.novel_at is not None and history.novel_at >= now - WINDOW_S
        return StackView(
            place=Place(hb.stack, hb.modules, hb.calls, hb.op),
            fresh=wall - hb.t <= HEARTBEAT_FRESH_S,
            samples=hb.samples,
            gil_busy=hb.gil_busy,
            work=work,
            novel=novel,
            lag_s=None if received is None else received - hb.t,
            places=max(1, len(history.places)),
            work_at=work_at,
            novel_at=history.novel_sent if novel else None,
        )

    def _gpu_busy(self, pid: int) -> bool | None:
        readings = self._gpus()
        if not readings:
            return None
        mine = [s for s in readings.values() if any(p.pid == pid for p in s.processes)]
        if not mine:
            return None
        return any((s.utilization_gpu_pct or 0.0) >= GPU_BUSY_PCT for s in mine)


def _base(
    snapshots: deque[tuple[float, procview.ProcSnapshot]], now: float
) -> tuple[float, procview.ProcSnapshot] | None:
    """The newest snapshot at least :data:`WINDOW_S` old, else the oldest one when
    the window it spans is long enough."""
    chosen = None
    for t, snap in snapshots:
        if now - t >= WINDOW_S:
            chosen = (t, snap)
    if chosen is None and snapshots and now - snapshots[0][0] >= MIN_WINDOW_S:
        chosen = snapshots[0]
    return chosen


def _delta(
    new: float | int | None,
    old: float | int | None,
    new_less: float | int | None = None,
    old_less: float | int | None = None,
) -> float | None:
    if new is None or old is None:
        return None
    value = float(new) - float(old)
    if new_less is not None and old_less is not None:
        value -= float(new_less) - float(old_less)
    return max(0.0, value)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
