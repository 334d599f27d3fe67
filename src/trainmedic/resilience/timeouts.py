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
- **Learned**: ``max(120 s, 5 × p99)`` of the last 1024 step intervals (the
  maximum while fewer than 100 are known).
- **Pauses**: an interval longer than 10 × the median and 5 s (an evaluation
  or a checkpoint between steps) is learned as a pause, not a step. When the
  step number where a silence begins fits the spacing of earlier pauses
  (within 2 %), the bound is at least 2 × the longest pause seen.
- **Marked phases** (``eval``, ``checkpoint``, ... from the probe): at least
  1800 s, or 2 × the longest time that phase took before.
- **Progress**: past the bound, a silence continues as long as progress keeps
  coming (the stack moves, at least 1 MiB of I/O, or — when the stack is not
  known — CPU above 5 % of a core), each sign of life restarting the bound,
  up to 7200 s after the last step. No progress at all: the hang is declared
  at the bound.
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

TRAIN_PHASE = "train"


@dataclass(frozen=True)
class TimeoutConfig:
    """Knobs of the step timeout; seconds unless the name says otherwise.

    Attributes:
        startup_s: bound until the first step and during warm-up.
        fixed_s: ``--timeout``: a fixed step bound instead of the learned one.
        floor_s: the learned bound is never below this.
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
        progress_cap_s: a silence with progress is allowed this long after the
            last step at most.
        progress_io_bytes: I/O between two progress samples that counts as progress.
        progress_cpu_share: CPU seconds per second counting as progress when the
            stack is unknown.
        retry_growth / max_growth: bounds grow by ``retry_growth`` per restart,
            up to ``max_growth`` times the first attempt's.
    """

    startup_s: float = 1800.0
    fixed_s: float | None = None
    floor_s: float = 120.0
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
    progress_io_bytes: int = 1024 * 1024
    progress_cpu_share: float = 0.05
    retry_growth: float = 1.5
    max_growth: float = 4.0

    def __post_init__(self) -> None:
        positive = {
            "startup_s": self.startup_s,
            "floor_s": self.floor_s,
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
        extended: progress evidence moved the deadline past ``bound_s``.
        reason: one line for a person.
    """

    hung: bool
    basis: str
    bound_s: float
    deadline: float
    silent_s: float
    quiet_s: float
    extended: bool
    reason: str


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
        self._last_progress_sample_t: float | None = None

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

    def observe_phase(self, t: float, phase: str) -> None:
        """The probe marked the start of ``phase`` (``train`` ends a marked phase)."""
        if phase == self._phase:
            return
        if self._phase != TRAIN_PHASE:
            self._end_phase(t)
        if phase != TRAIN_PHASE:
            self._phase = phase
            self._phase_since = t
            # A step interval that contains a marked phase is not a step's duration.
            self._interval_tainted = True

    def observe_progress(
        self,
        t: float,
        *,
        cpu_s: float | None = None,
        io_bytes: int | None = None,
        stack_changed: bool | None = None,
    ) -> bool:
        """Progress evidence since the previous sample; return whether it counts.

        Args:
            cpu_s: CPU seconds the job's processes used since the previous sample.
            io_bytes: bytes they read and wrote since the previous sample.
            stack_changed: whether the main thread's stack differs from the
                previous sample (``None``: unknown).

        A moving stack or real I/O is progress. CPU alone counts only when the
        stack is unknown: a thread spinning in place burns CPU on one stack.
        """
        since = self._last_progress_sample_t
        self._last_progress_sample_t = t
        cfg = self.config
        progress = bool(stack_changed) or (io_bytes or 0) >= cfg.progress_io_bytes
        if not progress and stack_changed is None and cpu_s is not None and since is not None:
            elapsed = t - since
            progress = elapsed > 0 and cpu_s / elapsed >= cfg.progress_cpu_share
        if progress:
            self._last_progress_t = t
        return progress

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
        quiet_anchor = anchor
        if basis != "fixed" and self._last_progress_t is not None:
            quiet_anchor = max(anchor, self._last_progress_t)
        deadline = quiet_anchor + bound
        if basis != "fixed":
            deadline = min(deadline, anchor + max(bound, cfg.progress_cap_s))
        extended = deadline > anchor + bound
        hung = now >= deadline
        silent = now - anchor
        if hung and extended:
            reason = f"progress stopped {now - quiet_anchor:.0f} s ago"
            if quiet_anchor + bound > deadline:
                reason = f"progress without a step for {silent:.0f} s, the cap"
        elif hung:
            reason = f"no step and no progress for {silent:.0f} s"
        else:
            reason = f"{deadline - now:.0f} s left"
        reason += f" (bound {bound:.0f} s, {basis})"
        return TimeoutVerdict(
            hung=hung,
            basis=basis,
            bound_s=bound,
            deadline=deadline,
            silent_s=silent,
            quiet_s=now - quiet_anchor,
            extended=extended,
            reason=reason,
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
