"""How often the stack sampler samples: often while loading is worth diagnosing, rarely else."""

from __future__ import annotations

import queue
import threading

import pytest

from trainmedic.probe.sampling import (
    FAST_S,
    FIRST_S,
    FIRST_SAMPLES,
    FIRST_SHORT_S,
    KNOWN_SAMPLES,
    KNOWN_SAMPLES_PER_S,
    SLOW_S,
    STALL_FLOOR_S,
    WAIT_SAMPLES_PER_S,
    WATCH_SHARE,
    WORKER_FAST_S,
    MainPolicy,
    StackSampler,
    StepStats,
    WorkerPolicy,
    wilson_half_width,
)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def stats_of(step_s: float, wait_share: float, steps: int = 50) -> StepStats:
    stats = StepStats()
    for _ in range(steps):
        stats.add(step_s, step_s * wait_share)
    return stats


def test_recent_step_statistics() -> None:
    stats = StepStats()
    assert not stats.known and stats.wait_share == 0.0 and stats.step_s == 0.0
    for _ in range(100):
        stats.add(0.01, 0.005)
    assert stats.wait_share == pytest.approx(0.5)
    assert stats.step_s == pytest.approx(0.01)
    for _ in range(2000):  # 20 s of healthy steps: the old waits have faded
        stats.add(0.01, 0.0)
    assert stats.wait_share < 0.01


def test_a_training_process_is_sampled_often_until_its_steps_are_known() -> None:
    clock = Clock()
    policy = MainPolicy(StepStats(), lambda: None, clock)
    # Steps become known at the probe's first send, 0.2-0.5 s in: a run that
    # short gets its first samples as fast as a known wait does...
    assert policy.period(None) == FIRST_S
    periods = [policy.period("outside") for _ in range(FIRST_SAMPLES)]
    assert periods[: FIRST_SAMPLES - 1] == [FIRST_S] * (FIRST_SAMPLES - 1)
    # ...and no more of them than that before its steps are known.
    assert policy.period("outside") == FAST_S


def test_a_loader_bound_process_is_sampled_often_enough_for_its_diagnosis() -> None:
    clock = Clock()
    for share in (WATCH_SHARE, 0.25, 0.5, 0.9):
        policy = MainPolicy(stats_of(0.01, share), lambda: None, clock)
        # The first samples of the wait come as fast as they can: a run of a few
        # seconds needs them all for its diagnosis.
        periods = [
            policy.period("file_read" if i % 3 else "ipc_wait") for i in range(FIRST_SAMPLES)
        ]
        assert periods[: FIRST_SAMPLES - 1] == [FIRST_S] * (FIRST_SAMPLES - 1)
        period = policy.period("file_read")
        assert FAST_S <= period < SLOW_S
        # Then about WAIT_SAMPLES_PER_S samples of the wait a second, whatever its share,
        # while the wait's make-up is uncertain (two kinds of wait here)...
        assert share / period == pytest.approx(WAIT_SAMPLES_PER_S, rel=0.05)
        while policy.taken < KNOWN_SAMPLES - 1:
            assert policy.period("file_read" if policy.taken % 3 else "ipc_wait") == period
        # Once the wait's make-up is known, fewer: the period grows with the share
        # (a sample a second when the wait is 25 %), up to the healthy job's.
        later = policy.period("file_read")
        assert later == pytest.approx(min(SLOW_S, max(period, share / KNOWN_SAMPLES_PER_S)))
        assert later > period or later == SLOW_S


def test_a_wait_of_one_kind_is_known_after_the_first_samples() -> None:
    clock = Clock()
    policy = MainPolicy(stats_of(0.01, 0.25), lambda: None, clock)
    for _ in range(FIRST_SAMPLES):
        policy.period("file_read")
    # 64 samples, all one state: its share is 1 within 3 % (Wilson, 95 %), so the
    # slow rate comes at once, 256 samples (about 50 s of this job) sooner.
    assert policy.known
    assert policy.period("file_read") == pytest.approx(0.25 / KNOWN_SAMPLES_PER_S)


