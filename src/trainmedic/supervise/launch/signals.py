"""What trainmedic does with the signals it receives while the job runs.

The job runs in its own session, so the terminal's Ctrl-C reaches trainmedic
only: :class:`SignalForwarder` decides what the job gets (forwarded, then
escalated on repeats), and :func:`forwarding_signals` installs it for the
time the job runs.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from trainmedic.supervise.launch.launcher import Job


@dataclass
class SignalForwarder:
    """What trainmedic does with the signals it receives while the job runs.

    Ctrl-C (SIGINT) goes to the job's process group, as the terminal would have
    sent it; a second one escalates to SIGTERM and a third to SIGKILL. SIGTERM
    is forwarded, and a second one kills. SIGHUP and SIGQUIT are forwarded as
    they are. ``notify`` is told, in one line, about each escalation.
    """

    job: Job | None
    notify: Callable[[str], None]
    interrupts: int = 0
    terminations: int = 0
    pending: list[int] = field(default_factory=list)

    def attach(self, job: Job) -> None:
        """The job exists now: deliver what arrived while it was starting."""
        self.job = job
        pending, self.pending = self.pending, []
        for signum in pending:
            self.handle(signum)

    def resize(self, like_fd: int) -> None:
        if self.job is not None:
            self.job.resize(like_fd)

    def handle(self, signum: int) -> None:
        if self.job is None:
            self.pending.append(signum)
            return
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts == 1:
                self.job.signal_group(signal.SIGINT)
            elif self.interrupts == 2:
                self.notify("second Ctrl-C: sending SIGTERM to the job (Ctrl-C again kills it)")
                self.job.signal_group(signal.SIGTERM)
            else:
                self.notify("killing the job (SIGKILL)")
                self.job.signal_group(signal.SIGKILL)
        elif signum == signal.SIGTERM:
            self.terminations += 1
            if self.terminations == 1:
                self.job.signal_group(signal.SIGTERM)
            else:
                self.notify("second SIGTERM: killing the job (SIGKILL)")
                self.job.signal_group(signal.SIGKILL)
        else:
            self.job.signal_group(signum)


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def forwarding_signals(
    forwarder: SignalForwarder, on_resize: Callable[[], None] | None = None
) -> Iterator[SignalForwarder]:
    """Install the forwarder (and a SIGWINCH handler) for the block; restore after."""
    previous: dict[int, object] = {}

    def handler(signum: int, _frame: object) -> None:
        forwarder.handle(signum)

    def winch(_signum: int, _frame: object) -> None:
        if on_resize is not None:
            on_resize()

    try:
        for sig in FORWARDED_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
        if on_resize is not None:
            previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, winch)
        yield forwarder
    finally:
        for number, old in previous.items():
            with contextlib.suppress(ValueError, TypeError, OSError):
                signal.signal(number, old)  # type: ignore[arg-type]
