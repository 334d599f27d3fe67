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

DEFAULT_MAX_RESTARTS = 3
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
            run's start when the job resumes from checkpoints (else within the
            attempt); ``None`` when unknown.
        remedies: names of the remedies it ran with.
    """

    number: int
    classification: Classification
    duration_s: float
    steps_reached: int | None = None
    remedies: tuple[str, ...] = ()

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
    """Stop once ``max_restarts`` restarts have been done (``--max-restarts``)."""

    max_restarts: int

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be >= 0, got {self.max_restarts}")

    def __call__(self, state: RestartState) -> str | None:
        if state.restarts >= self.max_restarts:
            return (
                f"restarted {state.restarts} times, the limit (--max-restarts {self.max_restarts})"
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
    """Stop when the last ``times`` attempts all hung at the same location.

    A hang in the same place every time is a deadlock, not bad luck.
    """

    times: int = 2

    def __call__(self, state: RestartState) -> str | None:
        recent = state.attempts[-self.times :]
        if len(recent) < self.times:
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


# ------------------------------------------------------------------------ wait


class WaitStrategy(ABC):
    """Seconds to wait before the next attempt."""

    @abstractmethod
    def __call__(self, state: RestartState) -> float: ...

    def __add__(self, other: WaitStrategy) -> WaitStrategy:
        return _WaitSum((self, other))


@dataclass(frozen=True)
class _WaitSum(WaitStrategy):
    parts: tuple[WaitStrategy, ...]

    def __call__(self, state: RestartState) -> float:
        return sum(p(state) for p in self.parts)


@dataclass(frozen=True)
class wait_none(WaitStrategy):
    def __call__(self, state: RestartState) -> float:
        return 0.0


@dataclass(frozen=True)
class wait_fixed(WaitStrategy):
    seconds: float

    def __call__(self, state: RestartState) -> float:
        return self.seconds


@dataclass(frozen=True)
class wait_exponential(WaitStrategy):
    """``initial × base^k`` seconds before restart k+1 (k = restarts done), at most ``cap``."""

    initial: float = 5.0
    base: float = 2.0
    cap: float = 120.0

    def __call__(self, state: RestartState) -> float:
        exponent = min(state.restarts, 64)  # keeps base**exponent finite
        return float(min(self.cap, self.initial * self.base**exponent))


class wait_random_jitter(WaitStrategy):
    """A uniform random 0..``max_s`` seconds, so that many jobs do not restart in step."""

    def __init__(self, max_s: float, rng: random.Random | None = None) -> None:
        self.max_s = max_s
        self.rng = rng or random.Random()

    def __call__(self, state: RestartState) -> float:
        return self.rng.uniform(0.0, self.max_s)


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
    max_restarts: int = DEFAULT_MAX_RESTARTS, max_total_s: float | None = None
) -> StopStrategy:
    """``stop_after_restarts(n) | stop_on_repeated_hang(2) | stop_on_no_progress(3)``,
    ``| stop_after_time(s)`` when a budget is given."""
    stop: StopStrategy = stop_after_restarts(max_restarts) | stop_on_repeated_hang(2)
    stop = stop | stop_on_no_progress(3)
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
    wait: WaitStrategy = field(
        default_factory=lambda: wait_exponential(5.0, 2.0, 120.0) + wait_random_jitter(5.0)
    )
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
        reason = f"restart {state.restarts + 1} after {fc.value} in {wait_s:.0f} s"
        if remedies:
            reason += f" with {', '.join(r.name for r in remedies)}"
        return Decision(True, wait_s, reason, remedies)


def default_retry(retry_on_exception: bool = False) -> RetryStrategy:
    """Everything but a bug, a bad command, an outside stop and a program's own
    non-zero exit; ``retry_on_exception`` restarts after the last two as well."""
    if retry_on_exception:
        return retry_unless_class(FailureClass.BAD_COMMAND, FailureClass.PREEMPTED)
    return retry_unless_class(*NOT_RETRIED_BY_DEFAULT) & retry_unless_own_exit()


def default_wait(initial_s: float = 5.0, rng: random.Random | None = None) -> WaitStrategy:
    """``initial_s`` doubling per restart up to 120 s, plus up to ``min(initial_s, 5)``
    seconds of jitter (none when ``initial_s`` is 0)."""
    if initial_s < 0:
        raise UsageError(f"the backoff must be >= 0 seconds, got {initial_s}")
    wait: WaitStrategy = wait_exponential(initial_s, 2.0, max(120.0, initial_s))
    jitter = min(initial_s, 5.0)
    if jitter > 0:
        wait = wait + wait_random_jitter(jitter, rng)
    return wait


def default_policy(
    *,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    max_total_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    retry_on_exception: bool = False,
    backoff_s: float = 5.0,
) -> RestartPolicy:
    """The policy of ``trainmedic run``: ``--max-restarts`` (3) and an optional time budget,
    no restart after a bug, a bad command, an outside stop or a program's own non-zero
    exit (unless ``retry_on_exception``), ``backoff_s`` (5 s) doubling to 120 s plus up
    to 5 s of jitter, cause-aware remedies."""
    return RestartPolicy(
        stop=default_stop(max_restarts, max_total_s),
        retry=default_retry(retry_on_exception),
        wait=default_wait(backoff_s, rng),
        remedies=plan_state_remedies,
        sleep=sleep,
    )
