"""The stack sampler thread, and how often it samples.

Sampling is frequent (:data:`FAST_S`) only while loading is worth
diagnosing, and rare (:data:`SLOW_S`) while steps are healthy:

* in the training process (:class:`MainPolicy`): frequent while the recent
  data wait is at least :data:`WATCH_SHARE` of step time (the diagnosis
  reports a data wait from 20 %) - every :data:`FIRST_S` for the first
  :data:`FIRST_SAMPLES` samples of the wait, then about
  :data:`WAIT_SAMPLES_PER_S` samples of the wait a second until
  :data:`KNOWN_SAMPLES` are taken, then :data:`KNOWN_SAMPLES_PER_S` -, before
  the first steps are known (every :data:`FIRST_S` for the first
  :data:`FIRST_SAMPLES` samples, as a run of a fraction of a second needs
  them), and every :data:`FAST_S` while the current wait has lasted
  :data:`STALL_FACTOR` times the usual step and at least :data:`STALL_FLOOR_S`
  (a stall in progress, whatever the usual wait: the diagnosis names a
  stall's cause from the stack samples taken during it);
* in a DataLoader worker (:class:`WorkerPolicy`), which cannot see the
  training process's steps: frequent while the worker has been busy (not
  waiting for work) at least :data:`WORKER_BUSY_SHARE` of the recent samples
  (every :data:`WORKER_FAST_S`) - saturated workers are what an input-bound
  job looks like - rare otherwise.

At :data:`SLOW_S` the thread wakes four times a second and mostly finds
nothing to sample (the training thread is not waiting for data). A stack
seen before costs a few µs (its classification is cached by the frames' code
and instruction), a new one about 25 µs (20 frames read and classified).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from trainmedic.probe.answered import still_working, wait_answered
from trainmedic.probe.stacks import FLUSH_S, ActivityAggregate, StackCache
from trainmedic.record.types import LoaderActivity
from trainmedic.wilson import wilson_half_width

TYPE_CHECKING = False
if TYPE_CHECKING:
    from trainmedic.probe.handoff import HelperSampler

FAST_S = 0.02
"""Seconds between two samples at most often (a stall in progress, start-up)."""
SLOW_S = 0.25
"""Seconds between two samples while steps are healthy."""
WATCH_SHARE = 0.10
"""Recent data-wait share of step time from which sampling is frequent."""
WAIT_SAMPLES_PER_S = 5.0
"""Samples of waiting threads aimed for per second while the data wait is watched:
the period is the wait's share over this (20 ms at a 10 % wait, 100 ms at 50 %),
so a job that mostly waits is not woken more than its diagnosis needs."""
FIRST_SAMPLES = 64
"""Samples of waiting threads taken every :data:`FIRST_S` before the rate drops
to :data:`WAIT_SAMPLES_PER_S`: a short run (a second of steps) still gets the
samples its diagnosis needs (it names a wait's cause from 20 on, and the
slower samples keep coming); a long one pays for them once. Each wake-up
takes the interpreter lock from a training loop that runs Python, so they
cost a fast-stepping job nearly what they cost the probe's thread: at a
25 % wait, 64 samples take about 250 wake-ups (200 took 800, a visible
share of a few seconds of 0.7 ms steps)."""
KNOWN_SAMPLES = 320
"""Samples of waiting threads after which the wait's make-up is known well (each
state's share within a few percent): the rate drops to :data:`KNOWN_SAMPLES_PER_S`.
At :data:`WAIT_SAMPLES_PER_S` that is about a minute of a loader-bound job. A wait
of one kind is known sooner (:data:`KNOWN_HALF_WIDTH`)."""
KNOWN_HALF_WIDTH = 0.05
"""The wait's make-up is known, whatever the count of samples from
:data:`FIRST_SAMPLES` on, once the 95 % (Wilson) interval of its commonest state's
share is at most this far either side of it: a loop whose every sample of the wait
finds the same state (the usual loader-bound job: one transform, one read) is known
after 64 samples instead of 320. Each wake-up takes the interpreter lock from the
training loop (the job's own steps/s pays for it, docs/performance.md), so the
first minute of such a job wakes the training thread about four times less often;
a wait of mixed kinds is sampled as long as before, and so is a wait on others
(:data:`WAITS_ON_OTHERS`): what those others do is sampled along with it
(:mod:`trainmedic.probe.handoff`), and their make-up needs the samples."""
WAITS_ON_OTHERS = frozenset({"ipc_wait", "socket_wait"})
"""States of a training thread waiting on threads, processes or servers whose work is
sampled with each of its samples: no early :attr:`MainPolicy.known` for them."""
KNOWN_SAMPLES_PER_S = 1.0
"""Samples of waiting threads aimed for per second once :data:`KNOWN_SAMPLES` are
taken: enough to follow a change of the wait's make-up over minutes. On the 0.7 ms
MLP (a 24 % wait) the sampler then wakes 4 times a second instead of 20, and a
wake-up costs its thread far more than the sample's bytecodes suggest (about
180 µs of CPU, docs/performance.md)."""
FIRST_S = 0.005
"""Seconds between two wake-ups while the first samples are taken. Short, because
a wake-up lands where the training thread lets go of the interpreter lock, and
torch ops let go of it: in a loop that prepares batches in Python, about half
the wake-ups find the thread inside the step's compute and sample nothing."""
FIRST_SHORT_S = 0.001
""":data:`FIRST_S` for steps shorter than it (more than one step between two
wake-ups): a loop of sub-millisecond steps may train for a few hundred
milliseconds in all (pytorch/examples' ``regression``: 300 steps of 0.2 ms), and
at one wake-up per 5 ms its diagnosis would get a dozen samples, too few to
name anything. The first samples then cost about 100 wake-ups within 0.1-0.2 s,
once per process."""
WORKER_FAST_S = 0.05
"""Seconds between two samples of a saturated DataLoader worker."""
STALL_FACTOR = 4.0
STALL_FLOOR_S = 0.1
WORKER_BUSY_SHARE = 0.7
RECENT_S = 5.0
"""Time constant of the recent step averages, seconds."""
WORKER_RECENT_S = 2.0
"""Time constant of a worker's recent busy share, seconds."""

