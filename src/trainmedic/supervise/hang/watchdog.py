"""The watchdog: observes one attempt of the job and says when it hangs.

It is a record sink (it receives what the channel and the samplers deliver,
like the run record's writer) plus a :meth:`Watchdog.check` the supervisor's
main loop calls a few times a second. It feeds a
:class:`~trainmedic.resilience.timeouts.StepTimeout` — the decision is
there, pure — with:

* **steps** of the lead process (the first training process to mark a step,
  rank 0 preferred): each train step record; the end of a phase record;
* **phases** from the lead's heartbeats (``trainmedic.phase("checkpoint")``,
  the Checkpointer): a marked phase gets the phase bound while it lasts;
* **evidence** while the job is silent (no step for half a second): at
  each check, :class:`~trainmedic.supervise.hang.liveness.SilenceObserver` reads
  every process of the job and its probe's heartbeat, and classifies the
  silence (:mod:`trainmedic.resilience.silence`): work restarts the bound,
  a silence the evidence shows to be a hang gets the learned bound, one it
  cannot classify the conservative bound. The last evidence goes into the
  hang's verdict and report.

It also keeps what the supervisor needs when the attempt ends: the last
steps, the last GPU readings and the first of the attempt (ECC faults), the
largest DataLoader ``num_workers``, the step where a Checkpointer resumed,
and the times of the first and last steps (goodput accounting).

The watchdog is armed when a hang can be recognised at all: a process of the
attempt imported torch or marked a step, or the user set a timeout
explicitly. A program the probe cannot see steps in is never stopped by a
startup timeout it could not have met.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.gpu.faults import XidEvent, xid_from_report
from trainmedic.gpu.types import GpuSample
from trainmedic.host import ps
from trainmedic.record import codec
from trainmedic.record.events import EventKind
from trainmedic.record.types import (
    LoaderInfo,
    RunEvent,
    StepRecord,
)
from trainmedic.resilience.group import RankProgress
from trainmedic.resilience.silence_evidence import JobEvidence, Silence
from trainmedic.resilience.timeouts import TRAIN_PHASE, StepTimeout, TimeoutVerdict
from trainmedic.supervise.hang.forensics import JobProcess
from trainmedic.supervise.hang.liveness import SilenceObserver
from trainmedic.supervise.observe.processes import IgnoringSink, ProcessState, ProcessTable

SILENCE_MIN_S = 0.5
"""No step (or phase mark) for this long, in seconds, is a silence worth evidence."""
EVIDENCE_SLOW_S = 1.0
"""Seconds between two evidence windows while evidence does not set the bound."""
LAST_STEPS = 20
RESUMED_EVENT = EventKind.CHECKPOINT_RESUMED
"""Event a Checkpointer sends through the probe after it loaded a checkpoint."""

Tree = Callable[[], list[ps.Process]]


MAX_XIDS = 64
"""Xid events kept for the failure classifier (the newest)."""


@dataclass(frozen=True)
class AttemptObservations:
    """What the watchdog saw during one attempt (times on the wall clock, Unix s).

    Attributes:
        lead_pid: the process whose steps were followed.
        steps: train steps of the lead process.
        first_step_start: when the first train step began.
        last_step_end: when the last step (or phase) ended.
        last_progress: when the last sign of life was seen (step, phase, progress).
        resume_step: the step a Checkpointer resumed from in this attempt.
        num_workers: the largest DataLoader ``num_workers`` seen.
        pids: every pid of the job seen during the attempt.
        torch_version: the job's torch, when a process reported it.
    """

    lead_pid: int | None
    steps: int
    first_step_start: float | None
    last_step_end: float | None
    last_progress: float | None
    resume_step: int | None
    num_workers: int | None
    pids: frozenset[int]
    torch_version: str | None


class Watchdog(IgnoringSink):
    """See the module docstring.

    Args:
        table: the probes' process table (hellos, heartbeats).
        tree: the current attempt's processes (``Job.descendants``).
        clock / wall: the supervisor's monotonic and Unix clocks.
        observer: classifies silences (default: a
            :class:`~trainmedic.supervise.hang.liveness.SilenceObserver` over ``/proc``).
    """

    def __init__(
        self,
        table: ProcessTable,
        tree: Tree,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        observer: SilenceObserver | None = None,
    ) -> None:
        self._table = table
        self._tree = tree
        self._clock = clock
        self._wall = wall
        self._lock = threading.RLock()
        self._xids: deque[tuple[float, XidEvent]] = deque(maxlen=MAX_XIDS)
        self.gpu_last: dict[int, GpuSample] = {}
        self.observer = observer or SilenceObserver(
            tree, self._attempt_processes, lambda: dict(self.gpu_last), clock=clock, wall=wall
        )
        self.timeout: StepTimeout | None = None
        self._active = False
        self._explicit = False
        self._reset(0.0, 0)

    # --- lifecycle ---------------------------------------------------------------------

    def begin_attempt(
        self, timeout: StepTimeout, leader_pid: int, *, explicit: bool = False
    ) -> None:
        """A new attempt started (its job is ``leader_pid``); ``explicit``: the user
        set a timeout, so the watchdog is armed from the start."""
        with self._lock:
            self.timeout = timeout
            self._explicit = explicit
            self._reset(self._wall(), leader_pid)
            self._offset = self._wall() - self._clock()
            self._active = True

    def end_attempt(self) -> AttemptObservations:
        """Stop observing; what was seen."""
        with self._lock:
            self._active = False
            return self.observations()

    def _reset(self, started_wall: float, leader_pid: int) -> None:
        self._started_wall = started_wall
        self._leader = leader_pid
        self._offset = 0.0
        self.lead_pid: int | None = None
        self._lead_rank: int | None = None
        self._steps = 0
        self._first_step_start: float | None = None
        self._last_step_end: float | None = None
        self._last_progress_wall: float | None = None
        self._last_steps: deque[StepRecord] = deque(maxlen=LAST_STEPS)
        self._resume_step: int | None = None
        self._num_workers: int | None = None
        self._pids: set[int] = {leader_pid} if leader_pid else set()
        self._ranks: dict[int, RankProgress] = {}
        self.gpu_first: dict[int, GpuSample] = {}
        self._phase = TRAIN_PHASE
        self._hb_t: float | None = None
        self._silent_since = started_wall
        self._observed_at: float | None = None
        self.evidence: JobEvidence | None = None
        if hasattr(self, "observer"):
            self.observer.reset()
        self._armed = False

    # --- the record sink ------------------------------------------------------------------

    def add_step(self, step: StepRecord) -> None:
        with self._lock:
            if not self._active or step.t < self._started_wall - 1.0:
                return
            self._pids.add(step.pid)
            if step.rank is not None and step.phase == TRAIN_PHASE:
                known = self._ranks.get(step.rank)
                count = known.steps + 1 if known is not None and known.pid == step.pid else 1
                self._ranks[step.rank] = RankProgress(step.rank, step.pid, count, step.t)
            if step.phase == TRAIN_PHASE and (
                self.lead_pid is None or (self._lead_rank not in (None, 0) and step.rank == 0)
            ):
                self.lead_pid, self._lead_rank = step.pid, step.rank
            if self.lead_pid is None:
                # A phase before any step (a checkpoint loaded at start-up).
                self._phase_record(step)
                return
            if step.pid != self.lead_pid:
                return
            self._last_steps.append(step)
            if step.phase != TRAIN_PHASE:
                self._phase_record(step)
                return
            t = self._mono(step.t)
            self._steps += 1
            if self._first_step_start is None:
                self._first_step_start = step.t - step.duration_s
            self._last_step_end = step.t
            self._last_progress_wall = step.t
            self._silent_since = max(self._silent_since, step.t)
            if self.timeout is not None:
                self.timeout.observe_step(t, self._steps)

    def _phase_record(self, step: StepRecord) -> None:
        """A phase ended (its record): the phase's start and end are phase marks."""
        if self.timeout is None:
            return
        start = self._mono(step.t - step.duration_s)
        self.timeout.observe_phase(start, step.phase)
        self.timeout.observe_phase(self._mono(step.t), TRAIN_PHASE)
        self._phase = TRAIN_PHASE
        self._last_step_end = step.t
        self._last_progress_wall = step.t
        self._silent_since = max(self._silent_since, step.t)

    def add_gpu(self, sample: GpuSample) -> None:
        with self._lock:
            self.gpu_last[sample.index] = sample
            if self._active:
                self.gpu_first.setdefault(sample.index, sample)

    def add_loader(self, info: LoaderInfo) -> None:
        with self._lock:
            if self._active and info.t >= self._started_wall - 1.0:
                self._num_workers = max(self._num_workers or 0, info.num_workers)

    def add_event(self, event: RunEvent) -> None:
        if event.kind == EventKind.XID:
            xid = xid_from_report(event.message, event.data)
            if xid is not None:
                with self._lock:
                    self._xids.append((event.t, xid))
            return
        if event.kind != RESUMED_EVENT:
            return
        with self._lock:
            if self._active and event.t >= self._started_wall - 1.0:
                step = event.data.get("step")
                if isinstance(step, int) and not isinstance(step, bool):
                    self._resume_step = step

    # --- the main loop's question -----------------------------------------------------------

    def check(self, now: float) -> TimeoutVerdict | None:
        """The verdict at ``now`` (supervisor monotonic seconds) when the attempt is hung,
        else ``None``. Call a few times a second."""
        with self._lock:
            if not self._active or self.timeout is None:
                return None
            self._follow_heartbeat()
            wall = self._wall()
            if wall - self._silent_since >= SILENCE_MIN_S and self._evidence_due(now):
                self._observed_at = now
                evidence = self.observer.observe(now, self._silent_since)
                if evidence is not None:
                    self.evidence = evidence
                    self.timeout.observe_evidence(now, evidence.silence, evidence.at)
                    if evidence.silence is Silence.WORK:
                        at = now if evidence.at is None else min(now, evidence.at)
                        seen = wall - (now - at)
                        last = self._last_progress_wall
                        self._last_progress_wall = seen if last is None else max(last, seen)
            if not self._is_armed():
                return None
            verdict = self.timeout.verdict(now)
            return verdict if verdict.hung else None

    def _evidence_due(self, now: float) -> bool:
        """At every check where evidence sets the bound (after steps were learned);
        once a second otherwise (start-up, warm-up, marked phases: for the report)."""
        assert self.timeout is not None
        if self.timeout.verdict(now).basis in ("learned", "pause"):
            return True
        return self._observed_at is None or now - self._observed_at >= EVIDENCE_SLOW_S

    def status(self, now: float) -> TimeoutVerdict | None:
        """The current verdict, hung or not (``None`` before an attempt)."""
        with self._lock:
            return None if self.timeout is None else self.timeout.verdict(now)

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._is_armed()

    def _is_armed(self) -> bool:
        if not self._armed:
            procs = self._attempt_processes()
            self._armed = (
                self._explicit
                or self._steps > 0
                or any(s.torch is not None for s in procs.values())
            )
        return self._armed

    def _attempt_processes(self) -> dict[int, ProcessState]:
        cutoff = self._started_wall - 0.5
        return {
            pid: s
            for pid, s in self._table.snapshot().items()
            if s.hello.t >= cutoff and s.exited_at is None
        }

    def _focus_pid(self, procs: Mapping[int, ProcessState]) -> int | None:
        if self.lead_pid is not None:
            return self.lead_pid
        if self._leader in procs:
            return self._leader
        candidates = [s for s in procs.values() if s.hello.role != "worker"]
        return min(candidates, key=lambda s: s.hello.t).hello.pid if candidates else None

    def _follow_heartbeat(self) -> None:
        procs = self._attempt_processes()
        self._pids.update(procs)
        pid = self._focus_pid(procs)
        state = procs.get(pid) if pid is not None else None
        hb = state.last_heartbeat if state is not None else None
        if hb is None or hb.t == self._hb_t:
            return
        self._hb_t = hb.t
        # A heartbeat taken before the last step or phase end is older news.
        stale = self._last_step_end is not None and hb.t <= self._last_step_end
        if self.timeout is not None and hb.phase != self._phase and not stale:
            self.timeout.observe_phase(self._mono(hb.t), hb.phase)
            self._phase = hb.phase
            self._silent_since = max(self._silent_since, hb.t)

    # --- what the supervisor reads ------------------------------------------------------------

    def _mono(self, wall_t: float) -> float:
        return min(wall_t - self._offset, self._clock())

    def observations(self) -> AttemptObservations:
        with self._lock:
            procs = self._table.snapshot()
            torch = _torch_version(procs, self._started_wall)
            return AttemptObservations(
                lead_pid=self.lead_pid,
                steps=self._steps,
                first_step_start=self._first_step_start,
                last_step_end=self._last_step_end,
                last_progress=self._last_progress_wall,
                resume_step=self._resume_step,
                num_workers=self._num_workers,
                pids=frozenset(self._pids),
                torch_version=torch,
            )

    def xid_events(self, since_wall: float) -> tuple[XidEvent, ...]:
        """The Xids recorded since ``since_wall`` (Unix s), kept across attempts: NVML
        reports an Xid to any user where the kernel log itself is unreadable, and its
        event may arrive after the attempt it ended."""
        with self._lock:
            return tuple(x for t, x in self._xids if t >= since_wall - 1.0)

    def last_steps(self) -> list[dict[str, Any]]:
        with self._lock:
            return [codec.encode_step(s) for s in self._last_steps]

    def gpu_readings(self) -> list[dict[str, Any]]:
        """The last reading of each GPU, JSON-ready."""
        with self._lock:
            encoder = codec.GpuSampleEncoder()
            return [encoder.encode(self.gpu_last[i]) for i in sorted(self.gpu_last)]

    def gpu_pids(self) -> set[int] | None:
        """Pids the GPUs listed in their last readings; ``None`` without GPU readings
        or when a GPU's process list could not be read.
        A reading taken before the job was stopped still lists it: the wait for
        release then lasts until a newer reading no longer does."""
        with self._lock:
            # A GPU whose process list cannot be read (MIG, no permission) cannot tell.
            if not self.gpu_last or any(
                s.known_processes is None for s in self.gpu_last.values()
            ):
                return None
            return {p.pid for s in self.gpu_last.values() for p in s.processes}

    def job_processes(self) -> list[JobProcess]:
        """The attempt's live processes, the lead first, with roles and last heartbeats."""
        with self._lock:
            procs = self._attempt_processes()
            pids = {p.pid for p in self._tree()} | set(procs)
            out = []
            for pid in pids:
                state = procs.get(pid)
                role = state.hello.role if state is not None else "unknown"
                hb = state.last_heartbeat if state is not None else None
                out.append(JobProcess(pid, role, hb.stack if hb is not None else ()))
            lead = self.lead_pid if self.lead_pid is not None else self._focus_pid(procs)
            out.sort(key=lambda p: (p.pid != lead, p.role == "worker", p.pid))
            return out

    def rank_progress(self) -> dict[int, RankProgress]:
        """Each rank's train steps in this attempt and when its last one ended."""
        with self._lock:
            return dict(self._ranks)

    def focus_pid(self) -> int | None:
        with self._lock:
            return self._focus_pid(self._attempt_processes())


def _torch_version(procs: Mapping[int, ProcessState], since: float) -> str | None:
    for s in procs.values():
        if s.torch is not None and s.hello.t >= since - 0.5:
            return s.torch.version
    return None
