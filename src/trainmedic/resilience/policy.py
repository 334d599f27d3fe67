"""The restart policy: small composable strategies over one state object.

Modelled on tenacity: every strategy is a pure function of a
:class:`RestartState` (the history of the run's attempts), and strategies
combine with operators:

    stop  = stop_after_restarts(3) | stop_after_time(6 * 3600)
    retry = retry_unless_class(FailureClass.USER_EXCEPTION, FailureClass.BAD_COMMAND)
    wait  = wait_exponential(initial=5, cap=120) + wait_random_jitter(5)
    policy = RestartPolicy(stop=stop, retry=retry, wait=wait)
    decision = policy.decide(state, classification)
    policy.sleep(decision.wait_s)

``stop`` strategies return the reason to stop (or ``None``) and combine with
``|`` (either stops) and ``&`` (both must); ``retry`` strategies say whether a
failure class is worth a restart and combine with ``|`` and ``&``; ``wait``
strategies return seconds and add up with ``+``. ``sleep`` is a constructor
argument, so tests record waits instead of sleeping. The defaults are in
:func:`default_policy` and docs/restarts.md, "Restart policy".
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from trainmedic.errors import UsageError
from trainmedic.findings.model import Category
from trainmedic.resilience.classify import Classification, FailureClass, GpuRef
from trainmedic.resilience.remedies import Remedy, apply_remedies, plan_remedies
from trainmedic.resilience.waits import (
    WaitStrategy,
    default_wait,
    points_outside,
    wait_after_failures,
    wait_exponential,
    wait_fixed,
    wait_none,
    wait_random_jitter,
)

__all__ = [
    "WaitStrategy",
    "default_wait",
    "points_outside",
    "wait_after_failures",
    "wait_exponential",
    "wait_fixed",
    "wait_none",
    "wait_random_jitter",
]

DEFAULT_MAX_RESTARTS = 3
"""Consecutive failures without progress given a restart (``--max-restarts``)."""
PROGRESS_MIN_S = 10.0
"""An attempt that trained this many seconds beyond the furthest step before made
progress: it resets the failure count and the backoff."""
NOT_RETRIED_BY_DEFAULT = (
    FailureClass.USER_EXCEPTION,
    FailureClass.BAD_COMMAND,
    FailureClass.PREEMPTED,
)
"""A bug fails the same way again; a bad command never runs; a job stopped from
outside was stopped on purpose."""


# ----------------------------------------------------------------------- state


@dataclass(frozen=True)
class AttemptRecord:
    """One finished attempt.

    Attributes:
        number: 1-based attempt number.
        classification: how it ended.
        duration_s: how long it ran, seconds.
        steps_reached: the highest training step it reached, counted from the
            run's start (the first attempt's, or a later one's whose resume step
            is known); ``None`` when unknown.
        remedies: names of the remedies it ran with.
        trained_s: seconds from its first step's start to its last step's end
            (``None``: no step seen).
    """

    number: int
    classification: Classification
    duration_s: float
    steps_reached: int | None = None
    remedies: tuple[str, ...] = ()
    trained_s: float | None = None

    @property
    def hang_location(self) -> str | None:
        if self.classification.failure_class is FailureClass.HANG:
            return self.classification.location
        return None


@dataclass(frozen=True)
class RestartState:
    """What the policy knows when an attempt has ended.

    Attributes:
        started_at: supervisor clock (monotonic seconds) when the first attempt started.
        now: supervisor clock now.
        attempts: finished attempts, oldest first; the last is the one just ended.
        env: the environment the last attempt ran with (remedies transform it).
        gpus: the machine's GPUs, for remedies that rewrite ``CUDA_VISIBLE_DEVICES``.
        torch_version: the job's torch version, when known.
    """

    started_at: float
    now: float
    attempts: tuple[AttemptRecord, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GpuRef, ...] = ()
    torch_version: str | None = None

    @property
    def attempt_number(self) -> int:
        """Attempts run so far."""
        return len(self.attempts)

    @property
    def restarts(self) -> int:
        """Restarts done so far (attempts after the first)."""
        return max(0, len(self.attempts) - 1)

    def made_progress(self, index: int) -> bool:
        """Whether attempt ``index`` (0-based) trained for a while: at least
        :data:`PROGRESS_MIN_S` of steps and, when the run's step is known, further
        than every earlier attempt got; without any step seen, it ran that long.
        (A job whose resume step trainmedic cannot know — no Checkpointer, no
        ``--checkpoint-glob`` — is taken at its word that it resumes: set
        ``--max-total-restarts`` to cap one that starts over each time.)"""
        attempt = self.attempts[index]
        if attempt.trained_s is None:
            return attempt.steps_reached is None and attempt.duration_s >= PROGRESS_MIN_S
        if attempt.trained_s < PROGRESS_MIN_S:
            return False
        if attempt.steps_reached is None:
            return True
        best = max(
            (a.steps_reached for a in self.attempts[:index] if a.steps_reached is not None),
            default=0,
        )
        return attempt.steps_reached > best

    @property
    def failures_without_progress(self) -> int:
        """Consecutive failures since the last attempt that made progress, the
        latest included: 1 after an attempt that trained for a while and then
        failed, 2 when the next one fails without getting anywhere, ..."""
        count = 0
        for index in range(len(self.attempts) - 1, -1, -1):
            count += 1
            if self.made_progress(index):
                break
        return count

    @property
    def elapsed_s(self) -> float:
        return self.now - self.started_at

    @property
    def class_counts(self) -> Counter[FailureClass]:
        return Counter(a.classification.failure_class for a in self.attempts)

    @property
    def last(self) -> AttemptRecord | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def last_classification(self) -> Classification | None:
        return self.attempts[-1].classification if self.attempts else None

    def with_attempt(self, attempt: AttemptRecord, now: float) -> RestartState:
        """The state after ``attempt`` ended at ``now``."""
        return replace(self, attempts=(*self.attempts, attempt), now=now)


# ------------------------------------------------------------------------ stop


class StopStrategy(ABC):
    """Whether to stop restarting: the reason, or ``None`` to go on."""

    @abstractmethod
    def __call__(self, state: RestartState) -> str | None: ...

    def __or__(self, other: StopStrategy) -> StopStrategy:
        return _StopAny((self, other))

    def __and__(self, other: StopStrategy) -> StopStrategy:
        return _StopAll((self, other))


@dataclass(frozen=True)
class _StopAny(StopStrategy):
    parts: tuple[StopStrategy, ...]

    def __call__(self, state: RestartState) -> str | None:
        return next((r for p in self.parts if (r := p(state)) is not None), None)


@dataclass(frozen=True)
class _StopAll(StopStrategy):
    parts: tuple[StopStrategy, ...]

    def __call__(self, state: RestartState) -> str | None:
        reasons = [p(state) for p in self.parts]
        if all(r is not None for r in reasons):
            return " and ".join(r for r in reasons if r)
        return None


@dataclass(frozen=True)
class stop_after_restarts(StopStrategy):
    """Stop once ``max_restarts`` restarts have been done in all, progress or not
    (``--max-total-restarts``; torchrun's ``--max-restarts`` counts the same way)."""

    max_restarts: int

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise UsageError(f"--max-total-restarts must be >= 0, got {self.max_restarts}")

    def __call__(self, state: RestartState) -> str | None:
        if state.restarts >= self.max_restarts:
            return (
                f"restarted {state.restarts} times, the limit "
                f"(--max-total-restarts {self.max_restarts})"
            )
        return None


@dataclass(frozen=True)
class stop_after_failures_without_progress(StopStrategy):
    """Stop when ``max_failures`` attempts in a row failed without progress
    (``--max-restarts``): ``max_failures`` restarts are given to a job that
    gets nowhere, and any number to one that keeps training between faults."""

    max_failures: int

    def __post_init__(self) -> None:
        if self.max_failures < 0:
            raise UsageError(f"--max-restarts must be >= 0, got {self.max_failures}")

    def __call__(self, state: RestartState) -> str | None:
        failures = state.failures_without_progress
        if failures > self.max_failures:
            return (
                f"{failures} failures in a row without progress "
                f"(--max-restarts {self.max_failures})"
            )
        return None


@dataclass(frozen=True)
class stop_after_time(StopStrategy):
    """Stop once the run has used ``seconds`` since its first attempt started."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise UsageError(f"the restart time budget must be > 0 seconds, got {self.seconds}")

    def __call__(self, state: RestartState) -> str | None:
        if state.elapsed_s >= self.seconds:
            return f"the run used {state.elapsed_s:.0f} s of its {self.seconds:.0f} s budget"
        return None


@dataclass(frozen=True)
class stop_on_repeated_hang(StopStrategy):
    """Stop when the last ``times`` attempts all hung at the same location and
    none after the first of them made progress.

    A hang in the same place every time, with nothing gained in between, is a
    deadlock, not bad luck.
    """

    times: int = 2

    def __call__(self, state: RestartState) -> str | None:
        recent = state.attempts[-self.times :]
        if len(recent) < self.times:
            return None
        n = len(state.attempts)
        if any(state.made_progress(i) for i in range(n - self.times + 1, n)):
            return None
        locations = {a.hang_location for a in recent}
        if len(locations) == 1 and None not in locations:
            return f"hung {self.times} times in a row at {recent[-1].hang_location}: a deadlock"
        return None


@dataclass(frozen=True)
class stop_on_no_progress(StopStrategy):
    """Stop when the last ``attempts`` attempts each failed to get further than before.

    An attempt made progress when it reached a higher step than every earlier
    attempt (the first: any step). Attempts whose steps are unknown say nothing.
    """

    attempts: int = 3

    def __call__(self, state: RestartState) -> str | None:
        if len(state.attempts) < self.attempts:
            return None
        best = 0
        stalled: list[bool | None] = []
        for a in state.attempts:
            if a.steps_reached is None:
                stalled.append(None)
                continue
            stalled.append(a.steps_reached <= best)
            best = max(best, a.steps_reached)
        recent = stalled[-self.attempts :]
        if all(s is True for s in recent):
            return f"{self.attempts} attempts in a row got no further than step {best}"
        return None


@dataclass(frozen=True)
class stop_never(StopStrategy):
    def __call__(self, state: RestartState) -> str | None:
        return None


# ----------------------------------------------------------------------- retry


class RetryStrategy(ABC):
    """Whether a failure is worth a restart at all."""

    @abstractmethod
    def __call__(self, state: RestartState, c: Classification) -> bool: ...

    @abstractmethod
    def describe(self) -> str: ...

    def __or__(self, other: RetryStrategy) -> RetryStrategy:
        return _RetryAny((self, other))

    def __and__(self, other: RetryStrategy) -> RetryStrategy:
        return _RetryAll((self, other))


@dataclass(frozen=True)
class _RetryAny(RetryStrategy):
    parts: tuple[RetryStrategy, ...]

    def __call__(self, state: RestartState, c: Classification) -> bool:
        return any(p(state, c) for p in self.parts)

    def describe(self) -> str:
        return " | ".join(p.describe() for p in self.parts)


@dataclass(frozen=True)
class _RetryAll(RetryStrategy):
    parts: tuple[RetryStrategy, ...]

    def __call__(self, state: RestartState, c: Classification) -> bool:
        return all(p(state, c) for p in self.parts)

    def describe(self) -> str:
        return " & ".join(p.describe() for p in self.parts)


class retry_if_class(RetryStrategy):
    """Restart only after these failure classes."""

    def __init__(self, *classes: FailureClass) -> None:
        self.classes = frozenset(classes)

    def __call__(self, state: RestartState, c: Classification) -> bool:
        return c.failure_class in self.classes

    def describe(self) -> str:
        return f"retry_if_class({', '.join(sorted(c.value for c in self.classes))})"


class retry_unless_class(RetryStrategy):
    """Restart after any failure class but these."""

    def __init__(self, *classes: FailureClass) -> None:
        self.classes = frozenset(classes)

    def __call__(self, state: RestartState, c: Classification) -> bool:
        return c.failure_class not in self.classes

    def describe(self) -> str:
        return f"retry_unless_class({', '.join(sorted(c.value for c in self.classes))})"


@dataclass(frozen=True)
class retry_at_most(RetryStrategy):
    """Restart after ``failure_class`` at most ``times`` times (other classes pass)."""

    failure_class: FailureClass
    times: int

    def __call__(self, state: RestartState, c: Classification) -> bool:
        if c.failure_class is not self.failure_class:
            return True
        return state.class_counts[self.failure_class] <= self.times

    def describe(self) -> str:
        return f"retry_at_most({self.failure_class.value}, {self.times})"


class retry_unless_own_exit(RetryStrategy):
    """No restart after a process ended itself with a non-zero status and nothing
    else to explain it: no signal, no error message, no hang (``sys.exit(3)``,
    ``exit 1`` in a shell script). The program decided to fail; a restart would
    decide the same. Every other class passes."""

    def __call__(self, state: RestartState, c: Classification) -> bool:
        return not is_own_exit(c)

    def describe(self) -> str:
        return "retry_unless_own_exit()"


def is_own_exit(c: Classification) -> bool:
    """An ``unknown`` failure that is only a non-zero exit status (see
    :class:`retry_unless_own_exit`)."""
    return (
        c.failure_class is FailureClass.UNKNOWN
        and c.signal is None
        and (c.exit_code or 0) > 0
        and c.category is Category.TIMEOUT
    )


# ---------------------------------------------------------------------- policy


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt ended.

    Attributes:
        restart: start another attempt.
        wait_s: seconds to wait first.
        reason: one line for the log and the report.
        remedies: changes for the next attempt, each with its reason.
    """

    restart: bool
    wait_s: float
    reason: str
    remedies: tuple[Remedy, ...] = ()

    def next_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The next attempt's environment: ``env`` with the remedies applied."""
        return apply_remedies(env, self.remedies)


RemedyPlanner = Callable[[RestartState, Classification], Sequence[Remedy]]


def plan_state_remedies(state: RestartState, c: Classification) -> Sequence[Remedy]:
    """The default planner: :func:`~trainmedic.resilience.remedies.plan_remedies`."""
    return plan_remedies(c, state.env, gpus=state.gpus, torch_version=state.torch_version)


def default_stop(
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    max_total_s: float | None = None,
    max_total_restarts: int | None = None,
) -> StopStrategy:
    """``stop_after_failures_without_progress(n) | stop_on_repeated_hang(2)``,
    ``| stop_after_restarts(total)`` and ``| stop_after_time(s)`` when asked for."""
    stop: StopStrategy = stop_after_failures_without_progress(max_restarts)
    stop = stop | stop_on_repeated_hang(2)
    if max_total_restarts is not None:
        stop = stop | stop_after_restarts(max_total_restarts)
    if max_total_s is not None:
        stop = stop | stop_after_time(max_total_s)
    return stop


@dataclass
class RestartPolicy:
    """Decides, after each attempt, whether and how to start the next one.

    Attributes:
        stop: when to give up.
        retry: which failures deserve a restart.
        wait: backoff before the next attempt.
        remedies: picks the remedies for the next attempt.
        sleep: how :meth:`sleep` waits (a seam for tests).
    """

    stop: StopStrategy = field(default_factory=default_stop)
    retry: RetryStrategy = field(
        default_factory=lambda: retry_unless_class(*NOT_RETRIED_BY_DEFAULT)
    )
    wait: WaitStrategy = field(default_factory=lambda: default_wait(5.0))
    remedies: RemedyPlanner = plan_state_remedies
    sleep: Callable[[float], None] = time.sleep

    def decide(self, state: RestartState, classification: Classification) -> Decision:
        """Decide after the attempt ``classification`` describes (the last in ``state``)."""
        fc = classification.failure_class
        if fc is FailureClass.SUCCESS:
            return Decision(False, 0.0, "the job finished")
        if not self.retry(state, classification):
            return Decision(
                False,
                0.0,
                f"{fc.value} is not restarted ({self.retry.describe()}): {classification.why}",
            )
        stop_reason = self.stop(state)
        if stop_reason is not None:
            return Decision(False, 0.0, f"not restarting after {fc.value}: {stop_reason}")
        wait_s = max(0.0, self.wait(state))
        remedies = tuple(self.remedies(state, classification))
        when = f"{wait_s:.1f} s" if wait_s < 10 else f"{wait_s:.0f} s"
        reason = f"restart {state.restarts + 1} after {fc.value} in {when}"
        if remedies:
            reason += f" with {', '.join(r.name for r in remedies)}"
        return Decision(True, wait_s, reason, remedies)


def default_retry(retry_on_exception: bool = False) -> RetryStrategy:
    """Everything but a bug, a bad command, an outside stop and a program's own
    non-zero exit; ``retry_on_exception`` restarts after the last two as well."""
    if retry_on_exception:
        return retry_unless_class(FailureClass.BAD_COMMAND, FailureClass.PREEMPTED)
    return retry_unless_class(*NOT_RETRIED_BY_DEFAULT) & retry_unless_own_exit()


def default_policy(
    *,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    max_total_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    retry_on_exception: bool = False,
    backoff_s: float = 5.0,
    max_total_restarts: int | None = None,
) -> RestartPolicy:
    """The policy of ``trainmedic run``: up to ``max_restarts`` (3) failures in a row
    without progress, an optional total cap and time budget, no restart after a bug,
    a bad command, an outside stop or a program's own non-zero exit (unless
    ``retry_on_exception``); the first restart of a streak at once (with up to
    0.5 s of jitter), then ``backoff_s`` (5 s) doubling to 120 s plus jitter, from
    the first failure on when the cause lies outside the job; cause-aware remedies."""
    return RestartPolicy(
        stop=default_stop(max_restarts, max_total_s, max_total_restarts),
        retry=default_retry(retry_on_exception),
        wait=default_wait(backoff_s, rng),
        remedies=plan_state_remedies,
        sleep=sleep,
    )
