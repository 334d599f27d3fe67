"""Where steps begin and end, and how each step's time splits, in one process.

One module because it is one state machine (:class:`StepTracker`) whose
events run on the training thread at every hook call: its hot paths are
written inline on purpose (docs/performance.md), and pieces moved elsewhere
would cost the training thread a call each. The step records it produces are
:mod:`trainmedic.probe.segments`'.

:class:`StepTracker` is pure bookkeeping with no torch in it: the hooks in
:mod:`trainmedic.probe.torch_hooks` (and the public API) feed it events with
times from one monotonic clock, and it emits a :class:`StepDraft` per step.

Step boundaries, by source:

* ``optimizer``: the post-step hook of the *lead* optimizer (the first one to
  step; another takes over when it steps :data:`LEAD_TAKEOVER` times in a row
  without the lead). Backward calls inside an optimizer step (closures, as
  LBFGS calls them) never mark steps.
* ``backward``: for scripts without a torch optimizer, each outermost backward
  call ends a step. Until the first optimizer step the tracker cannot tell
  gradient accumulation from manual updates, so it *holds* the segments ended
  by backward calls: the first optimizer step merges them into its step; after
  :data:`HOLD_MAX_SEGMENTS` segments (or :data:`HOLD_MAX_S` seconds with at
  least :data:`HOLD_MIN_SEGMENTS`) without one, they become steps of their own.
* ``api``: ``trainmedic.step()``; once called, the process's steps come from it only.

An optimizer step inside a ``torch.compile`` region runs no hook: dynamo
traces it (the post-step hook then tells :meth:`StepTracker.optimizer_compiled`),
then runs it inside compiled code. The step being traced ends there; after
that, while the lead optimizer is a compiled one, each outermost backward
call (which dynamo always runs eagerly) ends a step - a step then reaches
from one backward call's end to the next, and gradient accumulation inside
the compiled region makes each micro-batch a step. Should its post-step hook
run again (dynamo gave up compiling the region and runs it eagerly), steps
end at the optimizer again.

Time inside a step: *compute* is the host time inside outermost forward calls,
backward calls and optimizer steps (nested regions counted once); *loader wait*
is the time blocked in DataLoader ``__next__``. The step's ``data_wait`` is the
loader wait when the step fetched from a DataLoader; otherwise it is the host
time outside compute (the script's own batch preparation), which the CUDA part
may narrow to the time the GPU actually waited (:mod:`trainmedic.probe.cuda`).

Without the compute hooks (:mod:`trainmedic.probe.detail` takes them off on
most short steps), only loader events and step ends arrive: a segment begun
or passed without them is *partial* - its length and data wait are known,
its compute is not (``compute_s`` is ``None``), and its gradient-free forward
calls do not count towards telling an evaluation apart.

Steps between two windows of the compute hooks (the *gap*, :mod:`trainmedic.probe.detail`)
are the common case on short steps, and each of them ends the same way: the lead
optimizer's post-step hook, no region open, no phase, a partial segment. The
detail switch then arms a :class:`GapSteps`; while it is armed,
:meth:`StepTracker.optimizer_exit` has it close such a step in a few lines
(:meth:`GapSteps.close`) and queue its draft, without the general close, the
probe's step callback and the detail switch's count (three Python calls a
step); once the supervisor has taken the shared-memory ring, a
:class:`~trainmedic.probe.steprings.RingGap` writes the step's record there
itself, without a draft, and the next step reuses the segment. Anything else
the tracker is told disarms it, and the next step ends the general way.

Phases: time inside ``trainmedic.phase(name)`` is kept out of the train step
around it and reported as a record of that phase. Without the API, a step
holding many more forward calls with gradients disabled than usual (an
evaluation loop between two train steps) is split at its last such call into
an ``eval`` record and the train step.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# StepDraft is the tracker's output: importable from here, as it always was.
from trainmedic.probe.segments import Mark, Segment, make_draft, merge
from trainmedic.probe.segments import StepDraft as StepDraft

TRAIN = "train"
EVAL = "eval"

LEAD_TAKEOVER = 8
"""Steps of another optimizer in a row after which it becomes the lead."""
HOLD_MAX_SEGMENTS = 32
"""Backward segments held before a script without optimizer steps is taken as one."""
HOLD_MAX_S = 30.0
"""... or seconds since the first held segment began, with at least :data:`HOLD_MIN_SEGMENTS`."""
HOLD_MIN_SEGMENTS = 3
EVAL_MIN_FORWARDS = 8
"""Gradient-free forward calls in one step from which it may hold an evaluation."""
EVAL_FACTOR = 4.0
"""... when they are also more than this many times the usual number per step."""
_EVAL_HISTORY = 32
_SAME_MOMENT_S = 0.001
# What the region stack is in the common case at each kind's end (compared, not built).
_FORWARD_ONLY = ["forward"]
_BACKWARD_ONLY = ["backward"]
_OPTIMIZER_ONLY = ["optimizer"]
NO_FETCH_LIMIT = 1 << 62


class StepListener(Protocol):
    """Told when a segment's first compute begins (the CUDA part records an event)."""

    def segment_started(self) -> object | None:
        """The first compute of a new segment begins; returns a marker kept with it."""
        ...


