"""The restart loop as a state machine, with a fake job, watchdog and clock: no
subprocess, no sleeping. (The same loop with real jobs: tests/resilience_e2e.)"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trainmedic.resilience.timeouts import TimeoutVerdict
from trainmedic.supervise.hang.forensics import HangForensics
from trainmedic.supervise.hang.watchdog import AttemptObservations
from trainmedic.supervise.launch.launcher import CommandNotFoundError, OutputStream
from trainmedic.supervise.launch.stop import StopReport
from trainmedic.supervise.loop.attempt_setup import AttemptIO, ResilienceOptions, StopRequests
from trainmedic.supervise.loop.attempt_state import (
    AttemptNow,
    AttemptState,
    AttemptTracker,
    TransitionError,
)
from trainmedic.supervise.loop.attempts import AttemptLoop
from trainmedic.supervise.output.stream import TerminalMux

S = AttemptState


class Clock:
    """Monotonic seconds that move only when the fake job is waited on."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeJob:
    """A job whose ``wait`` answers from a script: ``None`` (still running) or an exit
    status; the clock advances by each wait's timeout. Its output is ``output``."""

    def __init__(self, pid: int, script: list[int | None], clock: Clock, output: bytes) -> None:
        self.pid = self.pgid = pid
        self._script = list(script)
        self._clock = clock
        self.returncode: int | None = None
        self.signals: list[int] = []
        r, w = os.pipe()
        os.write(w, output)
        os.close(w)
        self.streams = {OUT: OutputStream(r, False)}

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        self._clock.t += timeout or 0.0
        nxt = self._script.pop(0) if self._script else None
        if nxt is not None:
            self.returncode = nxt
        return self.returncode

    def signal_group(self, signum: int) -> None:
        self.signals.append(signum)
        if signum == signal.SIGKILL:
            self.returncode = -signal.SIGKILL

    def reap_leftovers(self, grace_s: float) -> list[int]:
        return []

    def descendants(self) -> list[Any]:
        return []


OUT = 101  # the job's stdout, as the supervisor numbers it (a log key only)


@dataclass
class FakeWatchdog:
    """Declares a hang in the attempts of ``hang_in`` once ``hang_after_s`` have passed."""

    clock: Clock
    hang_in: frozenset[int] = frozenset()
    hang_after_s: float = 5.0
    attempt: int = 0
    started: float = 0.0
    pid: int = 0
    evidence: Any = None
    gpu_first: dict[int, Any] = field(default_factory=dict)
    gpu_last: dict[int, Any] = field(default_factory=dict)

    def begin_attempt(self, timeout: Any, pid: int, explicit: bool = False) -> None:
        self.attempt += 1
        self.started, self.pid = self.clock(), pid

    def check(self, now: float) -> TimeoutVerdict | None:
        if self.attempt in self.hang_in and now - self.started >= self.hang_after_s:
            return TimeoutVerdict(
                hung=True, basis="startup", bound_s=self.hang_after_s, deadline=now,
                silent_s=now - self.started, quiet_s=now - self.started, extended=False,
                reason=f"no step for {self.hang_after_s:g} s",
            )  # fmt: skip
        return None

    def end_attempt(self) -> AttemptObservations:
        return AttemptObservations(
            lead_pid=self.pid, steps=10 * self.attempt, first_step_start=None,
            last_step_end=None, last_progress=None, resume_step=None, num_workers=None,
            pids=frozenset({self.pid}), torch_version=None,
        )  # fmt: skip

    def rank_progress(self) -> dict[int, Any]:
        return {}

    def job_processes(self) -> list[Any]:
        return []

    def focus_pid(self) -> int:
        return self.pid

    def last_steps(self) -> list[Any]:
        return []

    def gpu_readings(self) -> list[Any]:
        return []

    def xid_events(self, since: float) -> tuple[Any, ...]:
        return ()


@dataclass
class Harness:
    loop: AttemptLoop
    tracker: AttemptTracker
    seen: list[AttemptNow]
    launched: list[tuple[str, ...]]
    jobs: list[FakeJob]
    stopped: list[int]
    captured: list[Path]
    notices: Path


