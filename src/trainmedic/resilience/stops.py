"""When to give up: the stop strategies of the restart policy.

Each returns the reason to stop (or ``None``) for a
:class:`~trainmedic.resilience.restart_state.RestartState`; they combine with
``|`` (either stops) and ``&`` (both must).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from trainmedic.errors import UsageError
from trainmedic.resilience.restart_state import RestartState


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
