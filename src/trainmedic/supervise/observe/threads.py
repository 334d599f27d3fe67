"""Where the job's threads spend their time: on a CPU, or waiting in a run queue for one.

Contention is measured where it hurts: a thread that is ready to run but
gets no CPU (another process has it, the hypervisor stole it, the cgroup
quota is spent) accrues *run-queue delay* in its scheduler counters
(:mod:`trainmedic.host.schedstat`). :class:`ThreadSampler` reads every thread
of the job's process tree at each host reading and splits the deltas by
role, from what the probes told the supervisor:

* ``train``: the main thread of each process that marks training steps (the
  training thread; a process that trains on another thread is rare);
* ``helper``: the other threads of those processes (torch's intra-op pool,
  the pin-memory thread, the probe's own);
* ``loader``: every thread of the DataLoader worker processes;
* everything else (launchers, shells) counts only in the job totals.

Cost: a few microseconds per thread. The sampler measures its own CPU and
reads less often when a job has so many threads that one reading a second
would cost more than :data:`THREAD_CPU_BUDGET` of a core; the counters are
cumulative, so a longer period loses nothing but resolution.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trainmedic.host.schedstat import TaskTimes, read_tasks

THREAD_CPU_BUDGET = 0.004
"""Share of one core the thread readings may use (the supervisor's whole budget is 2 %)."""
ROLE_TRAIN = "train"
ROLE_WORKER = "worker"

Roles = Callable[[], Mapping[int, str]]
"""Returns the roles known now: pid -> ``train`` or ``worker`` (others are absent)."""


@dataclass(frozen=True)
class ThreadReading:
    """The job's threads over one period, in cores (seconds per second).

    Attributes:
        period_s: seconds since the previous reading.
        train_threads: training threads measured (``0`` when no process is known
            to train yet: the ``train_*`` values are then ``None``).
        train_wait_max_share: the largest share of the period one training
            thread waited for a CPU, 0..1.
    """

    period_s: float
    train_threads: int
    train_cpu_cores: float | None
    train_wait_cores: float | None
    train_wait_max_share: float | None
    helper_cpu_cores: float | None
    helper_wait_cores: float | None
    loader_cpu_cores: float | None
    loader_wait_cores: float | None
    job_wait_cores: float
    job_threads: int


class ThreadSampler:
    """Deltas of every job thread's scheduler counters between two calls of :meth:`read`.

    Args:
        roles: what the probes said about each process (see :data:`Roles`).
        read: one process's threads (``read_tasks``; tests pass a fake).
        cpu_clock: this thread's CPU time, to keep within ``budget``.
    """

    def __init__(
        self,
        roles: Roles,
        read: Callable[[int], Mapping[int, TaskTimes]] = read_tasks,
        cpu_clock: Callable[[], float] = time.thread_time,
        budget: float = THREAD_CPU_BUDGET,
    ) -> None:
        self._roles = roles
        self._read = read
        self._cpu = cpu_clock
        self._budget = budget
        self._last: dict[tuple[int, int], TaskTimes] = {}
        self._last_t: float | None = None
        self._skip = 0
        self._calls = 0
        self.stride = 1
        self.cost_s = 0.0

    def read(self, pids: Iterable[int], now: float) -> ThreadReading | None:
        """The period since the previous reading (``None`` for the first, or when
        this call is skipped to keep within the budget). ``now``: monotonic seconds."""
        self._calls += 1
        if self._skip > 0:
            self._skip -= 1
            return None
        cpu0 = self._cpu()
        roles = dict(self._roles())
        current: dict[tuple[int, int], TaskTimes] = {}
        for pid in pids:
            for tid, times in self._read(pid).items():
                current[(pid, tid)] = times
        reading = self._delta(current, roles, now)
        self._last, self._last_t = current, now
        cost = max(0.0, self._cpu() - cpu0)
        self.cost_s += cost
        # The caller's period: this reading covered ``calls`` calls of it.
        calls, self._calls = self._calls, 0
        period = reading.period_s / calls if reading is not None else 1.0
        # Read every ``stride``-th call so that cost / (stride x period) <= budget.
        self.stride = max(1, math.ceil(cost / (self._budget * max(period, 1e-3))))
        self._skip = self.stride - 1
        return reading

    def _delta(
        self, current: Mapping[tuple[int, int], TaskTimes], roles: Mapping[int, str], now: float
    ) -> ThreadReading | None:
        last_t = self._last_t
        if last_t is None or now <= last_t:
            return None
        dt = now - last_t
        train_pids = {pid for pid, role in roles.items() if role == ROLE_TRAIN}
        sums = {k: 0.0 for k in ("tr", "tw", "hr", "hw", "lr", "lw", "jw")}
        train_threads = 0
        worst = 0.0
        loaders = False
        for (pid, tid), now_times in current.items():
            before = self._last.get((pid, tid))
            if before is None:
                continue  # a thread first seen now: its counters start at the next reading
            run = max(0, now_times.run_ns - before.run_ns) / 1e9
            wait = max(0, now_times.wait_ns - before.wait_ns) / 1e9
            sums["jw"] += wait
            if pid in train_pids:
                if tid == pid:
                    train_threads += 1
                    sums["tr"] += run
                    sums["tw"] += wait
                    worst = max(worst, wait / dt)
                else:
                    sums["hr"] += run
                    sums["hw"] += wait
            elif roles.get(pid) == ROLE_WORKER:
                loaders = True
                sums["lr"] += run
                sums["lw"] += wait
        trained = train_threads > 0

        def cores(key: str, known: bool) -> float | None:
            return sums[key] / dt if known else None

        return ThreadReading(
            period_s=dt,
            train_threads=train_threads,
            train_cpu_cores=cores("tr", trained),
            train_wait_cores=cores("tw", trained),
            train_wait_max_share=min(1.0, worst) if trained else None,
            helper_cpu_cores=cores("hr", trained),
            helper_wait_cores=cores("hw", trained),
            loader_cpu_cores=cores("lr", loaders),
            loader_wait_cores=cores("lw", loaders),
            job_wait_cores=sums["jw"] / dt,
            job_threads=len(current),
        )