Targets = Callable[[], Sequence[tuple[int, str]]]
"""Returns the (thread id, role) pairs to sample now; empty when nothing is wanted."""


class StepStats:
    """Recent step times and data waits, decayed with :data:`RECENT_S` (one writer)."""

    __slots__ = ("_duration", "_steps", "_wait")

    def __init__(self) -> None:
        self._duration = 0.0
        self._wait = 0.0
        self._steps = 0.0

    def add(self, duration_s: float, data_wait_s: float, steps: int = 1) -> None:
        """Add ``steps`` steps that took ``duration_s`` and waited ``data_wait_s`` in all."""
        keep = math.exp(-max(0.0, duration_s) / RECENT_S)
        self._duration = self._duration * keep + duration_s
        self._wait = self._wait * keep + data_wait_s
        self._steps = self._steps * keep + steps

    @property
    def known(self) -> bool:
        return self._steps > 0

    @property
    def wait_share(self) -> float:
        return self._wait / self._duration if self._duration > 0 else 0.0

    @property
    def step_s(self) -> float:
        """The recent mean step time, seconds (0 before any step)."""
        return self._duration / self._steps if self._steps > 0 else 0.0


class MainPolicy:
    """Sampling period in the training process.

    Args:
        stats: recent steps (kept by the probe's thread).
        waiting_since: when the current wait for data began (probe clock), or ``None``.
        clock: the clock of ``waiting_since``.
        steps: the training steps taken so far (the tracker's count), to tell steps
            shorter than :data:`FIRST_S` before their statistics are known.
        pull: brings ``stats`` up to date, called before each period is worked out
            (steps written into the shared-memory ring never pass the probe's thread).
    """

    def __init__(
        self,
        stats: StepStats,
        waiting_since: Callable[[], float | None],
        clock: Callable[[], float],
        steps: Callable[[], int] | None = None,
        pull: Callable[[], None] | None = None,
    ) -> None:
        self._stats = stats
        self._pull = pull
        self._waiting_since = waiting_since
        self._clock = clock
        self._steps = steps
        self._last_count: tuple[float, int] | None = None
        self._short = False
        self.taken = 0
        """Samples of a waiting thread taken so far."""
        self._states: dict[str, int] = {}
        self._known = False

    def _first(self) -> float:
        """The period of the first samples: :data:`FIRST_SHORT_S` while steps are
        shorter than :data:`FIRST_S`, else :data:`FIRST_S`."""
        if self._steps is None:
            return FIRST_S
        now, count = self._clock(), self._steps()
        last = self._last_count
        if last is not None and now > last[0] and count > last[1]:
            self._short = (count - last[1]) / (now - last[0]) > 1.0 / FIRST_S
        self._last_count = (now, count)
        return FIRST_SHORT_S if self._short else FIRST_S

    @property
    def known(self) -> bool:
        """Whether the wait's make-up is known well enough for the slow rate."""
        if not self._known and self.taken >= FIRST_SAMPLES:
            state, top = max(self._states.items(), key=lambda kv: kv[1], default=("", 0))
            self._known = self.taken >= KNOWN_SAMPLES or (
                state not in WAITS_ON_OTHERS
                and wilson_half_width(top, self.taken) <= KNOWN_HALF_WIDTH
            )
        return self._known

    def period(self, last_state: str | None) -> float:
        if last_state is not None:
            self.taken += 1
            self._states[last_state] = self._states.get(last_state, 0) + 1
        if self._pull is not None:
            self._pull()
        stats = self._stats
        if not stats.known:
            # Steps are known only from the probe's first send (0.2-0.5 s in): a run
            # that short still needs its first samples, as often as once they are.
            return self._first() if self.taken < FIRST_SAMPLES else FAST_S
        share = stats.wait_share
        period = SLOW_S
        if share >= WATCH_SHARE:
            if self.taken < FIRST_SAMPLES:
                return self._first()
            rate = KNOWN_SAMPLES_PER_S if self.known else WAIT_SAMPLES_PER_S
            period = min(SLOW_S, max(FAST_S, share / rate))
        since = self._waiting_since()
        if since is not None:
            waited = self._clock() - since
            if waited >= max(STALL_FLOOR_S, STALL_FACTOR * stats.step_s):
                return FAST_S
        return period