class GapSteps:
    """What closes a gap step for :meth:`StepTracker.optimizer_exit` (:meth:`close`).

    Armed by the detail switch (:meth:`StepTracker.arm_gap`) at a step's end
    when the next steps go without the compute hooks; the tracker drops it
    (``tracker.gap = None``) at any event other than a DataLoader fetch or the
    lead's step end, and the fast close stops by itself when ``left`` runs
    out (never past the room ``out`` had when it was armed), or a step is long
    or fetched nothing. This one queues each step's draft in ``out``;
    :class:`~trainmedic.probe.steprings.RingGap` writes its record into the
    shared-memory ring instead.

    Attributes:
        lead: the lead optimizer's identity (what the post-step hook passes).
        left: steps it may still close.
        last_end: when the last step ended (tracker clock, seconds).
        long_s: a step at least this long (seconds) ends the general way.
        out: where the drafts go (the probe's outbox).
    """

    __slots__ = ("last_end", "lead", "left", "long_s", "out")

    def __init__(self, lead: object, left: int, last_end: float, long_s: float, out: Any) -> None:
        self.lead = lead
        self.left = left
        self.last_end = last_end
        self.long_s = long_s
        self.out = out

    def close(self, tracker: StepTracker, now: float, optimizer: object) -> bool:
        """The lead's post-step hook may end ``tracker``'s step at ``now``: end it as a
        gap step (the general close, written out for this case with the probe's
        callback and the detail switch's count) and say so, or say it is not one
        (``False``: nothing changed, the step ends the general way).

        The torch post-step hook calls this itself, a call less on every gap step
        (:mod:`trainmedic.probe.torch_hooks`)."""
        seg = tracker.segment
        left = self.left
        if not left or not seg.fetches or optimizer != self.lead:
            return False
        if now - self.last_end >= self.long_s:
            return False
        self.left = left - 1
        self.last_end = now
        tracker.segment = new = Segment()
        new.t_start = now
        new.partial = True
        tracker.wants_batch = True
        by_phase = tracker.steps_by_phase
        number = by_phase[TRAIN] + 1
        by_phase[TRAIN] = number
        self.out.append(make_draft((number, TRAIN, "optimizer", now, seg)))
        return True


@dataclass
class _Phase:
    name: str
    t_start: float
    outer: Segment
    steps_inside: int = 0


