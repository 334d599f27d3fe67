"""Where the restart loop is: each attempt's state and the transitions allowed.

One attempt goes through these states (:class:`AttemptState`)::

    STARTING --> RUNNING --> WINDING_DOWN --> DECIDING --> DONE
        |           |  \\                          |
        |           |   +-> STOPPING --+          +--> BACKING_OFF --> STARTING (next)
        |           +-> HUNG ----------+                    |
        |                              v                    +--> DONE (a stop arrived)
        +---------------------> WINDING_DOWN (the command could not start)

* ``STARTING``: the resume point is chosen, the command launched;
* ``RUNNING``: the job runs, the watchdog checks it each poll;
* ``STOPPING``: the person asked to stop (Ctrl-C, SIGTERM): the job has the
  signal and its grace; no restart follows;
* ``HUNG``: the watchdog declared a hang: stacks are being taken, then the
  whole job is stopped;
* ``WINDING_DOWN``: the job ended: its output drained, leftovers stopped, the
  probes' last messages read;
* ``DECIDING``: the evidence gathered, the failure classified, the policy asked;
* ``BACKING_OFF``: a restart is decided: the GPUs let go, the back-off waited;
* ``DONE``: no more attempts.

:class:`AttemptTracker` holds the current attempt's number and state, refuses a
transition the table does not allow (a bug in the loop, caught where it
happens), and tells its listeners (the live view, the metrics) of each one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class AttemptState(str, Enum):
    """The restart loop's state within an attempt (module docstring)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    HUNG = "hung"
    WINDING_DOWN = "winding_down"
    DECIDING = "deciding"
    BACKING_OFF = "backing_off"
    DONE = "done"

    def __str__(self) -> str:
        return self.value


S = AttemptState
TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    S.STARTING: frozenset({S.RUNNING, S.WINDING_DOWN}),
    S.RUNNING: frozenset({S.STOPPING, S.HUNG, S.WINDING_DOWN}),
    S.STOPPING: frozenset({S.WINDING_DOWN}),
    S.HUNG: frozenset({S.WINDING_DOWN}),
    S.WINDING_DOWN: frozenset({S.DECIDING}),
    S.DECIDING: frozenset({S.BACKING_OFF, S.DONE}),
    S.BACKING_OFF: frozenset({S.STARTING, S.DONE}),
    S.DONE: frozenset(),
}
"""Each state and the states that may follow it."""


class TransitionError(RuntimeError):
    """The loop tried a transition :data:`TRANSITIONS` does not allow (a bug)."""


@dataclass(frozen=True)
class AttemptNow:
    """The loop's state at one moment.

    Attributes:
        number: the attempt (1-based); 0 before the first starts.
        state: its state (``None`` before the first attempt starts).
        since: when it entered the state (the tracker's clock, seconds).
    """

    number: int
    state: AttemptState | None
    since: float


Listener = Callable[[AttemptNow], None]


class AttemptTracker:
    """The current attempt and its state; thread-safe to read.

    Args:
        listeners: called with the new :class:`AttemptNow` after each transition.
        clock: seconds, for ``since``.
    """

    def __init__(
        self, listeners: tuple[Listener, ...] = (), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._listeners = listeners
        self._clock = clock
        self._lock = threading.Lock()
        self._now = AttemptNow(0, None, clock())
        self.history: list[tuple[int, AttemptState]] = []
        """Every (attempt, state) entered, in order."""

    @property
    def now(self) -> AttemptNow:
        with self._lock:
            return self._now

    def start(self, number: int) -> None:
        """Attempt ``number`` begins: ``STARTING`` (after ``BACKING_OFF`` for a restart)."""
        with self._lock:
            current = self._now.state
            if current is not None and AttemptState.STARTING not in TRANSITIONS[current]:
                raise TransitionError(f"attempt {number} cannot start from {current}")
            if number != self._now.number + 1:
                raise TransitionError(f"attempt {number} after attempt {self._now.number}")
            now = self._set(number, AttemptState.STARTING)
        self._tell(now)

    def enter(self, state: AttemptState) -> None:
        """The current attempt moves to ``state``."""
        with self._lock:
            current = self._now.state
            if current is None or state not in TRANSITIONS[current]:
                raise TransitionError(f"attempt {self._now.number}: {current} -> {state}")
            now = self._set(self._now.number, state)
        self._tell(now)

    def _set(self, number: int, state: AttemptState) -> AttemptNow:
        self._now = AttemptNow(number, state, self._clock())
        self.history.append((number, state))
        return self._now

    def _tell(self, now: AttemptNow) -> None:
        for listener in self._listeners:  # outside the lock: a listener may read ``now``
            listener(now)
