"""The history the restart policy decides on: one :class:`AttemptRecord` per
ended attempt in a :class:`RestartState`, with what counts as progress."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from trainmedic.resilience.classify import Classification, FailureClass, GpuRef

PROGRESS_MIN_S = 10.0
"""An attempt that trained this many seconds beyond the furthest step before made
progress: it resets the failure count and the backoff."""


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