def test_a_wait_on_other_threads_is_sampled_in_full_however_uniform() -> None:
    for state in ("ipc_wait", "socket_wait"):
        policy = MainPolicy(stats_of(0.01, 0.25), lambda: None, Clock())
        # Each of these samples also samples the threads, processes or server waited on:
        # their make-up is what the diagnosis needs, so the count is not cut short.
        while policy.taken < KNOWN_SAMPLES - 1:
            policy.period(state)
            assert not policy.known
        policy.period(state)
        assert policy.known


def test_a_mixed_wait_is_known_once_its_commonest_share_is_narrow() -> None:
    policy = MainPolicy(stats_of(0.01, 0.25), lambda: None, Clock())
    # 90 % file reads: the interval of 0.9 narrows to ±5 % at about 130 samples.
    while not policy.known:
        policy.period("ipc_wait" if policy.taken % 10 == 9 else "file_read")
        assert policy.taken < KNOWN_SAMPLES
    assert 110 <= policy.taken <= 150
    assert wilson_half_width(9, 10) > wilson_half_width(90, 100) > wilson_half_width(900, 1000)
    assert wilson_half_width(64, 64) == pytest.approx(0.0283, abs=1e-3)


def test_a_stall_is_sampled_often_even_where_the_usual_wait_is_watched() -> None:
    clock = Clock()
    since: list[float | None] = [None]
    policy = MainPolicy(stats_of(0.01, 0.5), lambda: since[0], clock)
    for _ in range(KNOWN_SAMPLES):
        policy.period("file_read")
    assert policy.period("file_read") == SLOW_S  # a 50 % wait: woken as a healthy job is
    since[0] = clock.t - STALL_FLOOR_S * 1.01
    assert policy.period("file_read") == FAST_S


def test_wake_ups_that_found_nothing_waiting_do_not_count_as_samples() -> None:
    policy = MainPolicy(stats_of(0.01, 0.9), lambda: None, Clock())
    for _ in range(3 * FIRST_SAMPLES):
        assert policy.period(None) == FIRST_S
    assert policy.taken == 0


def test_healthy_steps_are_sampled_rarely_unless_a_wait_becomes_a_stall() -> None:
    clock = Clock()
    since: list[float | None] = [None]
    policy = MainPolicy(stats_of(0.01, 0.02), lambda: since[0], clock)
    assert policy.period(None) == SLOW_S
    since[0] = clock.t - 0.005  # an ordinary fetch
    assert policy.period("ipc_wait") == SLOW_S
    since[0] = clock.t - STALL_FLOOR_S * 1.01  # 10 usual steps, over the floor: a stall
    assert policy.period("file_read") == FAST_S


def test_the_stall_bar_follows_the_usual_step() -> None:
    clock = Clock()
    since = clock.t - 1.0
    slow_steps = MainPolicy(stats_of(0.5, 0.0), lambda: since, clock)
    assert slow_steps.period(None) == SLOW_S  # a 1 s wait is two usual steps
    clock.t += 1.0
    assert slow_steps.period(None) == FAST_S  # a 2 s wait is four


def test_a_worker_is_sampled_often_while_busy_and_rarely_while_it_waits_for_work() -> None:
    clock = Clock()
    policy = WorkerPolicy(monotonic=clock)
    assert policy.period(None) == WORKER_FAST_S  # starting up: watched
    while policy.period("idle") == WORKER_FAST_S:
        clock.t += WORKER_FAST_S
        assert clock.t < 105.0, "an idle worker kept being sampled often"
    assert policy.busy_share < 0.7
    t_idle = clock.t
    while policy.period("file_read") == SLOW_S:
        clock.t += SLOW_S
        assert clock.t < t_idle + 5.0, "a saturated worker stayed rarely sampled"


@pytest.mark.parametrize(("busy", "most"), [(0.5, 0.3), (0.9, 1.0)])
def test_a_worker_that_keeps_up_is_sampled_rarely(busy: float, most: float) -> None:
    """Over 60 s of a worker busy ``busy`` of every 0.3 s, samples as a share of always-often."""
    clock = Clock()
    policy = WorkerPolicy(monotonic=clock)
    samples = 0
    last: str | None = None
    while clock.t < 160.0:
        clock.t += policy.period(last)
        samples += 1
        last = "transform" if clock.t % 0.3 < 0.3 * busy else "idle"
    share = samples / (60.0 / WORKER_FAST_S)
    assert share <= most
    if busy >= 0.9:
        assert share > 0.9


