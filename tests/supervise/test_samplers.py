"""Samplers: GPU readings at a rate fitting their cost; the whole job process tree on the host."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from trainmedic.gpu.simulated import SimulatedBackend
from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import HostSample, RunEvent
from trainmedic.supervise.observe.samplers import GpuSampler, HostSampler, SamplerThread


def make_backend(gpus: int = 2) -> SimulatedBackend:
    return SimulatedBackend.from_dict(
        {
            "driver": {"version": "550.54.15", "cuda_version": "12.4"},
            "gpus": [
                {"name": "NVIDIA A100", "uuid": f"GPU-{i}", "memory_total_bytes": 80 * 2**30}
                for i in range(gpus)
            ],
        }
    )


class CostlyBackend:
    """A backend whose every reading costs ``wall_s`` and ``cpu_s`` on fake clocks."""

    def __init__(
        self, inner: SimulatedBackend, clocks: dict[str, float], wall_s: float, cpu_s: float
    ) -> None:
        self.inner = inner
        self.clocks = clocks
        self.wall_s = wall_s
        self.cpu_s = cpu_s
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self, index: int) -> GpuSample:
        self.clocks["wall"] += self.wall_s
        self.clocks["cpu"] += self.cpu_s
        if self.fail:
            raise RuntimeError("NVML gone")
        return self.inner.sample(index)


def make_sampler(
    wall_s: float, cpu_s: float
) -> tuple[GpuSampler, CostlyBackend, list[GpuSample], list[RunEvent]]:
    clocks = {"wall": 0.0, "cpu": 0.0}
    backend = CostlyBackend(make_backend(), clocks, wall_s, cpu_s)
    samples: list[GpuSample] = []
    events: list[RunEvent] = []
    sampler = GpuSampler(
        backend,  # type: ignore[arg-type]
        samples.append,
        events.append,
        monotonic=lambda: clocks["wall"],
        cpu_clock=lambda: clocks["cpu"],
        wall=lambda: 1000.0,
    )
    return sampler, backend, samples, events


def test_cheap_readings_come_every_second() -> None:
    sampler, _, samples, _ = make_sampler(wall_s=0.002, cpu_s=0.0005)
    wait = sampler.sample_once()
    assert [s.index for s in samples] == [0, 1]
    assert sampler.period_s == 1.0
    assert wait == pytest.approx(1.0 - 0.004)


def test_slow_readings_stretch_the_period_so_rounds_never_overlap() -> None:
    # NVML blocks ~40 ms per GPU for PCIe counters; eight such GPUs take 0.9 s.
    sampler, _, _, _ = make_sampler(wall_s=0.45, cpu_s=0.001)
    sampler.sample_once()
    assert sampler.period_s == pytest.approx(0.9 * 1.25)


def test_cpu_hungry_readings_are_kept_under_the_budget() -> None:
    sampler, _, _, _ = make_sampler(wall_s=0.02, cpu_s=0.02)
    sampler.sample_once()
    assert sampler.period_s == pytest.approx(0.04 / 0.01)


def test_sampling_stops_with_one_event_after_repeated_failures() -> None:
    sampler, backend, samples, events = make_sampler(wall_s=0.001, cpu_s=0.0)
    backend.fail = True
    waits = [sampler.sample_once() for _ in range(6)]
    assert samples == []
    assert waits[-1] == float("inf") and sampler.stopped
    (event,) = events
    assert event.kind == "sampler_error"
    assert "NVML gone" in event.message


def test_no_gpus_means_no_sampling() -> None:
    sampler = GpuSampler(make_backend(gpus=0), lambda s: None, lambda e: None)
    assert sampler.stopped
    assert sampler.sample_once() == float("inf")


def test_a_sampler_thread_stops_promptly_even_when_idle() -> None:
    thread = SamplerThread("t", lambda: float("inf"), lambda e: None)
    thread.start()
    started = time.monotonic()
    thread.stop(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2


SPIN = "import time\nwhile True:\n    pass\n"


@pytest.fixture
def busy_job() -> Iterator[psutil.Process]:
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def _wait_for_cpu(p: psutil.Process, seconds: float) -> None:
    """Until ``p`` has used ``seconds`` more CPU (the condition we need, not a guess)."""
    start = sum(p.cpu_times()[:2])
    deadline = time.monotonic() + 30
    while sum(p.cpu_times()[:2]) - start < seconds:
        assert time.monotonic() < deadline, "the busy job got no CPU"
        time.sleep(0.02)


def test_the_host_reading_measures_the_jobs_cpu(busy_job: psutil.Process) -> None:
    readings: list[HostSample] = []
    sampler = HostSampler(busy_job.pid, readings.append)
    assert sampler.read() is None  # the first call only takes the baseline
    _wait_for_cpu(busy_job, 0.3)
    sample = sampler.read()
    assert sample is not None
    assert sample.job_processes == 1
    assert sample.job_cpu_pct > 20.0  # one spinning process, on a shared machine
    assert sample.job_rss_bytes > 1_000_000
    assert 0.0 <= sample.system_cpu_pct <= 100.0
    assert sample.usable_cores >= 1
    assert sample.mem_available_bytes > 0
    assert sample.others_cpu_pct is not None and sample.others_cpu_pct >= 0.0


def test_a_process_started_between_readings_counts_in_full(busy_job: psutil.Process) -> None:
    extra: list[psutil.Process] = []
    now = [0.0]  # one second between the readings, however long the machine takes
    sampler = HostSampler(
        busy_job.pid, lambda s: None, tree=lambda: [busy_job, *extra], monotonic=lambda: now[0]
    )
    sampler.read()
    busy_from = sum(busy_job.cpu_times()[:2])
    worker = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        extra.append(psutil.Process(worker.pid))
        _wait_for_cpu(extra[0], 0.3)
        worker_cpu_s = sum(extra[0].cpu_times()[:2])
        busy_cpu_s = sum(busy_job.cpu_times()[:2]) - busy_from
        now[0] = 1.0
        sample = sampler.read()
        assert sample is not None
        assert sample.job_processes == 2
        # All the worker's CPU since its start counts, not only what it used after
        # it was first seen (at least 0.3 s, against 1 s between the readings).
        assert sample.job_cpu_pct >= 100.0 * (worker_cpu_s + busy_cpu_s) - 1.0
    finally:
        worker.kill()
        worker.wait()


def test_the_host_reading_carries_the_training_threads_counters_and_the_census(
    busy_job: psutil.Process,
) -> None:
    from trainmedic.host.schedstat import schedstat_available
    from trainmedic.supervise.observe.census import ProcessCensus
    from trainmedic.supervise.observe.threads import ROLE_TRAIN, ThreadSampler

    if not schedstat_available():
        pytest.skip("kernel keeps no scheduler statistics")
    census = ProcessCensus(started_at=time.time() - 60)
    sampler = HostSampler(
        busy_job.pid,
        lambda s: None,
        threads=ThreadSampler(lambda: {busy_job.pid: ROLE_TRAIN}),
        census=census,
    )
    sampler.read()
    _wait_for_cpu(busy_job, 0.3)
    sample = sampler.read()
    assert sample is not None
    assert sample.train_threads == 1 and sample.job_threads == 1
    assert sample.train_cpu_cores is not None and sample.train_cpu_cores > 0.05
    assert sample.train_wait_cores is not None and sample.train_wait_cores >= 0.0
    assert sample.steal_pct is not None and 0.0 <= sample.steal_pct <= 100.0
    (seen,) = census.seen.values()
    assert seen.pid == busy_job.pid and seen.python and seen.cpu_s > 0.2


def test_a_costly_host_reading_is_spaced_out_to_its_cpu_budget(busy_job: psutil.Process) -> None:
    cpu = [0.0]
    cost = [0.002]

    class Sampler(HostSampler):
        def read(self) -> HostSample | None:
            cpu[0] += cost[0]  # what the reading costs this thread, on a fake clock
            return super().read()

    sampler = Sampler(busy_job.pid, lambda s: None, cpu_budget=0.01, cpu_clock=lambda: cpu[0])
    # 2 ms a reading (a one-process job): 0.2 % of a core at one a second, well inside 1 %.
    assert sampler.sample_once() == pytest.approx(1.0)
    assert sampler.last_cost_s == pytest.approx(0.002)
    # 30 ms a reading (a job of hundreds of processes): every 3 s, so 1 % of a core.
    cost[0] = 0.03
    assert sampler.sample_once() == pytest.approx(3.0)
    cost[0] = 0.004
    assert sampler.sample_once() == pytest.approx(1.0)  # cheap again: back to one a second


def test_trainmedics_own_helpers_are_never_taken_for_other_tenants(
    busy_job: psutil.Process,
) -> None:
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        now = [0.0]  # the same one-second interval for both readers
        plain = HostSampler(idle.pid, lambda s: None, monotonic=lambda: now[0])
        mine = HostSampler(
            idle.pid, lambda s: None, monotonic=lambda: now[0], helpers=lambda: [busy_job.pid]
        )
        assert plain.read() is None and mine.read() is None
        _wait_for_cpu(busy_job, 0.5)
        now[0] = 1.0
        a, b = plain.read(), mine.read()
        assert a is not None and b is not None
        assert a.others_cpu_pct is not None and b.others_cpu_pct is not None
        # The spinning helper used 50+ % of a core in the "second": the supervisor's.
        assert a.others_cpu_pct - b.others_cpu_pct >= 40.0
        assert b.job_cpu_pct < 5.0
    finally:
        idle.kill()
        idle.wait()
