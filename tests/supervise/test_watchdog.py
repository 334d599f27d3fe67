"""The watchdog: steps, phases and progress of one attempt fed to the step timeout."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmedic.channel.wire import Heartbeat, Hello, TorchInfo
from trainmedic.record.types import LoaderInfo, RunEvent, StepRecord
from trainmedic.resilience.timeouts import StepTimeout, TimeoutConfig
from trainmedic.supervise.processes import ProcessTable
from trainmedic.supervise.watchdog import Watchdog

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


def make_watchdog(config: TimeoutConfig, explicit: bool = False) -> tuple[Watchdog, Clock]:
    clock = Clock()
    dog = Watchdog(clock.table, lambda: [], clock=clock.mono, wall=clock.wall)
    dog.begin_attempt(StepTimeout(config, started_at=0.0), PID, explicit=explicit)
    return dog, clock


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
    dog, clock = make_watchdog(TimeoutConfig(startup_s=5))
    hello(clock)
    assert run_until(dog, clock, 60) is None
    assert not dog.armed


def test_torch_arms_the_startup_timeout() -> None:
    dog, clock = make_watchdog(TimeoutConfig(startup_s=5))
    hello(clock)
    clock.table.update(PID, torch=TorchInfo(PID, clock.wall(), "2.3", None, None, False))
    assert run_until(dog, clock, 60) == 5.0
    verdict = dog.status(clock.now)
    assert verdict is not None and verdict.basis == "startup"


def test_a_fixed_timeout_counts_from_the_last_step_of_the_lead() -> None:
    dog, clock = make_watchdog(TimeoutConfig(fixed_s=1.0), explicit=True)
    hello(clock)

    def feed(now: float) -> None:
        if now <= 3.0:
            dog.add_step(step(clock, int(now * 4)))

    assert run_until(dog, clock, 10, feed) == 4.0
    obs = dog.end_attempt()
    assert obs.steps == 12 and obs.lead_pid == PID
    assert obs.last_step_end == WALL0 + 3.0


def test_a_marked_phase_gets_its_own_bound_and_ends_with_its_record() -> None:
    dog, clock = make_watchdog(TimeoutConfig(fixed_s=1.0, phase_s=30.0), explicit=True)
    hello(clock)
    dog.add_step(step(clock, 1))

    def feed(now: float) -> None:
        if now == 0.5:
            heartbeat(clock, phase="checkpoint")
        if now == 10.0:  # the checkpoint's record arrives as it ends
            dog.add_step(step(clock, 1, phase="checkpoint", duration=9.5))

    assert run_until(dog, clock, 30, feed) == 11.0


def test_work_between_steps_is_progress_and_a_spinning_stack_is_not() -> None:
    dog, clock = make_watchdog(TimeoutConfig(floor_s=2.0, warmup_intervals=0))
    hello(clock)
    for n in range(1, 4):  # learn a step interval well under the floor
        clock.now = n * 0.25
        dog.add_step(step(clock, n))
    work = [0]

    def feed(now: float) -> None:
        if now == int(now):  # a heartbeat every second
            if now <= 8:
                work[0] += 5  # an evaluation: forward passes keep coming
            stacks = (("train.py:9 spin",), ("train.py:10 spin",))
            heartbeat(clock, stack=stacks[int(now) % 2], work=work[0])

    hung_at = run_until(dog, clock, 30, feed)
    # The evaluation's work kept it alive past the 2 s bound until second 8; after
    # that the loop alternates between two stacks it has already shown.
    assert hung_at is not None and 10.0 <= hung_at <= 11.25


def test_without_heartbeats_the_job_is_hung_at_the_bound() -> None:
    dog, clock = make_watchdog(TimeoutConfig(floor_s=2.0, warmup_intervals=0))
    for n in range(1, 4):
        clock.now = n * 0.25
        dog.add_step(step(clock, n))
    assert run_until(dog, clock, 10) == 2.75  # the last step at 0.75 s + 2 s


def test_rank_0_leads_and_other_ranks_do_not_reset_the_clock() -> None:
    dog, clock = make_watchdog(TimeoutConfig(fixed_s=1.0), explicit=True)
    dog.add_step(step(clock, 1, pid=11, rank=1))
    dog.add_step(step(clock, 1, pid=10, rank=0))

    def feed(now: float) -> None:
        if now <= 5:
            dog.add_step(step(clock, 2, pid=11, rank=1))  # rank 1 goes on, rank 0 is stuck

    assert run_until(dog, clock, 10, feed) == 1.0
    assert dog.end_attempt().lead_pid == 10


def test_observations_carry_the_resume_step_and_the_workers() -> None:
    dog, clock = make_watchdog(TimeoutConfig(fixed_s=1.0), explicit=True)
    dog.add_event(RunEvent(clock.wall(), "checkpoint_resumed", "resumed", PID, {"step": 30}))
    dog.add_loader(LoaderInfo(clock.wall(), PID, 1, 4, 32, True, 2, False))
    dog.add_step(step(clock, 1))
    obs = dog.end_attempt()
    assert obs.resume_step == 30
    assert obs.num_workers == 4
    assert obs.first_step_start == WALL0 - 0.1


def test_the_stack_a_hang_begins_with_is_not_progress() -> None:
    """The first heartbeat of a silence shows a new stack and the last step's work:
    new by definition, so it sets the baseline instead of extending the bound."""
    dog, clock = make_watchdog(TimeoutConfig(floor_s=2.0, warmup_intervals=0))
    hello(clock)
    for n in range(1, 4):
        clock.now = n * 0.25
        heartbeat(clock, stack=("train.py:20 step",), work=3 * n)
        dog.add_step(step(clock, n))

    def feed(now: float) -> None:
        if now == int(now):
            heartbeat(clock, stack=("train.py:31 wait_for_peer",), work=12)

    assert run_until(dog, clock, 10, feed) == 2.75  # the last step at 0.75 s + 2 s
