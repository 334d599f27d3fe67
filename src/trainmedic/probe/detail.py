"""The compute hooks on a share of short steps: the probe's cost stays flat and small.

Every step needs only two hooks: the DataLoader's ``__next__`` (the data wait,
the batch) and the optimizer's post-step hook (the step's end). The other
hooks - the outermost module calls, ``backward()`` and the optimizer's
pre-step hook - split the rest of the step into compute and host time, count
gradient-free forward calls (an evaluation held between two train steps) and
read the batch's autocast state. Each is a Python call on the training thread:
on a 0.7 ms step the four cost about 2 % (docs/performance.md), on a 20 ms
step under 0.1 %.

So on steps shorter than :data:`LONG_STEP_S` that fetch from a DataLoader,
the compute hooks run in *windows*: :data:`WINDOW_STEPS` steps in a row with
them, then :data:`GAP_STEPS` (a random number in that range, so that a
periodic pattern in the job cannot line up with the windows) without, stretched
on steps under about 4 ms so that windows come at most every
:data:`GAP_MIN_S` on average. Steps
without them are *partial*: their length and data wait are measured as
always, their compute time is unknown (``None``), and shares of compute come
from the windows' steps (:func:`trainmedic.record.stats.summarize` counts only
steps where it is known).

The hooks come back at once, whatever the schedule, when what they measure
matters:

* the first :data:`WARMUP_STEPS` steps, steps of :data:`LONG_STEP_S` or more,
  steps that fetched no batch (their data wait *is* the host time outside
  compute), steps of a phase other than training, steps not ended by an
  optimizer, and while the forward watch discovers root modules;
* a step fetching more than :data:`EXTRA_FETCHES` batches beyond the last
  step with the hooks (an evaluation loop between two train steps: its gradient-free
  forward calls must be counted for it to be split out) - turned on by the
  loader hook, at the fetch;
* no step ended for :data:`OVERDUE_S` (anything between steps: the forward
  calls are the liveness signal that the job is working, docs/run.md) -
  turned on by the probe's thread (:meth:`DetailSwitch.wake`).

Turning on or off happens at a step's end on the training thread, or (only
on) from the probe's thread; the optimizer's pre-step hook is only ever
changed on the training thread, between two uses of torch's hook table.
Once ``torch.compile`` has traced anything in the process, the hooks stay on
for good: a compiled function that calls a watched module was traced with its
class's ``__call__`` as it was then, and changing it would make dynamo
recompile the function at every window (and, past its cache limit, give up
compiling it). ``TRAINMEDIC_PROBE_DISABLE=sampled_detail`` keeps the hooks on
every step.
"""

from __future__ import annotations

import random
import sys
import threading

from trainmedic.probe.steps import NO_FETCH_LIMIT

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from trainmedic.probe.seams import ForwardSeam
    from trainmedic.probe.segments import StepDraft
    from trainmedic.probe.steps import GapSteps, StepTracker

WARMUP_STEPS = 32
"""Steps timed in full at the start (and after each restart of the schedule)."""
WINDOW_STEPS = 4
"""Steps in a row timed in full in each window."""
GAP_STEPS = (80, 176)
"""Range of steps without the compute hooks between two windows (uniform, inclusive).

Wide because switching costs: changing a class's ``__call__`` discards what
the interpreter had specialised for that class. With (40, 88) the windows
and their switches were a fifth of the probe's machine instructions on a
0.7 ms step (``probe_instructions.py --valgrind``, docs/performance.md)."""
GAP_MIN_S = 0.5
"""Mean seconds between two windows, at least: on steps shorter than
``GAP_MIN_S / mean(GAP_STEPS)`` (about 4 ms) the gap in steps is stretched by
the factor that brings its mean to this, its spread kept. The windows' steps
and their switches are most of what the probe adds to a sub-millisecond step
beyond the two hooks every step needs; a window every 0.13 s (128 steps of
1 ms) told the shares of compute no better than one every 0.5 s does."""
LONG_STEP_S = 0.02
"""Steps at least this long (seconds) keep the hooks: they cost them < 0.1 %."""
_MEAN_GAP_STEPS = sum(GAP_STEPS) / 2
EXTRA_FETCHES = 1
"""Batches fetched beyond the count of the last step with the hooks, after which they come on."""
OVERDUE_S = 0.2
"""Seconds without a step's end after which the probe's thread turns the hooks on."""