def test_the_sampler_thread_waits_as_long_as_the_policy_says() -> None:
    asked: list[str | None] = []
    done = threading.Event()

    def period(last: str | None) -> float:
        asked.append(last)
        if len(asked) >= 3:
            sampler._stop.set()
            done.set()
        return 0.0

    work: queue.Queue[None] = queue.Queue()
    worker = threading.Thread(target=work.get)  # a worker waiting for work
    worker.start()
    sampler = StackSampler(
        lambda: [(worker.ident or 0, "worker")],
        lambda record: None,
        lambda exc: None,
        pid=1,
        period=period,
    )
    sampler.start()
    assert done.wait(10)
    work.put(None)
    worker.join()
    assert asked[0] is None  # nothing sampled before the first wait
    assert asked[1] == "idle"  # the sampled stack's state
    assert sampler.wakeups >= 2


def test_steps_shorter_than_the_first_period_are_sampled_faster_at_first() -> None:
    # A loop of 0.2 ms steps that trains for a fraction of a second: one wake-up each
    # 5 ms would give it a dozen samples. Seen stepping faster than that, the first
    # samples come every millisecond - before the steps' statistics are known, and after.
    clock = Clock()
    steps = [0]
    policy = MainPolicy(StepStats(), lambda: None, clock, steps=lambda: steps[0])
    assert policy.period(None) == FIRST_S  # nothing known yet
    clock.t += FIRST_S
    steps[0] += 25  # 25 steps in 5 ms
    assert policy.period("python") == FIRST_SHORT_S
    known = MainPolicy(stats_of(0.0002, 0.6), lambda: None, clock, steps=lambda: steps[0])
    known.period(None)
    clock.t += 0.001
    steps[0] += 5
    assert known.period("python") == FIRST_SHORT_S
    # ordinary steps keep the ordinary first period
    slow = MainPolicy(StepStats(), lambda: None, clock, steps=lambda: steps[0])
    slow.period(None)
    clock.t += 2 * FIRST_S
    steps[0] += 1
    assert slow.period("python") == FIRST_S
    # and the first samples stay as many as before
    for _ in range(FIRST_SAMPLES):
        policy.period("python")
    assert policy.period("python") == FAST_S


def test_a_sampler_on_standby_sleeps_until_woken_and_then_samples_again() -> None:
    outside = [True]
    asked = threading.Event()
    sampled = threading.Event()
    flushed: list[object] = []
    rested = threading.Event()

    def emit(record: object) -> None:
        flushed.append(record)
        rested.set()

    def standby() -> bool:
        asked.set()
        return outside[0]

    def targets() -> list[tuple[int, str]]:
        sampled.set()
        return []

    sampler = StackSampler(
        targets, emit, lambda exc: None, pid=1, period=lambda _last: 0.0,
        standby=standby,
    )  # fmt: skip
    sampler.aggregate.add_classified("transform", "t.py:1 f")  # counted before the hand-over
    sampler.start()
    assert asked.wait(10) and rested.wait(10)
    thread = sampler.thread
    assert thread is not None
    # Asleep on the wake event: a zero period would otherwise spin through targets().
    assert not sampled.is_set() and sampler.wakeups == 0
    assert len(flushed) == 1  # what it had counted went out before it rested
    outside[0] = False
    sampler.wake()
    assert sampled.wait(10)
    sampler.stop()
    assert not thread.is_alive() and sampler.wakeups >= 1


def test_a_sampler_on_standby_stops_at_once() -> None:
    asked = threading.Event()

    def standby() -> bool:
        asked.set()
        return True

    sampler = StackSampler(lambda: [], lambda _r: None, lambda exc: None, pid=1, standby=standby)
    sampler.start()
    assert asked.wait(10)
    sampler.stop()
    assert sampler.thread is not None and not sampler.thread.is_alive()