class WorkerPolicy:
    """Sampling period in a DataLoader worker, from its own recent busy share."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._busy = 1.0  # a worker starting up is busy: watch it until it waits
        self._last = monotonic()

    @property
    def busy_share(self) -> float:
        return self._busy

    def period(self, last_state: str | None) -> float:
        now = self._monotonic()
        if last_state is not None:
            weight = 1.0 - math.exp(-max(0.0, now - self._last) / WORKER_RECENT_S)
            busy = 0.0 if last_state == "idle" else 1.0
            self._busy += weight * (busy - self._busy)
        self._last = now
        return WORKER_FAST_S if self._busy >= WORKER_BUSY_SHARE else SLOW_S


class StackSampler:
    """A daemon thread sampling the stacks ``targets`` names.

    Args:
        targets: what to sample now (called at every wake-up, from the sampler thread).
        emit: receives each aggregate.
        on_error: called with the exception when sampling fails; the thread stops.
        period: seconds until the next wake-up, given the state of the last
            stack sampled (``None`` when none was); a constant ``period_s`` without it.
        standby: whether another sampler takes these samples now (the supervisor's,
            from outside the process): the thread then sleeps until :meth:`wake`,
            so that nothing of the probe wakes while steps flow.
        wall: Unix clock for the records' ``t``.
    """

    def __init__(
        self,
        targets: Targets,
        emit: Callable[[LoaderActivity], None],
        on_error: Callable[[BaseException], None],
        pid: int,
        period_s: float = FAST_S,
        flush_s: float = FLUSH_S,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        check: Callable[[], None] | None = None,
        period: Callable[[str | None], float] | None = None,
        standby: Callable[[], bool] | None = None,
    ) -> None:
        self._targets = targets
        self._emit = emit
        self._on_error = on_error
        self.pid = pid
        self._period = period if period is not None else (lambda _state: period_s)
        self._flush_s = flush_s
        self._wall = wall
        self._monotonic = monotonic
        self._check = check
        self._standby = standby
        self._wake = threading.Event()
        self.aggregate = ActivityAggregate()
        self._cache = StackCache()
        self._helpers: HelperSampler | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.wakeups = 0
        self.last_state: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainmedic-stacks", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        """The sampler's thread, once started."""
        return self._thread

    def sample_once(self) -> int:
        """Take one sample of every target now; returns how many stacks were read."""
        targets = self._targets()
        self.last_state = None
        if not targets:
            return 0
        if self._check is not None:
            self._check()
        frames = sys._current_frames()
        taken = 0
        waiting = False
        answered = False
        for ident, role in targets:
            frame = frames.get(ident)
            if frame is None:
                continue
            state, key, hands_off = self._cache.classify_wait(frame, role)
            if state == "socket_wait":
                # Waiting on a socket itself: who answers, if a process of this machine.
                self._sample_server(ident, frame)
            if hands_off and not waiting:
                answered = wait_answered(frame)
            del frame
            with self._lock:
                self.aggregate.add_classified(state, key)
            self.last_state = state
            waiting = waiting or hands_off
            taken += 1
        if waiting:
            # The training thread waits on others: what they do is what the wait costs.
            self._sample_helpers(frames, frozenset(ident for ident, _ in targets), answered)
        del frames
        self.samples += taken
        return taken

    def _helper_sampler(self) -> HelperSampler:
        if self._helpers is None:
            from trainmedic.probe.handoff import HelperSampler

            self._helpers = HelperSampler(self._cache.classify)
        return self._helpers

    def _sample_helpers(
        self, frames: dict[int, FrameType], skip: frozenset[int], answered: bool
    ) -> None:
        observations, keys = self._helper_sampler().sample(frames, skip)
        if answered:
            # The thread waited on handed the batch over and let go of the interpreter
            # lock, which this sampler took first: that it is idle now is not what the
            # wait was spent on. Others still working are.
            observations = still_working(observations)
        with self._lock:
            self.aggregate.add_handoff(observations, keys, delivered=answered and not observations)

    def _sample_server(self, ident: int, frame: FrameType) -> None:
        observations = self._helper_sampler().own_server(ident, frame)
        if observations:
            with self._lock:
                self.aggregate.add_servers(observations)

    def flush(self) -> None:
        """Send what has been counted so far (safe from any thread)."""
        with self._lock:
            record = self.aggregate.take(self._wall(), self.pid)
        if record is not None:
            self._emit(record)

    def wake(self) -> None:
        """Look again now whether to sample (the standby answer may have changed)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        self.flush()

    def _run(self) -> None:
        next_flush = self._monotonic() + self._flush_s
        standby = self._standby
        woken = self._wake
        stop = self._stop
        try:
            while not stop.is_set():
                if standby is not None and standby():
                    self.flush()  # what was counted before the outside sampler took over
                    woken.wait()
                    woken.clear()
                    continue
                if woken.wait(self._period(self.last_state)):
                    woken.clear()
                    continue
                self.wakeups += 1
                self.sample_once()
                now = self._monotonic()
                if now >= next_flush:
                    next_flush = now + self._flush_s
                    self.flush()
        except Exception as exc:
            self._on_error(exc)
