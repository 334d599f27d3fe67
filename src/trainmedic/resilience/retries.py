"""Which failures deserve a restart: the retry strategies of the restart policy.

Each says whether a classified failure is worth another attempt; they combine
with ``|`` and ``&``, and :meth:`RetryStrategy.describe` says why in words.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from trainmedic.findings.model import Category
from trainmedic.resilience.classify import Classification, FailureClass
from trainmedic.resilience.restart_state import RestartState


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


class retry_unless_node_fault(RetryStrategy):
    """No restart after a fault of the machine that every attempt on it meets
    again and no remedy of ours changes: the classification's ``node_fault``
    detail (CUDA error 802, the NVSwitch Fabric Manager not running). The job
    belongs on another machine, or this one needs fixing first. Every other
    failure passes; a GPU's own fault does not count (its remedy leaves the GPU
    out)."""

    def __call__(self, state: RestartState, c: Classification) -> bool:
        return not c.details.get("node_fault")

    def describe(self) -> str:
        return "retry_unless_node_fault()"


def is_own_exit(c: Classification) -> bool:
    """An ``unknown`` failure that is only a non-zero exit status (see
    :class:`retry_unless_own_exit`)."""
    return (
        c.failure_class is FailureClass.UNKNOWN
        and c.signal is None
        and (c.exit_code or 0) > 0
        and c.category is Category.TIMEOUT
    )
