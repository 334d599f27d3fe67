"""How long to wait before the next attempt: the wait strategies of the restart policy.

Strategies return seconds for a :class:`~trainmedic.resilience.restart_state.RestartState`
and add up with ``+``. The default (:func:`default_wait`) restarts a job that
just failed at once — a restart that waits helps nobody when the fault was
the job's own (a hang, a crash) — and backs off only when failures repeat
without progress in between, or when the cause lies outside the job
(:func:`points_outside`: storage or network unreachable, a GPU fault,
preemption), where the outside needs time to recover:

| failures in a row without progress | inside the job | outside the job |
|---|---|---|
| 1 | 0 s + up to 0.5 s of jitter | ``backoff`` + jitter |
| 2 | ``backoff`` + jitter | 2 × ``backoff`` + jitter |
| k | ``backoff × 2^(k-2)`` (at most 120 s) + jitter | ``backoff × 2^(k-1)`` + jitter |

Jitter (up to ``min(backoff, 5 s)``, 0.5 s on an immediate restart) keeps many
jobs that failed together from restarting in step.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass

from trainmedic.errors import UsageError
from trainmedic.findings.model import Category
from trainmedic.resilience.classify import Classification, FailureClass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from trainmedic.resilience.restart_state import RestartState

FIRST_JITTER_S = 0.5
"""Largest jitter of an immediate restart: it still starts within a second."""
CAP_S = 120.0


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
    cap: float = CAP_S

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


def points_outside(c: Classification | None) -> bool:
    """Whether the failure's cause lies outside the job, where an immediate restart
    would meet it again: a data source that stopped answering (a hang waiting on
    storage or the network), a GPU's hardware fault, a preemption."""
    if c is None:
        return False
    if c.failure_class is FailureClass.PREEMPTED or c.category is Category.HARDWARE_FAULT:
        return True
    return c.failure_class is FailureClass.HANG and c.category in (Category.IO, Category.NETWORK)


class wait_after_failures(WaitStrategy):
    """The default wait (module docstring): by failures in a row without progress,
    and whether the last failure's cause lies outside the job."""

    def __init__(
        self, backoff_s: float = 5.0, cap_s: float = CAP_S, rng: random.Random | None = None
    ) -> None:
        if backoff_s < 0:
            raise UsageError(f"the backoff must be >= 0 seconds, got {backoff_s}")
        self.backoff_s = backoff_s
        self.cap_s = max(cap_s, backoff_s)
        self.rng = rng or random.Random()

    def __call__(self, state: RestartState) -> float:
        if self.backoff_s == 0:
            return 0.0
        failures = max(1, state.failures_without_progress)
        outside = points_outside(state.last_classification)
        exponent = failures - 1 if outside else failures - 2
        if exponent < 0:
            return self.rng.uniform(0.0, min(FIRST_JITTER_S, self.backoff_s))
        base = min(self.cap_s, self.backoff_s * 2.0 ** min(exponent, 64))
        return base + self.rng.uniform(0.0, min(self.backoff_s, 5.0))


def default_wait(backoff_s: float = 5.0, rng: random.Random | None = None) -> WaitStrategy:
    """:class:`wait_after_failures` with ``--backoff`` (5 s; 0: never wait)."""
    return wait_after_failures(backoff_s, CAP_S, rng)
