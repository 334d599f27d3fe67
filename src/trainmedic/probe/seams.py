"""What the torch hooks read and call: the hook state and the probe as the hooks see it.

The hook modules (:mod:`~trainmedic.probe.torch_hooks`, :mod:`~trainmedic.probe.forward`,
:mod:`~trainmedic.probe.graphs`, :mod:`~trainmedic.probe.amp`,
:mod:`~trainmedic.probe.apply`) depend on :class:`ProbeSeam`, not on the
runtime that implements it (:class:`trainmedic.probe.runtime.Probe`), and get
the step tracker passed in: the runtime imports them, never the reverse.
"""

from __future__ import annotations

from trainmedic.record.events import EventKind

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from trainmedic.channel.wire import ProbeMessage
    from trainmedic.probe.detail import DetailSwitch
    from trainmedic.probe.parts import Parts
    from trainmedic.record.types import RunEvent
else:
    Protocol = object


class HookState:
    """What every hook reads on each call, kept in one small object.

    Attributes:
        depth: 1 while an outermost module call runs on the training thread.
        training_ident: the thread whose calls are timed (``None``: none, in a worker).
        pin_threads: pin-memory threads of this process's DataLoaders.
        loader_used: whether a DataLoader batch was ever fetched here.
        worker_ident: a DataLoader worker's loading thread.
    """

    __slots__ = ("depth", "loader_used", "pin_threads", "training_ident", "worker_ident")

    def __init__(self, training_ident: int | None) -> None:
        self.depth = 0
        self.training_ident = training_ident
        self.pin_threads: set[int] = set()
        self.loader_used = False
        self.worker_ident: int | None = None


class ForwardSeam(Protocol):
    """The forward watch (:class:`trainmedic.probe.forward.ForwardWatch`) as the rest
    of the probe uses it.

    Attributes:
        pending: a discovery runs or is asked for (the one flag hot paths test).
        discovering: a discovery of root module classes runs.
        requested: a discovery is asked for.
        next_routine: when the next routine discovery is due (probe clock, seconds).
    """

    pending: bool
    discovering: bool
    requested: bool
    next_routine: float

    def request(self) -> None:
        """Ask for a discovery at the next safe point (any thread)."""

    def suspend(self) -> None:
        """Take the class wrappers off for a while (never while discovering)."""

    def resume(self) -> None:
        """Put the class wrappers back."""

    def step_closed(self, now: float) -> None:
        """A step ended while discovering or with a discovery asked for."""

    def fetched(self, now: float) -> None:
        """A DataLoader batch is about to be fetched."""

    def uninstall(self) -> None:
        """Remove every wrapper that is still the probe's."""


class ProbeSeam(Protocol):
    """The probe of this process, as the hooks use it.

    Attributes:
        parts: the probe's parts (:mod:`trainmedic.probe.parts`).
        clock: the probe's monotonic clock, seconds.
        state: what the hooks read on each call.
        restore: undo actions, run newest first to put torch back.
        forward: the forward watch, once installed.
        detail: switches the compute hooks on and off (:mod:`trainmedic.probe.detail`).
        cuda: the CUDA part (:class:`trainmedic.probe.cuda.CudaSteps`), when active.
        role: ``process``, ``forked`` or ``worker``.
    """

    parts: Parts
    clock: Callable[[], float]
    state: HookState
    restore: list[Callable[[], None]]
    forward: ForwardSeam | None
    detail: DetailSwitch | None
    cuda: Any
    role: str

    def emit(self, message: ProbeMessage) -> None:
        """Queue ``message`` for the supervisor (any thread; never blocks)."""

    def event(self, kind: EventKind, message: str, data: dict[str, Any]) -> RunEvent:
        """A run event of this process, timed now."""

    def adopt_training_thread(self) -> bool:
        """Make the calling thread the training thread when no step was marked yet."""

    def detail_failed(self, exc: BaseException) -> None:
        """The detail switch failed: every compute hook back on, for good."""

    def loader_in_use(self) -> None:
        """The training thread fetched its first DataLoader batch."""

    def loader_created(self, loader: Any, loader_id: int) -> None:
        """A DataLoader was iterated for the first time."""

    def become_worker(self) -> None:
        """This process runs a DataLoader worker loop."""

    def worker_done(self) -> None:
        """The worker loop returned."""