class StepTracker:
    """Turns hook events of one process into steps; call from the training thread only.

    Runs on the training thread at every hook event, so its hot paths (the
    loader, forward, backward and optimizer events and a step's close) are
    written for few Python operations: no helper calls where a line will do.

    Args:
        emit: receives each finished step.
        listener: told when a segment's first compute begins (CUDA events), if any.
    """

    __slots__ = (
        "_compiled",
        "_held",
        "_lead",
        "_nograd_history",
        "_others",
        "_phases",
        "_region_t0",
        "_regions",
        "compiled_lead",
        "detail",
        "emit",
        "fetch_limit",
        "forwards",
        "gap",
        "listener",
        "loader_since",
        "mode",
        "outside_since",
        "segment",
        "steps_by_phase",
        "wants_batch",
        "work",
    )

    def __init__(
        self, emit: Callable[[StepDraft], None], listener: StepListener | None = None
    ) -> None:
        self.emit = emit
        self.listener = listener
        self.mode: str | None = None
        self.steps_by_phase: dict[str, int] = {}
        self.segment = Segment()
        """What the step being accumulated now has gathered (the loader hook adds a
        gap step's fetch to it itself, :mod:`trainmedic.probe.torch_hooks`)."""
        self._held: list[Segment] = []
        self._region_t0 = 0.0
        # Open compute regions, outermost first (``forward``, ``backward``, ``optimizer``).
        self._regions: list[str] = []
        self._phases: list[_Phase] = []
        self._lead: object | None = None
        self._others: dict[object, int] = {}
        self._compiled: set[object] = set()
        self.compiled_lead = False
        """Whether the lead optimizer steps inside compiled code: backward calls end steps."""
        self._nograd_history: deque[int] = deque(maxlen=_EVAL_HISTORY)
        self.loader_since: float | None = None
        """When the current DataLoader ``__next__`` began, or ``None`` outside one
        (the loader hook stores it itself: a call costs more than the store)."""
        self.work = 0
        """Outermost forward, backward and optimizer calls and DataLoader batches so far:
        the heartbeat's sign that the job is working between steps (an evaluation)."""
        self.forwards = 0
        """Outermost forward calls so far (the forward watch's sign that it sees the model)."""
        self.outside_since: float | None = None
        """When the last outermost compute region ended (the start of the host time
        outside compute that scripts without a DataLoader spend preparing batches)."""
        self.wants_batch = True
        """Whether the next outermost forward call's batch size and autocast state
        are still unknown for this segment (only the first call's are kept)."""
        self.detail = True
        """Whether the compute hooks (forward, backward, optimizer start) are on
        (:mod:`trainmedic.probe.detail`); segments begun without them are partial."""
        self.fetch_limit = NO_FETCH_LIMIT
        """Batches fetched in one step beyond which :meth:`loader_exit` says the
        compute hooks should come on (set by :mod:`trainmedic.probe.detail`)."""
        self.gap: GapSteps | None = None
        """Armed while the next steps may be closed by :meth:`optimizer_exit` alone."""

    # --- what the heartbeat reports ----------------------------------------------------

    @property
    def train_steps(self) -> int:
        return self.steps_by_phase.get(TRAIN, 0)

    @property
    def phase(self) -> str:
        # Read from the heartbeat thread too: index, don't test then index.
        try:
            return self._phases[-1].name
        except IndexError:
            return TRAIN

    @property
    def activity(self) -> str:
        """``data``, ``forward``, ``backward``, ``optimizer`` or ``other``."""
        if self.loader_since is not None:
            return "data"
        try:
            return self._regions[0]
        except IndexError:
            return "other"

    def reset(self) -> None:
        """Forget everything (a forked child starts its own count)."""
        self.gap = None
        self.mode = None
        self.steps_by_phase = {}
        self._new_segment(None)
        self._held = []
        self._regions = []
        self._phases = []
        self._lead = None
        self._others = {}
        self._compiled = set()
        self.compiled_lead = False
        self._nograd_history.clear()
        self.loader_since = None
        self.outside_since = None
        self.wants_batch = True

    @property
    def in_compute(self) -> bool:
        return bool(self._regions)

    @property
    def started(self) -> bool:
        """Whether any step or phase record has been emitted."""
        return bool(self.steps_by_phase)

    def _new_segment(self, t_start: float | None) -> None:
        self.segment = seg = Segment()
        if t_start is not None:
            seg.t_start = t_start
        if not self.detail:
            seg.partial = True
        self.wants_batch = True

    def set_detail(self, on: bool, boundary: bool) -> None:
        """The compute hooks were switched on or off (any thread).

        ``boundary``: switched right at a step's end, before anything of the new
        segment happened - its detail is then whole (or absent) from its start.
        Switched on within a segment, the segment stays partial.
        """
        self.gap = None
        self.detail = on
        if boundary or not on:
            self.segment.partial = not on

    # --- compute regions ---------------------------------------------------------------

    def compute_enter(self, now: float, kind: str) -> None:
        """Entering an outermost forward (``forward``), a backward call or an optimizer step."""
        self.gap = None
        regions = self._regions
        if kind == "optimizer" and "optimizer" in regions:
            # A previous optimizer step raised before its post hook: close it.
            self._abandon_region("optimizer", now)
        if not regions:
            self._outermost(now)
        regions.append(kind)

    def _outermost(self, now: float) -> None:
        """An outermost compute region begins (the hot paths inline this)."""
        self._region_t0 = now
        self.work += 1
        seg = self.segment
        if not seg.compute_seen:
            self._first_compute(seg, now)

    def compute_exit(self, now: float, kind: str) -> None:
        regions = self._regions
        if regions and regions[-1] == kind:
            regions.pop()
        elif kind in regions:
            # Remove the innermost region of this kind (regions of a kind nest properly).
            del regions[len(regions) - 1 - regions[::-1].index(kind)]
        else:
            return
        if not regions:
            self.segment.compute += max(0.0, now - self._region_t0)
            self.outside_since = now

    def _abandon_region(self, kind: str, now: float) -> None:
        while kind in self._regions:
            self.compute_exit(now, kind)

    def forward_enter(
        self, now: float, samples: int | None, grad_enabled: bool, autocast: bool | None
    ) -> None:
        """An outermost module call begins (``samples``: its batch size, when found)."""
        self.gap = None
        regions = self._regions
        if regions:  # inside a backward call or an optimizer step (a closure): rare
            self._forward_enter_inside(now, samples, grad_enabled, autocast)
            return
        self.forwards += 1
        self.work += 1
        self._region_t0 = now
        regions.append("forward")
        seg = self.segment
        if not seg.compute_seen:
            self._first_compute(seg, now)
        if self.wants_batch:
            self._first_forward(seg, samples, autocast, False)
        if not grad_enabled:
            seg.nograd_forwards += 1

    def _forward_enter_inside(
        self, now: float, samples: int | None, grad_enabled: bool, autocast: bool | None
    ) -> None:
        self.forwards += 1
        inside_optimizer = "optimizer" in self._regions
        self._regions.append("forward")
        seg = self.segment
        if self.wants_batch:
            self._first_forward(seg, samples, autocast, inside_optimizer)
        if not grad_enabled and not inside_optimizer:
            seg.nograd_forwards += 1

    def _first_compute(self, seg: Segment, now: float) -> None:
        """The segment's first compute region begins (the CUDA marker is taken now)."""
        seg.compute_seen = True
        if seg.t_start is None:
            seg.t_start = now
        if self.listener is not None and seg.start_marker is None:  # None: no fetch took it
            seg.start_marker = self.listener.segment_started()

    def _first_forward(
        self, seg: Segment, samples: int | None, autocast: bool | None, inside_optimizer: bool
    ) -> None:
        if inside_optimizer:
            if seg.optimizer_forward_samples is None:
                seg.optimizer_forward_samples = samples
                self.wants_batch = samples is None
        elif seg.forward_samples is None:
            seg.forward_samples = samples
            self.wants_batch = samples is None
        if autocast is not None:
            seg.autocast = bool(seg.autocast) or autocast

    def forward_exit(self, now: float, grad_enabled: bool) -> None:
        regions = self._regions
        if regions == _FORWARD_ONLY:
            regions.pop()
            seg = self.segment
            seg.compute += now - self._region_t0  # a monotonic clock: never negative
            self.outside_since = now
            if not grad_enabled and seg.t_start is not None:
                self._mark(seg, now)
            return
        self.compute_exit(now, "forward")
        if not regions and not grad_enabled and self.segment.t_start is not None:
            self._mark(self.segment, now)

    @staticmethod
    def _mark(seg: Segment, now: float) -> None:
        """Note the segment's state at the end of a gradient-free outermost forward call."""
        seg.mark = Mark(
            now, seg.loader_wait, seg.fetches, seg.loader_samples, seg.compute, seg.compute_seen
        )

    # --- data ----------------------------------------------------------------------------

    def loader_enter(self, now: float) -> None:
        """A DataLoader ``__next__`` begins (the loader hook sets :attr:`loader_since` itself)."""
        self.loader_since = now

    def loader_exit(self, now: float, samples: int | None, fetched: bool) -> bool:
        """A DataLoader ``__next__`` returned (``fetched``) or ended the epoch.

        Returns whether the step has now fetched more than :attr:`fetch_limit`
        batches: the compute hooks should come on before the batch is used."""
        start = self.loader_since
        if start is None:
            return False
        self.loader_since = None
        wait = now - start  # a monotonic clock: never negative
        self.work += 1
        seg = self.segment
        if seg.t_start is None:  # the wait began the step
            seg.t_start = start
        if self.listener is not None and not self.detail and seg.start_marker is None:
            # No compute hook will take the CUDA marker: the batch's arrival starts the step.
            seg.start_marker = self.listener.segment_started()
        seg.loader_wait += wait
        if self._regions:
            # Fetched inside a compute region (a closure): not compute time.
            seg.compute -= wait
        if fetched:
            fetches = seg.fetches = seg.fetches + 1
            if samples is not None:
                ls = seg.loader_samples
                seg.loader_samples = samples if ls is None else ls + samples
            return fetches > self.fetch_limit
        return False

    @property
    def loader_wait_started(self) -> float | None:
        """When the current loader wait began, or ``None`` when not waiting."""
        return self.loader_since

    # --- boundaries ------------------------------------------------------------------------

    def optimizer_enter(self, now: float) -> None:
        self.gap = None
        regions = self._regions
        if regions:  # a region left open, or a step inside a region: rare
            self.compute_enter(now, "optimizer")
        else:
            self.work += 1
            self._region_t0 = now
            regions.append("optimizer")
            seg = self.segment
            if not seg.compute_seen:
                self._first_compute(seg, now)
        self.wants_batch = self.segment.optimizer_forward_samples is None

    def optimizer_exit(self, now: float, optimizer: object) -> None:
        """The post-step hook of ``optimizer`` (any hashable identity) ran."""
        gap = self.gap
        if gap is not None:
            if gap.close(self, now, optimizer):
                return  # a gap step (see the module doc)
            self.gap = None
        regions = self._regions
        if regions:
            if regions == _OPTIMIZER_ONLY:
                regions.pop()
                self.segment.compute += now - self._region_t0  # a monotonic clock: never negative
                self.outside_since = now
            else:
                self.compute_exit(now, "optimizer")
                if "optimizer" in regions:
                    return  # a nested optimizer step
        # else: no region open - the pre-step hook is off (trainmedic.probe.detail)
        if self.compiled_lead and optimizer == self._lead:
            # Its hook runs again, so its step is no longer compiled: its steps end
            # here from now on. This one already ended at its backward call.
            self._compiled.discard(optimizer)
            self.compiled_lead = False
            return
        mode = self.mode
        if mode != "optimizer":
            if mode == "api":
                self.wants_batch = self.segment.forward_samples is None
                return
            self.mode = "optimizer"
        lead = self._lead
        if optimizer != lead:
            if lead is None:
                self._lead = optimizer
            else:
                count = self._others.get(optimizer, 0) + 1
                self._others[optimizer] = count
                if count < LEAD_TAKEOVER:
                    self.wants_batch = self.segment.forward_samples is None
                    return
                self._lead = optimizer
                self.compiled_lead = False  # a lead whose hook runs is not compiled
        if self._others:
            self._others.clear()
        self._close(now, "optimizer")

    def optimizer_compiled(self, now: float, optimizer: object) -> None:
        """``torch.compile`` is tracing a step of ``optimizer`` (its post-step hook): the
        step ends now, as its hook would have ended it; the optimizer's next steps run
        in compiled code, without hooks. Dynamo may trace one region more than once
        (a restart, a recompilation): only the first trace ends a step."""
        self.gap = None
        if optimizer in self._compiled:
            return
        self.optimizer_exit(now, optimizer)
        self._compiled.add(optimizer)
        self.compiled_lead = self._lead in self._compiled

    def backward_enter(self, now: float) -> None:
        self.gap = None
        regions = self._regions
        if not regions:
            self.work += 1
            self._region_t0 = now
            seg = self.segment
            if not seg.compute_seen:
                self._first_compute(seg, now)
        regions.append("backward")

    def backward_exit(self, now: float) -> None:
        regions = self._regions
        if regions == _BACKWARD_ONLY:
            regions.pop()  # compute_exit's common case, inline
            self.segment.compute += now - self._region_t0  # a monotonic clock: never negative
            self.outside_since = now
        else:
            self.compute_exit(now, "backward")
            if regions:
                return
        mode = self.mode
        if mode == "optimizer":
            if self.compiled_lead:  # the lead's steps run in compiled code, unseen
                self._close(now, "backward")
            return
        if mode == "api":
            return
        if mode == "backward":
            self._close(now, "backward")
            return
        seg = self.segment
        seg.begin(now)
        self._held.append(seg)
        self._new_segment(now)
        first = self._held[0].t_start
        elapsed = now - first if first is not None else 0.0
        if len(self._held) >= HOLD_MAX_SEGMENTS or (
            len(self._held) >= HOLD_MIN_SEGMENTS and elapsed >= HOLD_MAX_S
        ):
            self.mode = "backward"
            self._release_held(now)

    def api_step(self, now: float) -> None:
        """``trainmedic.step()``: the script marks the end of a step itself."""
        self.gap = None
        first = self.mode != "api"
        self.mode = "api"
        seg = self.segment
        idle = not self._held and not seg.compute_seen and not seg.fetches
        just_ended = seg.t_start is not None and now - seg.t_start < _SAME_MOMENT_S
        if first and self.started and idle and just_ended:
            # Called right after a step the hooks already ended: no empty step.
            return
        self._close(now, "api")

    def _release_held(self, now: float) -> None:
        held, self._held = self._held, []
        for i, seg in enumerate(held):
            end = held[i + 1].t_start if i + 1 < len(held) else self.segment.t_start
            self._finish(seg, end if end is not None else now, "backward", self.phase)

    def _close(self, now: float, source: str) -> None:
        seg = self.segment
        if self._held:
            seg = merge([*self._held, seg])
            self._held = []
        if seg.t_start is None:
            seg.t_start = now
        self.segment = new = Segment()
        new.t_start = now
        if not self.detail:
            new.partial = True
        self.wants_batch = True
        phases = self._phases
        if phases:
            phase = phases[-1].name
            phases[-1].steps_inside += 1
        else:
            phase = TRAIN
        if (
            seg.mark is not None
            and source == "optimizer"
            and phase == TRAIN
            and self._is_eval(seg)
        ):
            eval_part, seg = self._split(seg, seg.mark)
            self._finish(eval_part, seg.t_start or now, "optimizer", EVAL)
        elif not seg.partial:  # a partial segment did not count its forward calls
            self._nograd_history.append(seg.nograd_forwards)
        # _finish, inline: this runs at every step's end.
        by_phase = self.steps_by_phase
        number = by_phase.get(phase, 0) + 1
        by_phase[phase] = number
        self.emit(make_draft((number, phase, source, now, seg)))

    def _is_eval(self, seg: Segment) -> bool:
        if seg.mark is None or seg.nograd_forwards < EVAL_MIN_FORWARDS:
            return False
        usual = statistics.median(self._nograd_history) if self._nograd_history else 0.0
        return seg.nograd_forwards > EVAL_FACTOR * usual

    @staticmethod
    def _split(seg: Segment, mark: Mark) -> tuple[Segment, Segment]:
        """(evaluation part up to ``mark``, train part after it).

        Only a forward hook sets a mark, and hooks switched on stay on to the
        step's end: the part after the mark is never partial."""
        before = Segment.of(
            t_start=seg.t_start,
            loader_wait=mark.loader_wait,
            fetches=mark.fetches,
            loader_samples=mark.loader_samples,
            compute=mark.compute,
            compute_seen=mark.compute_seen,
            nograd_forwards=seg.nograd_forwards,
            start_marker=seg.start_marker,
            partial=seg.partial,
        )
        after = Segment.of(
            t_start=mark.t,
            loader_wait=seg.loader_wait - mark.loader_wait,
            fetches=seg.fetches - mark.fetches,
            loader_samples=(
                None
                if seg.loader_samples is None
                else seg.loader_samples - (mark.loader_samples or 0)
            ),
            compute=seg.compute - mark.compute,
            compute_seen=seg.compute_seen,
            forward_samples=seg.forward_samples,
            optimizer_forward_samples=seg.optimizer_forward_samples,
            autocast=seg.autocast,
        )
        return before, after

    def _finish(self, seg: Segment, t_end: float, source: str, phase: str) -> None:
        # ``seg`` is never changed again: the draft works its times out from it later.
        by_phase = self.steps_by_phase
        number = by_phase.get(phase, 0) + 1
        by_phase[phase] = number
        self.emit(make_draft((number, phase, source, t_end, seg)))

    def arm_gap(
        self,
        left: int,
        last_end: float,
        long_s: float,
        out: Any,
        limit: int,
        make: Callable[[object, int, float, float, Any], GapSteps] | None = None,
    ) -> GapSteps | None:
        """Let :meth:`optimizer_exit` close up to ``left`` next steps by itself (see
        :class:`GapSteps` for the arguments), when they can only end the way it
        closes them: steps counted by the lead optimizer's hook, nothing open, no
        phase, no CUDA marker to take and the compute hooks off; no more of them
        than ``out`` has room for below ``limit`` drafts now (the probe's thread
        only drains it meanwhile). ``make(lead, left, last_end, long_s, out)`` builds
        what closes them (``None``: :class:`GapSteps`; or a ring's
        :meth:`~trainmedic.probe.steprings.RingSteps.gap`). Returns what was armed,
        or ``None``."""
        left = min(left, limit - len(out))
        if (
            left <= 0
            or self.mode != "optimizer"
            or self.detail
            or self.compiled_lead
            or self.listener is not None
            or self._lead is None
            or self._regions
            or self._held
            or self._phases
            or self._others
            or TRAIN not in self.steps_by_phase
            or not self.segment.partial
        ):
            return None
        self.gap = gap = (make or GapSteps)(self._lead, left, last_end, long_s, out)
        return gap

    # --- phases ------------------------------------------------------------------------------

    def phase_enter(self, now: float, name: str) -> None:
        """``trainmedic.phase(name)`` begins: its time leaves the step around it."""
        self.gap = None
        self._phases.append(_Phase(name=name, t_start=now, outer=self.segment))
        self._new_segment(now)

    def phase_exit(self, now: float) -> None:
        self.gap = None
        if not self._phases:
            return
        ph = self._phases[-1]
        if ph.steps_inside == 0:
            self._finish(self.segment, now, "api", ph.name)
        self._phases.pop()
        outer = ph.outer
        if outer.t_start is not None:
            outer.excluded += max(0.0, now - ph.t_start)
        if self._phases:
            self._phases[-1].steps_inside += 1
        self.segment = outer
        self.wants_batch = outer.forward_samples is None

    # --- the end -------------------------------------------------------------------------------

    def finish(self, now: float) -> None:
        """The process is ending: emit what can still be told apart."""
        self.gap = None
        while self._phases:
            self.phase_exit(now)
        if self._held and self.mode is None:
            self.mode = "backward"
            self._release_held(now)
        seg = self.segment
        if self.mode == "optimizer" and self._is_eval(seg) and seg.mark is not None:
            eval_part, _ = self._split(seg, seg.mark)
            self._finish(eval_part, seg.mark.t, "optimizer", EVAL)
        self._new_segment(None)
