"""Where the job's CPU time went, and how long its threads waited for a CPU.

Built from the steady part's host readings (:class:`~trainmedic.record.types.HostSample`),
whose thread fields come from the kernel's per-thread scheduler counters.
Every mean is weighted by the period each reading covers. The measures the
rules judge by:

* ``train_wait_share``: the share of the training thread's time spent
  runnable without a CPU. A step cannot finish while its thread waits, so
  this is (a lower bound of) the time contention costs the training loop.
* ``loader_wait_share``: the share of the DataLoader workers' runnable time
  spent waiting for a CPU (workers run in parallel: what counts is how
  starved they are, not a wall-clock share).
* ``useful_cores``: the CPU the job needs: its training threads, its workers,
  and its helper threads (torch's intra-op pool) only up to what they can do
  while the training thread computes. OpenMP threads spin on a CPU for a while
  after each parallel region; that time shows as the job's CPU, but another
  worker would get it at once, so it is not counted as busy.
* ``throttled_share``: the share of wall time the job's cgroup was stopped by
  its CPU quota; ``steal_pct``: the hypervisor's steal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainmedic.record.spans import sample_intervals
from trainmedic.record.types import HostSample


@dataclass(frozen=True)
class CpuTime:
    """The job's CPU over the steady part (``None``: not measured).

    Attributes:
        readings: host readings with thread measurements.
        train_threads: training threads (mean; ranks on this host).
        train_cpu_cores / helper_cpu_cores / loader_cpu_cores: CPU by role, cores.
        train_wait_share: share of a training thread's time waiting for a CPU, 0..1.
        train_wait_max_share: the same for the most-waiting training thread.
        loader_wait_share: share of the workers' runnable time waiting, 0..1.
        job_wait_cores: the job's threads waiting for a CPU at once, on average.
        job_runnable_cores: the job's threads running or waiting, on average
            (its demand for CPUs).
        steal_pct: hypervisor steal, percent of all cores.
        tool_cpu_cores: trainmedic's own CPU (supervisor, py-spy), cores.
        throttled_share: share of wall time the job's cgroup was throttled, 0..1.
    """

    readings: int = 0
    train_threads: float | None = None
    train_cpu_cores: float | None = None
    helper_cpu_cores: float | None = None
    loader_cpu_cores: float | None = None
    train_wait_share: float | None = None
    train_wait_max_share: float | None = None
    loader_wait_share: float | None = None
    job_wait_cores: float | None = None
    job_runnable_cores: float | None = None
    steal_pct: float | None = None
    throttled_share: float | None = None
    tool_cpu_cores: float | None = None

    def useful_cores(self, job_cpu_cores: float | None, compute_share: float | None,
                     usable_cores: float | None) -> float | None:  # fmt: skip
        """The CPU the job needs, cores: its CPU less what helper threads spin.

        Helper threads (torch's intra-op pool) work only while a training thread
        computes: at most ``compute_share`` x (usable cores - 1) per training
        thread. Without thread measurements, the job's CPU as measured.
        """
        helpers = self.helper_useful_cores(compute_share, usable_cores)
        if self.train_cpu_cores is None or helpers is None:
            return job_cpu_cores
        return self.train_cpu_cores + helpers + (self.loader_cpu_cores or 0.0)

    def helper_useful_cores(self, compute_share: float | None, usable_cores: float | None
                            ) -> float | None:  # fmt: skip
        """The helper threads' CPU that does work, cores: at most ``compute_share`` x
        (usable cores - 1) per training thread; the rest is spinning (``None``: not
        measured)."""
        if self.helper_cpu_cores is None:
            return None
        threads = max(1.0, self.train_threads or 1.0)
        room = max(0.0, (usable_cores or 1.0) - 1.0) * threads
        return min(self.helper_cpu_cores, (compute_share or 0.0) * room)

    def tool_wait_share(self, usable_cores: float | None) -> float:
        """The share of the training thread's time it waited for a CPU that trainmedic's
        own CPU explains, 0..:attr:`train_wait_share`.

        Only what the tool's CPU pushes beyond the cores displaces the job: with the job's
        threads filling ``usable_cores``, each core-second the tool runs is taken from
        them evenly, so a training thread loses ``tool / max(runnable, cores)`` of its
        time (0.08 cores of supervisor and py-spy beside two busy threads on 2 cores: 4 %).
        """
        wait, tool = self.train_wait_share, self.tool_cpu_cores
        runnable = self.job_runnable_cores
        if not wait or not tool or runnable is None or not usable_cores:
            return 0.0
        displaced = min(tool, max(0.0, runnable + tool - usable_cores))
        return min(wait, displaced / max(runnable, usable_cores))


def measure(host: Sequence[HostSample]) -> CpuTime:
    """:class:`CpuTime` of the readings (the steady part's, in time order)."""
    host = sorted(host, key=lambda h: h.t)
    if not host:
        return CpuTime()
    periods = _periods([h.t for h in host])
    every = list(zip(host, periods, strict=True))
    measured = [(h, p) for h, p in every if h.train_threads]

    def mean(value: Callable[[HostSample], float | None], rows: Sequence[tuple[HostSample, float]]
             ) -> float | None:  # fmt: skip
        num = den = 0.0
        for h, p in rows:
            v = value(h)
            if v is not None:
                num += v * p
                den += p
        return num / den if den > 0 else None

    any_threads = [(h, p) for h, p in every if h.job_threads]
    loaders = [(h, p) for h, p in any_threads if h.loader_cpu_cores is not None]
    loader_cpu = mean(lambda h: h.loader_cpu_cores, loaders)
    loader_wait = mean(lambda h: h.loader_wait_cores, loaders)
    loader_share = None
    if loader_cpu is not None and loader_wait is not None and loader_cpu + loader_wait > 0:
        loader_share = loader_wait / (loader_cpu + loader_wait)
    job_wait = mean(lambda h: h.job_wait_cores, any_threads)
    job_cpu = mean(lambda h: h.job_cpu_pct / 100.0, any_threads)
    return CpuTime(
        readings=len(measured),
        train_threads=mean(lambda h: float(h.train_threads or 0), measured),
        train_cpu_cores=mean(lambda h: h.train_cpu_cores, measured),
        helper_cpu_cores=mean(lambda h: h.helper_cpu_cores, measured),
        loader_cpu_cores=loader_cpu,
        train_wait_share=mean(
            lambda h: (h.train_wait_cores or 0.0) / (h.train_threads or 1), measured
        ),
        train_wait_max_share=mean(lambda h: h.train_wait_max_share, measured),
        loader_wait_share=loader_share,
        job_wait_cores=job_wait,
        job_runnable_cores=None if job_wait is None or job_cpu is None else job_wait + job_cpu,
        steal_pct=mean(lambda h: h.steal_pct, every),
        throttled_share=_throttled_share(host),
        tool_cpu_cores=mean(
            lambda h: None if h.tool_cpu_pct is None else h.tool_cpu_pct / 100.0, every
        ),
    )


def contended_intervals(
    host: Sequence[HostSample], min_wait_share: float
) -> list[tuple[float, float]]:
    """Periods in which a training thread waited at least ``min_wait_share`` for a CPU."""
    host = sorted(host, key=lambda h: h.t)
    periods = _periods([h.t for h in host])
    return [
        (h.t - p, h.t)
        for h, p in zip(host, periods, strict=True)
        if h.train_wait_max_share is not None and h.train_wait_max_share >= min_wait_share
    ]


def _periods(times: Sequence[float]) -> list[float]:
    """Seconds each reading covers: since the previous one (the first: the median gap)."""
    return [b - a for a, b in sample_intervals(times)]


def _throttled_share(host: Sequence[HostSample]) -> float | None:
    """Throttled seconds gained over the wall seconds between readings of the counter."""
    known = [(h.t, h.cgroup_throttled_s) for h in host if h.cgroup_throttled_s is not None]
    if len(known) < 2:
        return None
    gained = wall = 0.0
    for (t0, c0), (t1, c1) in itertools.pairwise(known):
        if t1 > t0 and c0 is not None and c1 is not None and c1 >= c0:
            gained += c1 - c0
            wall += t1 - t0
    return min(1.0, gained / wall) if wall > 0 else None
