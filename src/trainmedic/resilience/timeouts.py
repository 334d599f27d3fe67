"""The adaptive step timeout: when has a job stopped making progress?

:class:`StepTimeout` is fed timestamped observations by the supervisor's
watchdog — steps, phase marks from the probe, progress evidence (CPU time,
I/O, whether the main thread's stack moved) — and answers :meth:`verdict`
for any ``now``. It never reads a clock itself: the supervisor passes its
monotonic time, tests pass numbers. The rule, with the defaults of
:class:`TimeoutConfig` (docs/restarts.md, "Step timeout"):

- **Startup**: until the first step, 1800 s.
- **Warm-up**: the first 5 step intervals (compilation, cuDNN autotuning,
  allocator growth) stay under the startup bound and are not learned from.
- **Learned**: ``max(floor, 5 × p99)`` of the last 1024 step intervals (the
  maximum while fewer than 100 are known); the floor is 20 s.
- **Evidence** (:mod:`trainmedic.resilience.silence`): past the last step,
  the watchdog classifies the silence a few times a second. *Work* (the job
  computes, reads, writes, flushes) restarts the bound at each sign, up to
  7200 s after the last step; a silence the evidence shows to be a hang
  (*blocked*, *spinning*, *waiting on a peer or the device*, *waiting on an
  external source*) is declared at the learned bound; one the evidence
  cannot classify (*unclear*, or no evidence at all) only at the
  conservative bound ``max(120 s, learned)``.
- **Pauses**: an interval longer than 10 × the median and 5 s (an evaluation
  or a checkpoint between steps) is learned as a pause, not a step. When the
  step number where a silence begins fits the spacing of earlier pauses
  (within 2 %), the bound is at least 2 × the longest pause seen.
- **Marked phases** (``eval``, ``checkpoint``, ... from the probe): at least
  1800 s, or 2 × the longest time that phase took before.
- **Fixed** (``--timeout``): the given bound replaces the learned one, with no
  progress extension.
- **Retries**: every bound is multiplied by ``1.5 ** restarts``, at most 4.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from trainmedic.errors import UsageError
from trainmedic.resilience.silence_evidence import Silence

TRAIN_PHASE = "train"


@dataclass(frozen=True)
class TimeoutConfig:
    """Knobs of the step timeout; seconds unless the name says otherwise.

    Attributes:
        startup_s: bound until the first step and during warm-up.
        fixed_s: ``--timeout``: a fixed step bound instead of the learned one.
        floor_s: the learned bound is never below this (``--timeout-floor``): the
            bound of a silence the evidence shows to be a hang.
        unclear_floor_s: the bound of a silence the evidence cannot classify is
            never below this (``--unclear-timeout``).
        safety_factor: learned bound = ``safety_factor ×`` the high quantile.
        quantile: which quantile of recent step intervals (0.99 = p99).
        min_quantile_samples: below this many intervals the maximum is used.
        warmup_intervals: first step intervals of an attempt not learned from.
        window: how many recent step intervals are kept.
        pause_ratio / pause_min_s: an interval above ``pause_ratio ×`` the median
            and above ``pause_min_s`` is a pause (eval, checkpoint), not a step.
        pause_factor: a pause or marked phase may last this many times its longest
            previous duration.
        phase_s: minimum bound inside a marked phase (``eval``, ``checkpoint``).
        progress_cap_s: a silence with work is allowed this long after the last
            step at most (``--work-cap``).
        retry_growth / max_growth: bounds grow by ``retry_growth`` per restart,
            up to ``max_growth`` times the first attempt's.
    """

    startup_s: float = 1800.0
    fixed_s: float | None = None
    floor_s: float = 20.0
    unclear_floor_s: float = 120.0
    safety_factor: float = 5.0
    quantile: float = 0.99
    min_quantile_samples: int = 100
    warmup_intervals: int = 5
    window: int = 1024
    pause_ratio: float = 10.0
    pause_min_s: float = 5.0
    pause_factor: float = 2.0
    phase_s: float = 1800.0
    progress_cap_s: float = 7200.0
    retry_growth: float = 1.5
    max_growth: float = 4.0

    def __post_init__(self) -> None:
        positive = {
            "startup_s": self.startup_s,
            "floor_s": self.floor_s,
            "unclear_floor_s": self.unclear_floor_s,
            "safety_factor": self.safety_factor,
            "pause_ratio": self.pause_ratio,
            "pause_factor": self.pause_factor,
            "phase_s": self.phase_s,
            "progress_cap_s": self.progress_cap_s,
        }
        if self.fixed_s is not None:
            positive["fixed_s (--timeout)"] = self.fixed_s
        for name, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"timeout setting {name} must be a positive number, got {value}")
        if not 0.5 <= self.quantile <= 1.0:
            raise UsageError(f"timeout quantile must be within 0.5..1, got {self.quantile}")
        if self.retry_growth < 1.0 or self.max_growth < 1.0:
            raise UsageError("timeout growth factors must be >= 1")
        if self.window < 1 or self.warmup_intervals < 0 or self.min_quantile_samples < 1:
            raise UsageError("timeout window and sample counts must be positive")


@dataclass(frozen=True)
class Pause:
    """A long gap between two steps: an evaluation, a checkpoint, a recompile.

    Attributes:
        after_step: the step after which the gap began.
        t: when it began (the end of ``after_step``), supervisor clock seconds.
        duration_s: its length.
        predicted: whether earlier pauses' spacing predicted it.
    """

    after_step: int
    t: float
    duration_s: float
    predicted: bool


@dataclass(frozen=True)
class TimeoutVerdict:
    """The watchdog's answer for one moment.

    Attributes:
        hung: the deadline has passed: declare a hang.
        basis: which bound applies: ``startup``, ``warmup``, ``learned``,
            ``pause``, ``phase:<name>`` or ``fixed``.
        bound_s: that bound, retry growth included.
        deadline: clock time at which the hang is (or will be) declared if
            nothing else arrives.
        silent_s: seconds since the last step, phase mark or the start.
        quiet_s: seconds since the last sign of life (step, mark or progress).
        extended: evidence of work moved the deadline past ``bound_s``.
        reason: one line for a person.
        silence: the latest class of the silence (``work``, ``blocked``,
            ``spinning``, ``peer_wait``, ``source_wait``, ``unclear``), ``None``
            before any evidence or where evidence does not apply.
    """

    hung: bool
    basis: str
    bound_s: float
    deadline: float
    silent_s: float
    quiet_s: float
    extended: bool
    reason: str
    silence: str | None = None


@dataclass
class _Knowledge:
    """What one attempt learned that the next attempt of the same job reuses."""

    intervals: deque[float]
    sorted_intervals: list[float] = field(default_factory=list)
    pauses: deque[Pause] = field(default_factory=lambda: deque(maxlen=32))
    phase_longest_s: dict[str, float] = field(default_factory=dict)


class StepTimeout:
    """The adaptive step timeout of one attempt (see the module docstring).

    Args:
        config: the knobs.
        started_at: when the attempt's process started, on the supervisor's clock.
        restarts: how many restarts preceded this attempt (the growth exponent).
    """

    def __init__(
        self,
        config: TimeoutConfig | None = None,
        *,
        started_at: float,
        restarts: int = 0,
        _knowledge: _Knowledge | None = None,
    ) -> None:
        self.config = config or TimeoutConfig()
        self.started_at = started_at
        self.restarts = restarts
        self._k = _knowledge or _Knowledge(intervals=deque(maxlen=self.config.window))
        self._warmup_left = self.config.warmup_intervals
        self._last_step_t: float | None = None
        self._last_step = 0
        self._phase = TRAIN_PHASE
        self._phase_since: float | None = None
        self._interval_tainted = False
        self._last_progress_t: float | None = None
        self._last_unclear_t: float | None = None
        self._silence: Silence | None = None

    # ------------------------------------------------------------ observations

    def observe_step(self, t: float, step: int | None = None) -> None:
        """A training step ended at ``t``; ``step`` is its number (default: previous + 1)."""
        if self._phase != TRAIN_PHASE:
            self._end_phase(t)
        if self._last_step_t is not None:
            self._learn_interval(t - self._last_step_t)
        self._last_step_t = t
        self._last_step = self._last_step + 1 if step is None else step
        self._interval_tainted = False
        self._silence = None  # a new silence begins: no evidence about it yet

    def observe_phase(self, t: float, phase: str) -> None:
        """The probe marked the start of ``phase`` (``train`` ends a marked phase)."""
        if phase == self._phase:
            return
        if self._phase != TRAIN_PHASE:
            self._end_phase(t)
        self._silence = None
        if phase != TRAIN_PHASE:
            self._phase = phase
            self._phase_since = t
            # A step interval that contains a marked phase is not a step's duration.
            self._interval_tainted = True

    def observe_evidence(self, t: float, silence: Silence, work_at: float | None = None) -> None:
        """The class of the silence over the window ending at ``t``
        (:func:`~trainmedic.resilience.silence.classify_job`); for ``work``,
        ``work_at`` is when it was last seen, when earlier than ``t`` (a heartbeat's
        send time)."""
        self._silence = silence
        if silence is Silence.WORK:
            seen = t if work_at is None else min(t, work_at)
            if self._last_progress_t is None or seen > self._last_progress_t:
                self._last_progress_t = seen
        elif silence is Silence.UNCLEAR:
            self._last_unclear_t = t

    # ----------------------------------------------------------------- verdict

    @property
    def growth(self) -> float:
        """Multiplier applied to every bound on this attempt."""
        return min(self.config.retry_growth**self.restarts, self.config.max_growth)

    @property
    def learned_bound_s(self) -> float | None:
        """The learned step bound without pauses or growth; ``None`` before any interval."""
        values = self._k.sorted_intervals
        if not values:
            return None
        cfg = self.config
        if len(values) < cfg.min_quantile_samples:
            high = values[-1]
        else:
            rank = max(1, math.ceil(cfg.quantile * len(values)))  # nearest-rank quantile
            high = values[rank - 1]
        return max(cfg.floor_s, cfg.safety_factor * high)

    @property
    def pauses(self) -> tuple[Pause, ...]:
        return tuple(self._k.pauses)

    def verdict(self, now: float) -> TimeoutVerdict:
        """Whether the job counts as hung at ``now`` (supervisor clock seconds)."""
        cfg = self.config
        anchor = self.started_at if self._last_step_t is None else self._last_step_t
        if self._phase_since is not None and self._phase_since > anchor:
            anchor = self._phase_since
        basis, bound = self._bound()
        bound *= self.growth
        silence = None
        work_anchor = anchor
        if basis != "fixed" and self._last_progress_t is not None:
            work_anchor = max(anchor, self._last_progress_t)
        if basis in ("learned", "pause"):
            # Evidence decides which bound applies to the silence since the last work.
            silence = self._silence
            unclear_bound = max(bound, cfg.unclear_floor_s * self.growth)
            deadline = work_anchor + unclear_bound
            if silence is not None and silence.hang:
                unclear_t = self._last_unclear_t or anchor
                deadline = min(deadline, max(work_anchor, unclear_t) + bound)
            else:
                bound = unclear_bound
        else:
            deadline = work_anchor + bound
        if basis != "fixed":
            deadline = min(deadline, anchor + max(bound, cfg.progress_cap_s))
        extended = work_anchor > anchor
        hung = now >= deadline
        silent = now - anchor
        what = silence.value.replace("_", " ") if silence is not None else None
        if hung and deadline >= anchor + max(bound, cfg.progress_cap_s) and extended:
            reason = f"work without a step for {silent:.0f} s, the cap"
        elif hung and extended:
            reason = f"work stopped {now - work_anchor:.0f} s ago"
        elif hung:
            reason = f"no step and no work for {silent:.0f} s"
        else:
            reason = f"{deadline - now:.0f} s left"
        if hung and what is not None:
            reason += f", {what}"
        reason += f" (bound {bound:.0f} s, {basis})"
        return TimeoutVerdict(
            hung=hung,
            basis=basis,
            bound_s=bound,
            deadline=deadline,
            silent_s=silent,
            quiet_s=now - work_anchor,
            extended=extended,
            reason=reason,
            silence=None if silence is None else silence.value,
        )

    def for_next_attempt(self, started_at: float) -> StepTimeout:
        """The timeout of the next attempt: one more restart, the same learned knowledge."""
        return StepTimeout(
            self.config, started_at=started_at, restarts=self.restarts + 1, _knowledge=self._k
        )

    # ---------------------------------------------------------------- internals

    def _bound(self) -> tuple[str, float]:
        cfg = self.config
        if self._phase != TRAIN_PHASE:
            longest = self._k.phase_longest_s.get(self._phase, 0.0)
            return f"phase:{self._phase}", max(cfg.phase_s, cfg.pause_factor * longest)
        if self._last_step_t is None:
            return "startup", cfg.startup_s
        if cfg.fixed_s is not None:
            return "fixed", cfg.fixed_s
        learned = self.learned_bound_s
        if self._warmup_left > 0 or learned is None:
            return "warmup", cfg.startup_s
        if self._pause_expected(self._last_step):
            longest = max(p.duration_s for p in self._k.pauses)
            return "pause", max(learned, cfg.pause_factor * longest)
        return "learned", learned

    def _learn_interval(self, interval: float) -> None:
        if self._interval_tainted or interval <= 0:
            return
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return
        k = self._k
        if self._is_pause(interval):
            predicted = self._pause_expected(self._last_step)
            k.pauses.append(Pause(self._last_step, self._last_step_t or 0.0, interval, predicted))
            return
        if len(k.intervals) == k.intervals.maxlen:
            oldest = k.intervals[0]
            del k.sorted_intervals[bisect.bisect_left(k.sorted_intervals, oldest)]
        k.intervals.append(interval)
        bisect.insort(k.sorted_intervals, interval)

    def _is_pause(self, interval: float) -> bool:
        values = self._k.sorted_intervals
        if not values or interval < self.config.pause_min_s:
            return False
        median = values[len(values) // 2]
        return interval > self.config.pause_ratio * median

    def _pause_expected(self, step: int) -> bool:
        """Whether a silence beginning after ``step`` fits the pauses seen so far."""
        pauses = list(self._k.pauses)
        if not pauses:
            return False
        # Pauses that keep arriving unpredicted are irregular: expect one anywhere.
        if len(pauses) >= 3 and not pauses[-1].predicted and not pauses[-2].predicted:
            return True
        spacings = {pauses[0].after_step} | {
            b.after_step - a.after_step for a, b in itertools.pairwise(pauses)
        }
        since = step - pauses[-1].after_step
        if since <= 0:
            return False
        for spacing in spacings:
            if spacing <= 0:
                continue
            tolerance = max(1, round(0.02 * spacing))
            offset = since % spacing
            if min(offset, spacing - offset) <= tolerance and since >= spacing - tolerance:
                return True
        return False

    def _end_phase(self, t: float) -> None:
        if self._phase_since is not None:
            took = t - self._phase_since
            longest = self._k.phase_longest_s
            longest[self._phase] = max(longest.get(self._phase, 0.0), took)
        self._phase = TRAIN_PHASE
        self._phase_since = t
