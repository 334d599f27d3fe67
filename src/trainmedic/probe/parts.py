"""Failure isolation: the probe as independent parts, each switched off by its own error.

Every hook body of the probe runs inside ``try``; an exception calls
:meth:`Part.fail`, which disables that part only and reports the error once
(a ``probe_error`` event). Hooks check :attr:`Part.on` first, so a disabled
part costs one attribute read. :meth:`Part.check` raises the injected fault
when the supervisor asked for one (``TRAINMEDIC_PROBE_INJECT_FAULT``), which is
how the isolation is tested on real jobs.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

PART_NAMES = (
    "steps",  # optimizer hooks, the explicit API, the step tracker
    "backward",  # the backward wrapper (steps of scripts without an optimizer)
    "forward",  # outermost module calls: compute time, samples, autocast
    "sampled_detail",  # compute hooks on a share of short steps (off: on every step)
    "loader",  # DataLoader wait, loader settings, batch sizes
    "stacks",  # stack sampling of loading threads and workers
    "cuda",  # CUDA events and allocator statistics
    "profiler",  # the torch.profiler windows (probe.profile_window)
    "heartbeat",  # liveness messages with the main thread's frames
    "exceptions",  # sys.excepthook chain and error files
    "forensics",  # stacks on demand when the supervisor declares a hang
    "keras",  # Keras and TensorFlow: fit's steps and phases, tf.data wait (probe.keras_hooks)
    "sending",  # the probe's thread and what it sends; off: the hooks alone (benchmarks)
    "ring",  # steps through shared memory (off: as lines from the probe's thread)
    "outside_stacks",  # the supervisor samples the training thread's stacks (off: the probe)
)


class InjectedFault(RuntimeError):
    """The error a part raises on purpose when asked to (self-test)."""


class Part:
    """One independently failing piece of the probe.

    Attributes:
        name: one of :data:`PART_NAMES`.
        on: ``False`` once disabled (by configuration or by an error).
        fault: an injected fault is pending (see :meth:`check`).
        error: the error that disabled it, as ``"Type: message"``.
    """

    __slots__ = ("_report", "error", "fault", "name", "on")

    def __init__(
        self, name: str, on: bool, fault: bool, report: Callable[[Part, BaseException, str], None]
    ) -> None:
        self.name = name
        self.on = on
        self.fault = fault
        self._report = report
        self.error: str | None = None

    def check(self) -> None:
        """Raise the injected fault once, when one was asked for.

        Hot paths write ``if part.fault: part.check()``: a call costs more than the test.
        """
        if self.fault:
            self.fault = False
            raise InjectedFault(f"fault injected into probe part {self.name!r}")

    def fail(self, exc: BaseException) -> None:
        """Disable this part and report ``exc`` (once; later calls are ignored)."""
        if not self.on:
            return
        self.on = False
        self.error = f"{type(exc).__name__}: {exc}"
        try:
            import traceback

            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self._report(self, exc, tb)
        except Exception:
            pass  # reporting is best effort; the part is off either way


class Parts:
    """The probe's parts by name."""

    def __init__(
        self,
        disabled: Iterable[str],
        inject_fault: Iterable[str],
        report: Callable[[Part, BaseException, str], None],
    ) -> None:
        off = set(disabled)
        faults = set(inject_fault)
        everything_off = "all" in off
        self.by_name = {
            name: Part(
                name, on=not everything_off and name not in off, fault=name in faults, report=report
            )
            for name in PART_NAMES
        }

    def __getitem__(self, name: str) -> Part:
        return self.by_name[name]
