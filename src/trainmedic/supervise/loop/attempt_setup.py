"""What the restart loop is given and what it gives back: the resilience
options of ``trainmedic run``, the output plumbing shared by every attempt, the
stop requests from signals, the current job for long-lived observers, and the
loop's result."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainmedic.host import ps
from trainmedic.record.guard import RecordGuard
from trainmedic.resilience.incidents import AttemptSummary
from trainmedic.resilience.policy import DEFAULT_MAX_RESTARTS, RestartPolicy, default_policy
from trainmedic.resilience.timeouts import TimeoutConfig
from trainmedic.supervise.launch.launcher import Job
from trainmedic.supervise.launch.signals import SignalForwarder
from trainmedic.supervise.output.keeper import OutputKeeper
from trainmedic.supervise.output.stream import TerminalMux


@dataclass(frozen=True)
class ResilienceOptions:
    """How ``trainmedic run`` keeps a job alive (the ``run`` command's options).

    Attributes:
        max_restarts: ``--max-restarts``: failures in a row without progress.
        max_total_restarts: ``--max-total-restarts``: restarts in all (``None``: no cap).
        time_budget_s: ``--time-budget``: no restart once the run used this long.
        timeout: the step timeout's settings (``--timeout``, ``--startup-timeout``,
            ``--timeout-floor``).
        explicit_timeout: the user set ``--startup-timeout``, so the watchdog is
            armed even when the probe sees no torch and no steps.
        grace_s: ``--grace``: SIGTERM to SIGKILL, for a hang and for a stop request.
        backoff_s: ``--backoff``: the first restart's wait (doubling after).
        resume_args: ``--resume-args`` parsed (placeholders ``{checkpoint}``, ``{step}``).
        checkpoint_glob: ``--checkpoint-glob``: the script's own checkpoint files.
        retry_on_exception: restart after a Python exception (a bug) too.
        gpu_release_s: longest wait for GPU memory to be released before a restart.
        seed: seed of the backoff jitter (``None``: random).
    """

    max_restarts: int = DEFAULT_MAX_RESTARTS
    max_total_restarts: int | None = None
    time_budget_s: float | None = None
    timeout: TimeoutConfig = field(default_factory=TimeoutConfig)
    explicit_timeout: bool = False
    grace_s: float = 10.0
    backoff_s: float = 5.0
    resume_args: tuple[str, ...] | None = None
    checkpoint_glob: str | None = None
    retry_on_exception: bool = False
    gpu_release_s: float = 30.0
    seed: int | None = None

    def policy(self, sleep: Callable[[float], None]) -> RestartPolicy:
        return default_policy(
            max_restarts=self.max_restarts,
            max_total_s=self.time_budget_s,
            sleep=sleep,
            rng=random.Random(self.seed),
            retry_on_exception=self.retry_on_exception,
            backoff_s=self.backoff_s,
            max_total_restarts=self.max_total_restarts,
        )


@dataclass
class StopRequests(SignalForwarder):
    """The session's signal forwarder, plus what the restart loop must know: a
    stop was asked for (Ctrl-C, SIGTERM, SIGHUP) — so no restart follows, a
    backoff ends at once, and SIGTERM starts the grace period."""

    requested: int | None = None
    requested_at: float | None = None
    wake: threading.Event = field(default_factory=threading.Event)

    def handle(self, signum: int) -> None:
        if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) and self.requested is None:
            self.requested = signum
            self.requested_at = time.monotonic()
            self.wake.set()
        super().handle(signum)


class CurrentJob:
    """The running attempt's job, for observers that outlive an attempt (the host sampler)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.pid = job.pid  # the first attempt's: cgroup and affinity do not change

    def descendants(self) -> list[ps.Process]:
        return self.job.descendants()


@dataclass(frozen=True)
class LoopResult:
    """How the attempts ended.

    Attributes:
        returncode: the last attempt's return code (negative: signal).
        ended_at: Unix time the last attempt's job ended.
        attempts: every attempt, in order.
        leftovers: pids of processes the attempts left running, stopped.
    """

    returncode: int
    ended_at: float
    attempts: tuple[AttemptSummary, ...]
    leftovers: tuple[int, ...]


@dataclass
class AttemptIO:
    """Where the job's bytes go; shared by every attempt."""

    stdout_fd: int
    stderr_fd: int
    merged: bool
    mux: TerminalMux
    logs: tuple[tuple[int, str], ...]
    """(our fd, log file name) per stream; the last one holds stderr."""
    record_guard: RecordGuard | None = None
    """Stops the logs and attempt files (not the job) when the run directory stops taking writes."""
    keeper: OutputKeeper | None = None
    """Holds a copy of each stream, for a supervisor that gets killed."""
