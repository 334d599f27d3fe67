"""What the probe does when the job fails or hangs: exception hooks, stacks on demand.

:class:`ProbeIncidents` is the part of :class:`trainmedic.probe.runtime.Probe`
that chains ``sys.excepthook`` and ``threading.excepthook`` (uncaught
exceptions become events and the error file, :mod:`trainmedic.probe.crash`)
and answers the supervisor's stack requests when it declares a hang
(:mod:`trainmedic.probe.forensics`).
"""

from __future__ import annotations

import os
import sys
import threading

from trainmedic.record.events import EventKind

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from trainmedic.channel.wire import ProbeMessage
    from trainmedic.probe.env import ProbeConfig
    from trainmedic.probe.forensics import StackDumps
    from trainmedic.probe.parts import Parts
    from trainmedic.probe.seams import HookState
    from trainmedic.probe.steps import StepTracker
    from trainmedic.record.types import RunEvent


class ProbeIncidents:
    """Exceptions and hang forensics of the probe (mixed into ``Probe``)."""

    # What this side reads of the probe (set by ``Probe.__init__``).
    config: ProbeConfig
    parts: Parts
    pid: int
    role: str
    state: HookState
    tracker: StepTracker | None
    dump_requested: bool
    stack_dumps: StackDumps | None

    emit: Callable[[ProbeMessage], None]  # Probe
    wake: Callable[[], None]  # ProbeAgent

    # --- forensics -------------------------------------------------------------------------------

    def _install_forensics(self) -> None:
        """Stacks on demand (:mod:`trainmedic.probe.forensics`), when the supervisor
        named a stacks file for this attempt."""
        part = self.parts["forensics"]
        stacks_file = os.environ.get("TRAINMEDIC_PROBE_STACKS")  # forensics.STACKS_ENV
        if not part.on or not stacks_file:
            return
        try:
            part.check()
            from trainmedic.probe.forensics import StackDumps

            self.stack_dumps = StackDumps(stacks_file, self._request_dump)
            self.stack_dumps.install()
        except Exception as exc:
            part.fail(exc)

    def _request_dump(self) -> None:
        # Runs inside a signal handler: set a flag and wake the probe's thread.
        self.dump_requested = True
        self.wake()

    def _dump_stacks(self) -> None:
        part = self.parts["forensics"]
        dumps = self.stack_dumps
        if not part.on or dumps is None:
            return
        try:
            from trainmedic.probe import forensics

            tracker = self.tracker
            extra = {
                "phase": "train" if tracker is None else tracker.phase,
                "activity": "other" if tracker is None else tracker.activity,
                "steps": 0 if tracker is None else tracker.train_steps,
            }
            data = forensics.collect(self.pid, self.role, self.state.training_ident, extra)
            forensics.write_json(forensics.json_path(dumps.stacks_file, self.pid), data)
        except Exception as exc:
            part.fail(exc)

    # --- exceptions ------------------------------------------------------------------------------

    def _chain_excepthooks(self) -> None:
        """Record uncaught exceptions first, then let the previous hooks print them."""
        previous = sys.excepthook
        part = self.parts["exceptions"]

        def excepthook(
            exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            if part.on:
                try:
                    from trainmedic.probe import crash

                    self._record_exception(
                        crash.exception_event(EventKind.EXCEPTION, exc_type, exc, tb, self.pid)
                    )
                except Exception as error:
                    part.fail(error)
            previous(exc_type, exc, tb)

        sys.excepthook = excepthook
        previous_thread = threading.excepthook

        def thread_excepthook(args: threading.ExceptHookArgs) -> None:
            if part.on and args.exc_type is not SystemExit:
                try:
                    from trainmedic.probe import crash

                    name = args.thread.name if args.thread is not None else None
                    event = crash.exception_event(
                        EventKind.THREAD_EXCEPTION,
                        args.exc_type,
                        args.exc_value,
                        args.exc_traceback,
                        self.pid,
                        name,
                    )
                    self._record_exception(event)
                except Exception as error:
                    part.fail(error)
            previous_thread(args)

        threading.excepthook = thread_excepthook

    def _record_exception(self, event: RunEvent) -> None:
        self.emit(event)
        if event.kind == EventKind.EXCEPTION and self.config.run_dir:
            from trainmedic.probe import crash

            crash.write_error_file(self.config.run_dir, event, list(sys.argv))