@pytest.fixture
def make_loop(tmp_path: Path) -> Iterator[Any]:
    opened: list[int] = []

    def make(
        scripts: list[list[int | None] | Exception],
        *,
        hang_in: frozenset[int] = frozenset(),
        output: bytes = b"",
        stop_after_launch: bool = False,
        **options: Any,
    ) -> Harness:
        clock = Clock()
        out = os.open(tmp_path / "terminal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err = os.open(tmp_path / "notices", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        opened.extend((out, err))
        seen: list[AttemptNow] = []
        tracker = AttemptTracker((seen.append,), clock=clock)
        launched: list[tuple[str, ...]] = []
        jobs: list[FakeJob] = []
        stopped: list[int] = []
        captured: list[Path] = []

        def launch(argv: Any, env: Any, **kw: Any) -> FakeJob:
            script = scripts[len(launched)]
            launched.append(tuple(argv))
            if isinstance(script, Exception):
                raise script
            job = FakeJob(4000 + len(launched), script, clock, output)
            jobs.append(job)
            if stop_after_launch:  # Ctrl-C or SIGTERM as the job starts
                stops.requested, stops.requested_at = signal.SIGTERM, clock()
            return job

        def stop(job: Any, grace_s: float) -> StopReport:
            stopped.append(job.pid)
            job.returncode = -signal.SIGKILL
            return StopReport((job.pid,), (), (job.pid,), (), 0.1)

        def capture(directory: Path, *args: Any, **kw: Any) -> HangForensics:
            captured.append(directory)
            return HangForensics("hung in step() called from main()", "train.py:9 in step")

        stops = StopRequests(None, lambda text: None)
        loop = AttemptLoop(
            argv=("python", "train.py"),
            cwd=str(tmp_path),
            env={},
            run_dir=tmp_path,
            options=ResilienceOptions(backoff_s=0.0, gpu_release_s=0.0, **options),
            io=AttemptIO(out, err, True, TerminalMux(out, err), ((OUT, "output.log"),)),
            router_event=lambda e: None,
            watchdog=FakeWatchdog(clock, hang_in=hang_in),  # type: ignore[arg-type]
            stops=stops,
            wait_idle=lambda timeout: True,
            start_observers=lambda job: None,
            clock=clock,
            wall=lambda: clock.t + 1.7e9,
            tracker=tracker,
            launch=launch,
            stop=stop,  # type: ignore[arg-type]
            capture=capture,
        )
        return Harness(loop, tracker, seen, launched, jobs, stopped, captured,
                       tmp_path / "notices")  # fmt: skip

    yield make
    for fd in opened:
        os.close(fd)


def states(h: Harness) -> list[tuple[int, AttemptState]]:
    return [(n.number, n.state) for n in h.seen if n.state is not None]


def test_a_job_that_succeeds_runs_once_through_every_state(make_loop: Any) -> None:
    h = make_loop([[None, None, 0]])
    result = h.loop.run()
    assert result.returncode == 0 and len(result.attempts) == 1
    assert states(h) == [(1, S.STARTING), (1, S.RUNNING), (1, S.WINDING_DOWN),
                         (1, S.DECIDING), (1, S.DONE)]  # fmt: skip
    assert h.tracker.now.state is S.DONE and h.seen == [*h.seen]  # listeners told each


def test_a_crash_backs_off_and_the_next_attempt_starts(make_loop: Any) -> None:
    h = make_loop([[None, -signal.SIGSEGV], [None, 0]], output=b"Segmentation fault\n")
    result = h.loop.run()
    assert [a.number for a in result.attempts] == [1, 2] and result.returncode == 0
    assert result.attempts[0].restarted is True
    assert states(h)[3:7] == [(1, S.DECIDING), (1, S.BACKING_OFF), (2, S.STARTING),
                              (2, S.RUNNING)]  # fmt: skip
    assert states(h)[-1] == (2, S.DONE)
    assert len(h.launched) == 2


def test_a_hang_is_captured_and_stopped_then_restarted(make_loop: Any) -> None:
    h = make_loop([[None] * 100, [None, 0]], hang_in=frozenset({1}))
    result = h.loop.run()
    assert (1, S.HUNG) in states(h)
    hung = states(h).index((1, S.HUNG))
    assert states(h)[hung - 1 : hung + 2] == [(1, S.RUNNING), (1, S.HUNG), (1, S.WINDING_DOWN)]
    assert h.stopped == [h.jobs[0].pid] and h.captured == [h.loop.run_dir / "attempts" / "1"]
    first = result.attempts[0]
    assert first.failure_class == "hang" and first.restarted is True
    assert result.attempts[1].failure_class == "success"
    # The fake clock moved by the loop's polls: the hang came at its bound, not later.
    assert first.ended_at - first.started_at == pytest.approx(5.0, abs=0.5)


def test_a_stop_request_is_a_stopping_attempt_never_restarted(make_loop: Any) -> None:
    h = make_loop([[None, None, None, -signal.SIGTERM], [0]], stop_after_launch=True)
    result = h.loop.run()
    assert len(result.attempts) == 1 and len(h.launched) == 1
    assert states(h) == [(1, S.STARTING), (1, S.RUNNING), (1, S.STOPPING),
                         (1, S.WINDING_DOWN), (1, S.DECIDING), (1, S.DONE)]  # fmt: skip
    assert result.attempts[0].restarted is False


def test_a_later_attempt_that_cannot_start_winds_down_without_running(make_loop: Any) -> None:
    h = make_loop([[None, -signal.SIGSEGV], CommandNotFoundError("train.py: not found")])
    result = h.loop.run()
    assert (2, S.RUNNING) not in states(h)
    assert states(h)[-4:] == [(2, S.STARTING), (2, S.WINDING_DOWN), (2, S.DECIDING),
                              (2, S.DONE)]  # fmt: skip
    assert result.returncode == 127 and len(result.attempts) == 2


def test_the_first_attempt_that_cannot_start_raises(make_loop: Any) -> None:
    h = make_loop([CommandNotFoundError("nope: not found")])
    with pytest.raises(CommandNotFoundError):
        h.loop.run()
    assert states(h) == [(1, S.STARTING)]


def test_the_tracker_refuses_what_the_table_does_not_allow() -> None:
    t = AttemptTracker(clock=lambda: 0.0)
    with pytest.raises(TransitionError):
        t.enter(S.RUNNING)  # no attempt yet
    t.start(1)
    with pytest.raises(TransitionError):
        t.enter(S.DECIDING)  # a job never waited on cannot be decided
    with pytest.raises(TransitionError):
        t.start(2)  # attempt 1 has not ended
    for state in (S.RUNNING, S.WINDING_DOWN, S.DECIDING, S.BACKING_OFF):
        t.enter(state)
    with pytest.raises(TransitionError):
        t.start(3)  # numbers go one by one
    t.start(2)
    assert t.now == AttemptNow(2, S.STARTING, 0.0)
    assert t.history[-2:] == [(1, S.BACKING_OFF), (2, S.STARTING)]
