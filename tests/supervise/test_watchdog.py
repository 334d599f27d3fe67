"""The watchdog: steps, phases and progress of one attempt fed to the step timeout."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmedic.channel.wire import Heartbeat, Hello, TorchInfo
from trainmedic.record.types import LoaderInfo, RunEvent, StepRecord
from trainmedic.resilience.silence_evidence import JobEvidence, Silence
from trainmedic.resilience.timeouts import StepTimeout, TimeoutConfig
from trainmedic.supervise.hang.watchdog import Watchdog
from trainmedic.supervise.observe.processes import ProcessTable

WALL0 = 1_000_000.0
PID = 4242


@dataclass
class Clock:
    now: float = 0.0
    table: ProcessTable = field(default_factory=ProcessTable)

    def mono(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL0 + self.now


@dataclass
class FakeObserver:
    """Stands for the /proc reader: the evidence the test sets, and what it was asked."""

    silence: Silence | None = None
    asked: list[tuple[float, float]] = field(default_factory=list)

    def observe(self, now: float, since_wall: float) -> JobEvidence | None:
        self.asked.append((now, since_wall))
        return None if self.silence is None else JobEvidence(self.silence, "test")

    def reset(self) -> None:
        self.asked.clear()


def make_watchdog(
    config: TimeoutConfig, explicit: bool = False
) -> tuple[Watchdog, Clock, FakeObserver]:
    clock = Clock()
    observer = FakeObserver()
    dog = Watchdog(
        clock.table,
        lambda: [],
        clock=clock.mono,
        wall=clock.wall,
        observer=observer,  # type: ignore[arg-type]
    )
    dog.begin_attempt(StepTimeout(config, started_at=0.0), PID, explicit=explicit)
    return dog, clock, observer


def hello(clock: Clock, pid: int = PID, role: str = "process") -> None:
    clock.table.hello(
        Hello(pid, 1, role, ("train.py",), None, None, "3.11", "python", clock.wall())
    )


def heartbeat(
    clock: Clock,
    stack: tuple[str, ...] = ("train.py:9 main",),
    work: int = 0,
    phase: str = "train",
    pid: int = PID,
) -> None:
    clock.table.update(
        pid,
        last_heartbeat=Heartbeat(pid, clock.wall(), 0, phase, "other", stack, 0.0, work),
    )


def step(
    clock: Clock,
    n: int,
    pid: int = PID,
    rank: int | None = None,
    phase: str = "train",
    duration: float = 0.1,
) -> StepRecord:
    return StepRecord(step=n, t=clock.wall(), duration_s=duration, pid=pid, rank=rank, phase=phase)


def run_until(dog: Watchdog, clock: Clock, end: float, feed=None) -> float | None:  # type: ignore[no-untyped-def]
    """Advance in 0.25 s ticks until ``end``; the time of the hang verdict, or None."""
    while clock.now < end:
        clock.now = round(clock.now + 0.25, 6)
        if feed is not None:
            feed(clock.now)
        if dog.check(clock.now) is not None:
            return clock.now
    return None


def test_a_job_without_torch_or_steps_is_never_declared_hung() -> None:
    dog, clock, _ = make_watchdog(TimeoutConfig(startup_s=5))
    hello(clock)
    assert run_until(dog, clock, 60) is None
    assert not dog.armed


def test_torch_arms_the_startup_timeout() -> None:
    dog, clock, _ = make_watchdog(TimeoutConfig(startup_s=5))
    hello(clock)
    clock.table.update(PID, torch=TorchInfo(PID, clock.wall(), "2.3", None, None, False))
    assert run_until(dog, clock, 60) == 5.0
    verdict = dog.status(clock.now)
    assert verdict is not None and verdict.basis == "startup"


def test_a_fixed_timeout_counts_from_the_last_step_of_the_lead() -> None:
    dog, clock, _ = make_watchdog(TimeoutConfig(fixed_s=1.0), explicit=True)
    hello(clock)

    def feed(now: float) -> None:
        if now <= 3.0:
            dog.add_step(step(clock, int(now * 4)))

    assert run_until(dog, clock, 10, feed) == 4.0
    obs = dog.end_attempt()
    assert obs.steps == 12 and obs.lead_pid == PID
    assert obs.last_step_end == WALL0 + 3.0


def test_a_marked_phase_gets_its_own_bound_and_ends_with_its_record() -> None:
    dog, clock, _ = make_watchdog(TimeoutConfig(fixed_s=1.0, phase_s=30.0), explicit=True)
    hello(clock)
    dog.add_step(step(clock, 1))

    def feed(now: float) -> None:
        if now == 0.5:
            heartbeat(clock, phase="checkpoint")
        if now == 10.0:  # the checkpoint's record arrives as it ends
            dog.add_step(step(clock, 1, phase="checkpoint", duration=9.5))

    assert run_until(dog, clock, 30, feed) == 11.0


def test_evidence_is_asked_for_only_in_silences_and_decides_the_bound() -> None:
    dog, clock, observer = make_watchdog(TimeoutConfig(floor_s=2.0, warmup_intervals=0))
    hello(clock)

    def feed(now: float) -> None:
        if now <= 3.0:
            dog.add_step(step(clock, int(now * 4)))  # steps every 0.25 s: no silence
        elif now <= 8.0:
            observer.silence = Silence.WORK  # an unmarked evaluation
        else:
            observer.silence = Silence.SPINNING

    hung_at = run_until(dog, clock, 30, feed)
    assert all(now > 3.25 for now, _ in observer.asked)  # nothing read while steps flow
    assert {since for _, since in observer.asked} == {WALL0 + 3.0}
    # Work until second 8, then spinning: hung 2 s (the floor) after the last work.
    assert hung_at == 10.0
    verdict = dog.status(clock.now)
    assert verdict is not None and verdict.silence == "spinning"
    assert dog.evidence is not None and dog.evidence.silence is Silence.SPINNING
    assert dog.observations().last_progress == WALL0 + 8.0


def test_without_evidence_the_conservative_bound_applies() -> None:
    dog, clock, _ = make_watchdog(
        TimeoutConfig(floor_s=2.0, unclear_floor_s=30.0, warmup_intervals=0)
    )
    for n in range(1, 4):
        clock.now = n * 0.25
        dog.add_step(step(clock, n))
    assert run_until(dog, clock, 60) == 30.75  # the last step at 0.75 s + 30 s


def test_rank_0_leads_and_other_ranks_do_not_reset_the_clock() -> None:
    dog, clock, _ = make_watchdog(TimeoutConfig(fixed_s=1.0), explicit=True)
    dog.add_step(step(clock, 1, pid=11, rank=1))
    dog.add_step(step(clock, 1, pid=10, rank=0))

    def feed(now: float) -> None:
        if now <= 5:
            dog.add_step(step(clock, 2, pid=11, rank=1))  # rank 1 goes on, rank 0 is stuck

    assert run_until(dog, clock, 10, feed) == 1.0
    assert dog.end_attempt().lead_pid == 10


def test_observations_carry_the_resume_step_and_the_workers() -> None:
    dog, clock, _ = make_watchdog(TimeoutConfig(fixed_s=1.0), explicit=True)
    dog.add_event(RunEvent(clock.wall(), "checkpoint_resumed", "resumed", PID, {"step": 30}))
    dog.add_loader(LoaderInfo(clock.wall(), PID, 1, 4, 32, True, 2, False))
    dog.add_step(step(clock, 1))
    obs = dog.end_attempt()
    assert obs.resume_step == 30
    assert obs.num_workers == 4
    assert obs.first_step_start == WALL0 - 0.1


def test_a_phase_change_starts_a_new_silence() -> None:
    dog, clock, observer = make_watchdog(TimeoutConfig(floor_s=2.0, warmup_intervals=0))
    hello(clock)
    dog.add_step(step(clock, 1))
    observer.silence = Silence.BLOCKED

    def feed(now: float) -> None:
        if now == 1.0:
            heartbeat(clock, phase="checkpoint")

    assert run_until(dog, clock, 3, feed) is None  # a marked phase: its own bound
    assert {since for _, since in observer.asked} == {WALL0, WALL0 + 1.0}
