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

The state is in :mod:`.restart_state`, the strategies in :mod:`.stops`,
:mod:`.retries` and :mod:`.waits`; this module composes them and re-exports
them, so a policy is written from one import.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from trainmedic.resilience.classify import Classification, FailureClass
from trainmedic.resilience.classify.catalogue import CLASSES
from trainmedic.resilience.remedies import Remedy, apply_remedies, plan_remedies
from trainmedic.resilience.restart_state import PROGRESS_MIN_S, AttemptRecord, RestartState
from trainmedic.resilience.retries import (
    RetryStrategy,
    is_own_exit,
    retry_at_most,
    retry_if_class,
    retry_unless_class,
    retry_unless_node_fault,
    retry_unless_own_exit,
)
from trainmedic.resilience.stops import (
    StopStrategy,
    stop_after_failures_without_progress,
    stop_after_restarts,
    stop_after_time,
    stop_never,
    stop_on_no_progress,
    stop_on_repeated_hang,
)
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
    "DEFAULT_MAX_RESTARTS",
    "NOT_RETRIED_BY_DEFAULT",
    "PROGRESS_MIN_S",
    "AttemptRecord",
    "Decision",
    "RestartPolicy",
    "RestartState",
    "RetryStrategy",
    "StopStrategy",
    "WaitStrategy",
    "default_policy",
    "default_retry",
    "default_stop",
    "default_wait",
    "is_own_exit",
    "plan_state_remedies",
    "points_outside",
    "retry_at_most",
    "retry_if_class",
    "retry_unless_class",
    "retry_unless_node_fault",
    "retry_unless_own_exit",
    "stop_after_failures_without_progress",
    "stop_after_restarts",
    "stop_after_time",
    "stop_never",
    "stop_on_no_progress",
    "stop_on_repeated_hang",
    "wait_after_failures",
    "wait_exponential",
    "wait_fixed",
    "wait_none",
    "wait_random_jitter",
]

DEFAULT_MAX_RESTARTS = 3
"""Consecutive failures without progress given a restart (``--max-restarts``)."""
NOT_RETRIED_BY_DEFAULT = tuple(fc for fc, info in CLASSES.items() if not info.retried)
"""A bug fails the same way again; a bad command never runs; a job stopped from
outside was stopped on purpose (:data:`~trainmedic.resilience.classify.catalogue.CLASSES`)."""


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
    """Everything but a bug, a bad command, an outside stop, a program's own
    non-zero exit and a fault of the machine no attempt on it escapes
    (``node_fault``); ``retry_on_exception`` restarts after a bug and an own
    exit as well."""
    if retry_on_exception:
        return (
            retry_unless_class(FailureClass.BAD_COMMAND, FailureClass.PREEMPTED)
            & retry_unless_node_fault()
        )
    return (
        retry_unless_class(*NOT_RETRIED_BY_DEFAULT)
        & retry_unless_own_exit()
        & retry_unless_node_fault()
    )


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
    ``retry_on_exception``), nor after a fault of the machine (``node_fault``); the
    first restart of a streak at once (with up to 0.5 s of jitter), then
    ``backoff_s`` (5 s) doubling to 120 s plus jitter, from the first failure on
    when the cause lies outside the job; cause-aware remedies."""
    return RestartPolicy(
        stop=default_stop(max_restarts, max_total_s, max_total_restarts),
        retry=default_retry(retry_on_exception),
        wait=default_wait(backoff_s, rng),
        remedies=plan_state_remedies,
        sleep=sleep,
    )