class DetailHook:
    """One compute hook that can be taken off and put back.

    Args:
        name: the probe part it belongs to.
        attach / detach: put it on / take it off; each does nothing when already so.
        any_thread: whether ``attach`` may run on a thread other than the training
            thread (attribute assignments may; torch's hook tables may not).
    """

    __slots__ = ("any_thread", "attach", "detach", "name")

    def __init__(
        self,
        name: str,
        attach: Callable[[], None],
        detach: Callable[[], None],
        any_thread: bool,
    ) -> None:
        self.name = name
        self.attach = attach
        self.detach = detach
        self.any_thread = any_thread


class DetailSwitch:
    """Decides, at each step's end, whether the next steps get the compute hooks.

    Args:
        tracker: told when the hooks go on or off (its segments become partial).
        enabled: ``False`` keeps every hook on for good (``sampled_detail`` disabled).
        rng: picks the gaps between windows (seeded in tests).
        compiled: whether ``torch.compile`` has traced anything (:func:`dynamo_traced`).

    Attributes:
        on: whether every compute hook is on.
        hooks: the hooks switched, in installation order.
    """

    def __init__(
        self,
        tracker: StepTracker,
        enabled: bool = True,
        rng: random.Random | None = None,
        compiled: Callable[[], bool] | None = None,
    ) -> None:
        self.tracker = tracker
        self.compiled = compiled or dynamo_traced
        self.enabled = enabled
        self.rng = rng or random.Random()
        self.hooks: list[DetailHook] = []
        self.forward: ForwardSeam | None = None
        self.on = True
        self.partly_on = False
        """Some hooks were put back by another thread; the rest follow at the next step's end."""
        self._countdown = WARMUP_STEPS
        self._last_end = float("-inf")
        self._on_since: float | None = None
        """The end of the step after which the hooks came on at a step's end (``None``:
        at the start, or between two step ends)."""
        self.fetch_limit = NO_FETCH_LIMIT
        """The loader hook turns the hooks on when a step fetches more batches than this
        while they are off (:attr:`StepTracker.fetch_limit` holds it then)."""
        self._lock = threading.Lock()
        self._armed: GapSteps | None = None
        """The gap steps handed to the tracker (:meth:`arm_gap`): its steps count down
        there, and come back to :attr:`_countdown` at the next step's end here."""
        self.windows = 0
        """Windows begun so far."""
        self.windows_ended = 0
        """Times the hooks went off after a window (or the warm-up): the steps before
        each ran with them on (the probe's thread asks what forward calls they saw)."""

    @property
    def countdown(self) -> int:
        """Step ends until the hooks next go on or off (the gap steps handed to the
        tracker included)."""
        gap = self._armed
        return self._countdown + (gap.left if gap is not None else 0)

    def add(self, hook: DetailHook) -> None:
        """Register a compute hook (installed and on)."""
        self.hooks.append(hook)

    # --- the training thread ---------------------------------------------------------------

    def step_ended(self, draft: StepDraft) -> None:
        """A step's record was made (training thread, at the step's end).

        Runs at every step: the test whether the step could go without the hooks
        is written inline (a call costs more than the test), and the draft is
        unpacked (one instruction) rather than read attribute by attribute."""
        _, phase, source, end, seg = draft
        gap = self._armed
        if gap is not None:  # the steps the tracker closed by itself since arm_gap()
            self._countdown += gap.left
            self._disarm()
        last = self._last_end
        self._last_end = end
        if not self.enabled:
            return
        forward = self.forward
        if (
            self.partly_on
            or end - last >= LONG_STEP_S
            or source != "optimizer"
            or phase != "train"
            or not seg.fetches
            or (forward is not None and forward.pending)
        ):
            if self.on:
                # Counted all the same (the warm-up's first step has no length to
                # test), but a window always ends with steps that may go without.
                self._countdown = max(self._countdown - 1, WINDOW_STEPS)
            else:
                self._countdown = WINDOW_STEPS
                self._on_since = end
                self._switch(True)
            return
        self._countdown -= 1
        if self._countdown > 0:
            return
        if self.compiled():  # see the module doc: never change what dynamo traced
            self.enabled = False
            if not self.on:
                self._switch(True)
            return
        if self.on:
            self._countdown = self._gap(end)
            self.fetch_limit = seg.fetches + EXTRA_FETCHES
            self._switch(False)
        else:
            self._countdown = WINDOW_STEPS
            self._on_since = end
            self._switch(True)

    def _gap(self, end: float) -> int:
        """Steps until the next window: drawn from :data:`GAP_STEPS`, stretched on
        short steps to a mean of :data:`GAP_MIN_S` (the window just ended, from
        ``_on_since`` to ``end``, gives the step's length)."""
        gap = self.rng.randint(*GAP_STEPS)
        since, self._on_since = self._on_since, None
        if since is None or end <= since:
            return gap  # the warm-up, or a window begun between two step ends
        step_s = (end - since) / WINDOW_STEPS
        stretch = GAP_MIN_S / (step_s * _MEAN_GAP_STEPS)
        return max(gap, int(gap * stretch))

    def arm_gap(
        self,
        out: Any,
        limit: int,
        make: Callable[[object, int, float, float, Any], GapSteps] | None = None,
    ) -> None:
        """After :meth:`step_ended`: while the hooks stay off for more than the next
        step, let the tracker close those steps by itself, their drafts going to
        ``out`` while it holds fewer than ``limit``, or, where ``make`` builds what
        closes them (:meth:`~trainmedic.probe.steprings.RingSteps.gap`), their
        records into the ring (see :class:`~trainmedic.probe.steps.GapSteps`).
        The last step of the gap always comes back here and turns the hooks on."""
        if self.on or self.partly_on or not self.enabled or self._countdown < 2:
            return
        forward = self.forward
        if forward is not None and forward.pending:
            return
        gap = self.tracker.arm_gap(
            self._countdown - 1, self._last_end, LONG_STEP_S, out, limit, make
        )
        if gap is not None:
            self._armed = gap
            self._countdown -= gap.left  # what is left of it comes back at step_ended()

    def _disarm(self) -> None:
        """The schedule starts over (hooks on): the gap steps the tracker did not
        close are dropped (its own ``gap`` goes with ``set_detail()``), the time of the
        last one it did close is kept."""
        gap, self._armed = self._armed, None
        if gap is not None and gap.last_end > self._last_end:
            self._last_end = gap.last_end

    def restore(self) -> None:
        """Every hook back on (the switch is being given up)."""
        self._switch(True, boundary=False)

    def fetch_overflow(self) -> None:
        """The step fetches more batches than usual while the hooks are off (loader hook,
        training thread): put them on for the rest of the step and a window after it."""
        self._countdown = WINDOW_STEPS
        self._on_since = None
        self._switch(True, boundary=False)

    def _switch(self, on: bool, boundary: bool = True) -> None:
        with self._lock:
            self._disarm()
            for hook in self.hooks if on else reversed(self.hooks):
                (hook.attach if on else hook.detach)()
            if on and not self.on and not self.partly_on:
                self.windows += 1
            elif not on and (self.on or self.partly_on):
                self.windows_ended += 1
            self.on = on
            self.partly_on = False
            tracker = self.tracker
            tracker.set_detail(on, boundary)
            # Only while the hooks are off does the loader hook test the count.
            tracker.fetch_limit = NO_FETCH_LIMIT if on else self.fetch_limit

    # --- the probe's thread ----------------------------------------------------------------

    def wake(self) -> None:
        """No step ended for :data:`OVERDUE_S`: put back every hook another thread may,
        now (the rest at the next step's end)."""
        with self._lock:
            if self.on or self.partly_on:
                return
            for hook in self.hooks:
                if hook.any_thread:
                    hook.attach()
            self.partly_on = True
            self.windows += 1
            self._disarm()
            self._countdown = WINDOW_STEPS
            self._on_since = None
            self.tracker.set_detail(True, False)

    def overdue(self, now: float) -> bool:
        """Whether no step ended for :data:`OVERDUE_S` with the hooks off (``now``: probe clock)."""
        last = self._last_end
        gap = self._armed
        if gap is not None and gap.last_end > last:
            last = gap.last_end  # a step the tracker closed by itself
        return not self.on and not self.partly_on and now - last >= OVERDUE_S


def dynamo_traced() -> bool:
    """Whether ``torch.compile`` (dynamo) has traced a frame in this process.

    Dynamo loads with the first optimizer step whether or not anything is
    compiled, so its presence says nothing; its frame counter does."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return False
    try:
        frames = counters.get("frames")  # .get: the counters are a defaultdict
        return bool(frames and frames.get("total", 0))
    except Exception:
        return True  # a dynamo this code does not know: keep the hooks as they are
