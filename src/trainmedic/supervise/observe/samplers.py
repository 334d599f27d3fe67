"""Readings the supervisor takes itself: GPUs through the backend, the host through psutil.

Each sampler has ``sample_once()`` (one reading, handed to its sink) and runs
in a :class:`SamplerThread`. Clocks are parameters, so tests drive a sampler
reading by reading with fake time.

Rates fit costs. A GPU reading through NVML costs a few milliseconds of CPU
(PCIe traffic comes from byte counters; only drivers without them block
~40 ms in the throughput query, and then every 10 s at most: see
:mod:`trainmedic.gpu.nvml`): the GPU sampler measures each round and stretches
its period so that rounds never overlap and its CPU stays under
:data:`GPU_CPU_BUDGET` of one core. The host reading (the job's process tree,
system CPU, disks, network, memory) is taken every second.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample
from trainmedic.host import ps
from trainmedic.record.events import EventKind
from trainmedic.record.types import HostSample, RunEvent
from trainmedic.supervise.observe.census import ProcessCensus
from trainmedic.supervise.observe.threads import ThreadReading, ThreadSampler

GPU_PERIOD_S = 1.0
"""Seconds between GPU readings when they are cheap."""
GPU_CPU_BUDGET = 0.01
"""Share of one core the GPU sampler may use."""
GPU_MAX_FAILURES = 5
"""Consecutive failed rounds after which GPU sampling stops (with an event)."""
HOST_PERIOD_S = 1.0
"""Seconds between host readings, at least."""
HOST_CPU_BUDGET = 0.01
"""Share of one core the host reading may use: where a reading costs more (a job
of hundreds of processes, a machine of thousands, a slow ``/proc``), the readings
are spaced out so that the supervisor - on the same cores as the job - keeps to it.
A reading of a one-process job costs about 2 ms here (docs/performance.md)."""


class SamplerThread(threading.Thread):
    """Calls ``sample_once()`` (which returns the next period in seconds) until stopped."""

    def __init__(
        self, name: str, sample_once: Callable[[], float], on_error: Callable[[BaseException], None]
    ) -> None:
        super().__init__(name=f"trainmedic-{name}", daemon=True)
        self._sample_once = sample_once
        self._on_error = on_error
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                period = self._sample_once()
            except Exception as exc:
                self._on_error(exc)
                return
            # A stopped sampler returns inf: sleep until told to stop.
            if self._stop_event.wait(period if math.isfinite(period) else None):
                return

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)


class GpuSampler:
    """Reads every GPU of the backend each round and adapts its period to the cost.

    Args:
        sink: receives each :class:`GpuSample`.
        on_event: told once when sampling gives up.
    """

    def __init__(
        self,
        backend: GpuBackend,
        sink: Callable[[GpuSample], None],
        on_event: Callable[[RunEvent], None],
        base_period_s: float = GPU_PERIOD_S,
        cpu_budget: float = GPU_CPU_BUDGET,
        monotonic: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self._sink = sink
        self._on_event = on_event
        self.base_period_s = base_period_s
        self._budget = cpu_budget
        self._monotonic = monotonic
        self._cpu = cpu_clock
        self._wall = wall
        self._count = backend.device_count()
        self._failures = 0
        self.period_s = base_period_s
        self.rounds = 0
        self.stopped = self._count == 0

    def sample_once(self) -> float:
        """One reading of every GPU; returns seconds until the next (inf when stopped)."""
        if self.stopped:
            return float("inf")
        wall0, cpu0 = self._monotonic(), self._cpu()
        errors: list[str] = []
        for index in range(self._count):
            try:
                sample = self._backend.sample(index)
            except Exception as exc:
                errors.append(f"GPU {index}: {type(exc).__name__}: {exc}")
                continue
            self._sink(sample)
        wall_cost = self._monotonic() - wall0
        cpu_cost = self._cpu() - cpu0
        self.rounds += 1
        if errors and len(errors) == self._count:
            self._failures += 1
            if self._failures >= GPU_MAX_FAILURES:
                self.stopped = True
                self._on_event(
                    RunEvent(
                        t=self._wall(),
                        kind=EventKind.SAMPLER_ERROR,
                        message=(
                            f"GPU sampling stopped after {self._failures} failed rounds: "
                            f"{errors[0]}"
                        ),
                        data={"errors": errors},
                    )
                )
                return float("inf")
        else:
            self._failures = 0
        self.period_s = max(self.base_period_s, wall_cost * 1.25, cpu_cost / self._budget)
        return max(0.0, self.period_s - wall_cost)


@dataclass
class _Seen:
    process: ps.Process
    cpu_s: float


def usable_cores(pid: int, cgroup_quota: float | None) -> float:
    """min(logical cores, CPU affinity of ``pid``, cgroup quota)."""
    limits: list[float] = [float(os.cpu_count() or 1)]
    with contextlib.suppress(ps.Error, AttributeError, OSError):
        limits.append(float(len(ps.Process(pid).cpu_affinity() or [])) or limits[0])
    if cgroup_quota:
        limits.append(cgroup_quota)
    return min(limits)


class HostSampler:
    """The host and the job's process tree, one reading per call.

    The job's CPU is summed over every process in its tree (DataLoader workers
    included); the psutil objects are kept between readings so per-process CPU
    deltas work, and a reused pid is told apart by its creation time.
    Rates are over the time since the previous reading; the first call only
    takes the baseline and returns ``None``.

    Args:
        root_pid: the job's leader.
        tree: the job's processes now (the launcher's view: leader's tree plus
            adopted orphans).
        threads: reads the job's threads' scheduler counters (run-queue delay).
        census: remembers every process of the tree (the probe's reach).
        helpers: the pids of trainmedic's own helper processes now (py-spy sampling
            the job from outside): their CPU counts as the supervisor's own, so that
            it is never taken for another tenant's load.
    """

    def __init__(
        self,
        root_pid: int,
        sink: Callable[[HostSample], None],
        tree: Callable[[], list[ps.Process]] | None = None,
        cgroup_cpu: Callable[[], tuple[float | None, float | None]] | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        period_s: float = HOST_PERIOD_S,
        threads: ThreadSampler | None = None,
        census: ProcessCensus | None = None,
        cpu_budget: float = HOST_CPU_BUDGET,
        cpu_clock: Callable[[], float] = time.thread_time,
        helpers: Callable[[], Sequence[int]] | None = None,
    ) -> None:
        self.root_pid = root_pid
        self._helpers = helpers
        self._helper_cpu: dict[int, tuple[ps.Process, float]] = {}
        self.cpu_budget = cpu_budget
        self._cpu_clock = cpu_clock
        self.last_cost_s = 0.0
        """CPU seconds the latest reading took (this thread's)."""
        self.threads = threads
        self.census = census
        self._sink = sink
        self._tree = tree or self._default_tree
        self._cgroup_cpu = cgroup_cpu or (lambda: (None, None))
        self._wall = wall
        self._monotonic = monotonic
        self.period_s = period_s
        self._seen: dict[tuple[int, float], _Seen] = {}
        self._self = ps.Process()
        self._last_t: float | None = None
        self._last_wall: float | None = None
        self._last_since_boot: float | None = None
        self._last_self_cpu = 0.0
        self._last_cpu: object | None = None
        self._last_disk: object | None = None
        self._last_net: tuple[int, int] | None = None
        self.pids_seen: dict[int, float] = {}

    def _default_tree(self) -> list[ps.Process]:
        try:
            root = ps.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except ps.Error:
            return []

    def sample_once(self) -> float:
        """One reading; returns the seconds until the next: :attr:`period_s`, or longer
        where the reading cost more than :attr:`cpu_budget` of a core over that."""
        cpu0 = self._cpu_clock()
        sample = self.read()
        if sample is not None:
            self._sink(sample)
        self.last_cost_s = max(0.0, self._cpu_clock() - cpu0)
        return max(self.period_s, self.last_cost_s / self.cpu_budget)

    def _helpers_cpu_s(self) -> float:
        """CPU seconds the helper processes used since the last reading (a helper that
        started meanwhile: all of its CPU; one that ended meanwhile: its last part is
        not seen, a few milliseconds)."""
        if self._helpers is None:
            return 0.0
        total = 0.0
        seen: dict[int, tuple[ps.Process, float]] = {}
        for pid in self._helpers():
            known = self._helper_cpu.get(pid)
            try:
                proc = known[0] if known is not None else ps.Process(pid)
                times = proc.cpu_times()
            except ps.Error:
                continue
            cpu = times.user + times.system
            total += max(0.0, cpu - (known[1] if known is not None else 0.0))
            seen[pid] = (proc, cpu)
        self._helper_cpu = seen
        return total

    def read(self) -> HostSample | None:
        now = self._monotonic()
        wall = self._wall()
        since_boot = _since_boot()
        job_cpu_s, rss, count = self._tree_cpu(wall)
        threads = self._read_threads(now)  # the first call takes its baseline
        self._last_wall = wall
        self._last_since_boot = since_boot
        cpu = ps.cpu_times()
        disk = _disk()
        net = _net()
        self_cpu = sum(self._self.cpu_times()[:2])
        helpers_cpu = self._helpers_cpu_s()
        last_t = self._last_t
        previous_cpu, previous_disk, previous_net = self._last_cpu, self._last_disk, self._last_net
        previous_self = self._last_self_cpu
        self._last_t, self._last_cpu, self._last_disk, self._last_net = now, cpu, disk, net
        self._last_self_cpu = self_cpu
        if last_t is None or now <= last_t:
            return None
        dt = now - last_t
        busy_pct, iowait_pct = _cpu_shares(previous_cpu, cpu)
        logical = os.cpu_count() or 1
        job_pct = 100.0 * job_cpu_s / dt
        own_pct = 100.0 * (max(0.0, self_cpu - previous_self) + helpers_cpu) / dt
        others = None
        if busy_pct is not None:
            others = max(0.0, busy_pct * logical - job_pct - own_pct)
        quota, throttled = self._cgroup_cpu()
        mem = ps.virtual_memory()
        swap = ps.swap_memory()
        return HostSample(
            t=wall,
            job_cpu_pct=job_pct,
            job_rss_bytes=rss,
            job_processes=count,
            system_cpu_pct=busy_pct if busy_pct is not None else 0.0,
            usable_cores=usable_cores(self.root_pid, quota),
            iowait_pct=iowait_pct,
            disk_read_bytes_per_s=_rate(previous_disk, disk, 0, dt),
            disk_write_bytes_per_s=_rate(previous_disk, disk, 1, dt),
            net_recv_bytes_per_s=_rate(previous_net, net, 0, dt),
            net_sent_bytes_per_s=_rate(previous_net, net, 1, dt),
            mem_available_bytes=int(mem.available),
            swap_used_bytes=int(swap.used),
            others_cpu_pct=others,
            cgroup_throttled_s=throttled,
            steal_pct=_steal_pct(previous_cpu, cpu),
            train_threads=threads.train_threads or None if threads else None,
            train_cpu_cores=threads.train_cpu_cores if threads else None,
            train_wait_cores=threads.train_wait_cores if threads else None,
            train_wait_max_share=threads.train_wait_max_share if threads else None,
            helper_cpu_cores=threads.helper_cpu_cores if threads else None,
            helper_wait_cores=threads.helper_wait_cores if threads else None,
            loader_cpu_cores=threads.loader_cpu_cores if threads else None,
            loader_wait_cores=threads.loader_wait_cores if threads else None,
            job_wait_cores=threads.job_wait_cores if threads else None,
            job_threads=threads.job_threads if threads else None,
            tool_cpu_pct=own_pct,
        )

    def _read_threads(self, now: float) -> ThreadReading | None:
        if self.threads is None:
            return None
        try:
            return self.threads.read([key[0] for key in self._seen], now)
        except Exception:
            return None  # scheduler counters only refine the reading

    def _started_since_last(self, create_time: float) -> bool:
        """Whether a process that started at ``create_time`` (psutil's) started after
        the previous reading.

        psutil's start times are whole-second boot times plus clock ticks, up to
        a second off the wall clock, so they are compared as time since boot,
        where they are exact to a tick (10 ms: a process that started in the
        tick before the reading counts in full, at most 10 ms of CPU too much).
        """
        if self._last_since_boot is None:
            return False
        try:
            started = create_time - ps.boot_time()
        except (ps.Error, OSError):
            return False
        return started >= self._last_since_boot - _TICK_S

    def _tree_cpu(self, wall: float) -> tuple[float, int, int]:
        """(CPU seconds the tree used since the last reading, RSS bytes, processes)."""
        delta = 0.0
        rss = 0
        current: dict[tuple[int, float], _Seen] = {}
        for p in self._tree():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    times = p.cpu_times()
                    cpu_s = times.user + times.system
                    rss += p.memory_info().rss
                    if self.census is not None:
                        self.census.observe(p, key, cpu_s, wall)
            except ps.Error:
                continue
            previous = self._seen.get(key)
            # A process first seen now: count what it used since it started,
            # when that was after the previous reading.
            if previous is not None:
                delta += max(0.0, cpu_s - previous.cpu_s)
            elif self._started_since_last(key[1]):
                delta += cpu_s
            current[key] = previous or _Seen(p, cpu_s)
            current[key].cpu_s = cpu_s
            self.pids_seen[p.pid] = key[1]
        self._seen = current
        return delta, rss, len(current)


_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
"""One clock tick, the resolution of process start times, seconds."""


def _since_boot() -> float:
    """Seconds since boot on the clock process start times count in (Linux),
    the monotonic clock elsewhere."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic()
    return time.clock_gettime(boottime)


def _cpu_shares(before: object | None, after: object) -> tuple[float | None, float | None]:
    """(busy %, iowait %) of all logical cores between two ``ps.cpu_times()``."""
    if before is None:
        return None, None

    def total(t: object) -> float:
        return float(sum(t))  # type: ignore[call-overload]

    span = total(after) - total(before)
    if span <= 0:
        return None, None
    idle = getattr(after, "idle", 0.0) - getattr(before, "idle", 0.0)
    iowait_s = getattr(after, "iowait", None)
    io = None if iowait_s is None else iowait_s - getattr(before, "iowait", 0.0)
    busy = span - idle - (io or 0.0)
    return (
        max(0.0, min(100.0, 100.0 * busy / span)),
        None if io is None else max(0.0, min(100.0, 100.0 * io / span)),
    )


def _steal_pct(before: object | None, after: object) -> float | None:
    """CPU time stolen by the hypervisor between two ``ps.cpu_times()``, percent."""
    if before is None or getattr(after, "steal", None) is None:
        return None
    span = float(sum(after)) - float(sum(before))  # type: ignore[call-overload]
    if span <= 0:
        return None
    steal = getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)
    return max(0.0, min(100.0, 100.0 * steal / span))


def _disk() -> tuple[int, int] | None:
    try:
        counters = ps.disk_io_counters()
    except (OSError, RuntimeError):
        return None
    if counters is None:
        return None
    return int(counters.read_bytes), int(counters.write_bytes)


def _net() -> tuple[int, int] | None:
    """Bytes received and sent on every interface but loopback (the channel's is not data)."""
    try:
        per_nic = ps.net_io_counters(pernic=True)
    except (OSError, RuntimeError):
        return None
    recv = sent = 0
    for name, c in per_nic.items():
        if name == "lo" or name.startswith("lo:"):
            continue
        recv += int(c.bytes_recv)
        sent += int(c.bytes_sent)
    return recv, sent


def _rate(before: object | None, after: object | None, index: int, dt: float) -> float | None:
    if before is None or after is None or dt <= 0:
        return None
    b = before[index]  # type: ignore[index]
    a = after[index]  # type: ignore[index]
    return max(0.0, float(a - b) / dt)
