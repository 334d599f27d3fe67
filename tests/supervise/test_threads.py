"""The job's threads by role: CPU and run-queue wait over each period, within a CPU budget."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from trainmedic.host.schedstat import TaskTimes
from trainmedic.supervise.observe.threads import ROLE_TRAIN, ROLE_WORKER, ThreadSampler

S = 1_000_000_000  # ns


class FakeProc:
    """Scheduler counters per (pid, tid), advanced by the test."""

    def __init__(self) -> None:
        self.tasks: dict[int, dict[int, TaskTimes]] = {}

    def add(self, pid: int, tid: int, run_s: float = 0.0, wait_s: float = 0.0) -> None:
        old = self.tasks.setdefault(pid, {}).get(tid, TaskTimes(0, 0, 0))
        self.tasks[pid][tid] = TaskTimes(
            old.run_ns + int(run_s * S), old.wait_ns + int(wait_s * S), old.slices + 1
        )

    def read(self, pid: int) -> Mapping[int, TaskTimes]:
        return dict(self.tasks.get(pid, {}))


def make(proc: FakeProc, roles: dict[int, str], cost: list[float] | None = None) -> ThreadSampler:
    clock = iter(cost or [0.0] * 1000)
    return ThreadSampler(lambda: roles, read=proc.read, cpu_clock=lambda: next(clock))


def test_the_first_reading_is_a_baseline_then_deltas_split_by_role() -> None:
    proc = FakeProc()
    roles = {100: ROLE_TRAIN, 200: ROLE_WORKER}
    for pid, tid in ((100, 100), (100, 101), (200, 200), (300, 300)):
        proc.add(pid, tid, 1.0, 1.0)
    sampler = make(proc, roles)
    assert sampler.read([100, 200, 300], now=10.0) is None
    proc.add(100, 100, run_s=0.8, wait_s=1.2)  # the training thread waited 60 % of 2 s
    proc.add(100, 101, run_s=0.4, wait_s=0.2)  # an intra-op thread
    proc.add(200, 200, run_s=1.5, wait_s=0.5)  # a DataLoader worker
    proc.add(300, 300, run_s=0.1, wait_s=0.1)  # a launcher
    r = sampler.read([100, 200, 300], now=12.0)
    assert r is not None
    assert r.period_s == 2.0
    assert r.train_threads == 1
    assert r.train_cpu_cores == pytest.approx(0.4)
    assert r.train_wait_cores == pytest.approx(0.6)
    assert r.train_wait_max_share == pytest.approx(0.6)
    assert r.helper_cpu_cores == pytest.approx(0.2)
    assert r.helper_wait_cores == pytest.approx(0.1)
    assert r.loader_cpu_cores == pytest.approx(0.75)
    assert r.loader_wait_cores == pytest.approx(0.25)
    assert r.job_wait_cores == pytest.approx((1.2 + 0.2 + 0.5 + 0.1) / 2)
    assert r.job_threads == 4


def test_without_a_training_process_the_train_values_are_unknown() -> None:
    proc = FakeProc()
    proc.add(1, 1)
    sampler = make(proc, {})
    sampler.read([1], 0.0)
    proc.add(1, 1, 0.5, 0.25)
    r = sampler.read([1], 1.0)
    assert r is not None
    assert r.train_threads == 0
    assert r.train_wait_cores is None and r.train_wait_max_share is None
    assert r.loader_cpu_cores is None
    assert r.job_wait_cores == pytest.approx(0.25)


def test_a_thread_first_seen_counts_from_the_next_reading() -> None:
    proc = FakeProc()
    proc.add(1, 1)
    sampler = make(proc, {1: ROLE_TRAIN})
    sampler.read([1], 0.0)
    proc.add(1, 2, run_s=5.0, wait_s=5.0)  # lived before; its past is not this period's
    r = sampler.read([1], 1.0)
    assert r is not None and r.helper_cpu_cores == 0.0 and r.job_threads == 2
    proc.add(1, 2, run_s=0.5)
    r = sampler.read([1], 2.0)
    assert r is not None and r.helper_cpu_cores == pytest.approx(0.5)


def test_ranks_sum_and_the_worst_waiting_rank_is_kept() -> None:
    proc = FakeProc()
    roles = {1: ROLE_TRAIN, 2: ROLE_TRAIN}
    proc.add(1, 1)
    proc.add(2, 2)
    sampler = make(proc, roles)
    sampler.read([1, 2], 0.0)
    proc.add(1, 1, run_s=0.9, wait_s=0.1)
    proc.add(2, 2, run_s=0.3, wait_s=0.7)
    r = sampler.read([1, 2], 1.0)
    assert r is not None
    assert r.train_threads == 2
    assert r.train_wait_cores == pytest.approx(0.8)
    assert r.train_wait_max_share == pytest.approx(0.7)


def test_costly_readings_are_spread_out_to_stay_within_the_budget() -> None:
    proc = FakeProc()
    proc.add(1, 1)
    # Each reading costs 10 ms of CPU: at a 0.4 % budget and 1 s periods, every 3rd.
    ticks = []
    for i in range(20):
        ticks += [i * 1.0, i * 1.0 + 0.010]
    sampler = make(proc, {1: ROLE_TRAIN}, cost=ticks)
    results = [sampler.read([1], float(t)) for t in range(12)]
    taken = [i for i, r in enumerate(results) if r is not None]
    assert sampler.stride == 3
    assert taken == [3, 6, 9]  # the first is the baseline; each covers 3 s
    assert results[3] is not None and results[3].period_s == 3.0


def test_roles_come_from_what_the_probes_said() -> None:
    from trainmedic.channel.wire import Heartbeat, Hello
    from trainmedic.supervise.observe.observers import _roles
    from trainmedic.supervise.observe.processes import ProcessTable

    table = ProcessTable()

    def hello(pid: int, role: str) -> None:
        table.hello(Hello(pid, 1, role, ("python",), None, None, "3.11", "python", 0.0))

    hello(10, "process")  # trains: its heartbeat counts steps
    hello(11, "worker")
    hello(12, "process")  # a launcher: no steps
    table.update(10, last_heartbeat=Heartbeat(10, 1.0, 5, "train", "forward", (), 1.0))
    table.update(12, last_heartbeat=Heartbeat(12, 1.0, 0, "train", "other", (), 0.1))
    assert _roles(table) == {10: ROLE_TRAIN, 11: ROLE_WORKER}
