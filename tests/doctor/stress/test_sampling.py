"""The GPUs are read during each burst, not between them: a thread at a fixed period on
real GPUs, the simulated clock's timers on a simulated machine; the course of each
reading comes from those in-burst readings."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from support.facts import make_gpu_sample
from trainmedic.doctor.stress.machine import MemtestOutcome, Work
from trainmedic.doctor.stress.runner import StressPlan, run_stress
from trainmedic.doctor.stress.sampling import SAMPLE_PERIOD_S, PeriodicSampler
from trainmedic.doctor.stress.simulated import SimulatedClock, load_stress_simulation
from trainmedic.gpu.types import GpuSample

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "simulations" / "stress"


class CountingSignal:
    """A stop signal whose waits return at once: the first ``waits`` say "go on", then
    "stop"; it records the timeouts asked for."""

    def __init__(self, waits: int) -> None:
        self.left = waits
        self.timeouts: list[float | None] = []
        self.stopped = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self.left -= 1
        return self.left < 0 or self.stopped.is_set()

    def set(self) -> None:
        self.stopped.set()


class ReadCounter:
    """A GPU backend whose readings say which reading of which GPU they are."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def sample(self, index: int) -> GpuSample:
        self.reads.append(index)
        return make_gpu_sample(index=index, timestamp=float(len(self.reads)))


def test_the_reading_thread_reads_every_gpu_each_period_until_stopped() -> None:
    backend = ReadCounter()
    signals: list[CountingSignal] = []

    def signal() -> CountingSignal:
        signals.append(CountingSignal(waits=3))
        return signals[-1]

    sampler = PeriodicSampler(backend, [0, 2], signal=signal)  # type: ignore[arg-type]
    sampler.start()
    got = sampler.stop()
    # A reading at the start and one after each of the 3 waits that went on: 4 per GPU.
    assert {i: [s.timestamp for s in v] for i, v in got.items()} == {
        0: [1.0, 3.0, 5.0, 7.0],
        2: [2.0, 4.0, 6.0, 8.0],
    }
    assert signals[0].timeouts == [SAMPLE_PERIOD_S] * 4 and signals[0].stopped.is_set()
    # The next burst starts afresh.
    sampler.start()
    assert [len(v) for v in sampler.stop().values()] == [4, 4]


def test_a_failing_reading_surfaces_in_the_burst_thread() -> None:
    class Broken:
        def sample(self, index: int) -> GpuSample:
            raise RuntimeError("NVML went away")

    sampler = PeriodicSampler(Broken(), [0], signal=lambda: CountingSignal(waits=0))  # type: ignore[arg-type]
    sampler.start()
    with pytest.raises(RuntimeError, match="NVML went away"):
        sampler.stop()


def test_the_simulated_clock_fires_timers_at_each_period_without_drift() -> None:
    clock = SimulatedClock()
    seen: list[float] = []
    handle = clock.every(0.2, lambda: seen.append(round(clock(), 9)))
    clock.advance(0.5)
    assert seen == [0.2, 0.4] and clock() == 0.5
    clock.advance(0.1)  # 0.6 is the end of this advance: read with the next one
    assert seen == [0.2, 0.4]
    for _ in range(100):
        clock.advance(0.1)
    # 100 more tenths: due at 0.6 ... 10.4 (10.6 is the end again), none of them late.
    assert len(seen) == 2 + 50 and seen[-1] == pytest.approx(10.4, abs=1e-9)
    clock.cancel(handle)
    clock.advance(5)
    assert len(seen) == 52
    with pytest.raises(ValueError, match="positive"):
        clock.every(0, lambda: None)


def one_h200(tmp_path: Path, series: list[dict[str, Any]]) -> Path:
    """The healthy H200 example cut to one GPU, whose readings follow ``series``."""
    data = json.loads((EXAMPLES / "healthy-h200.json").read_text())
    data["gpus"] = data["gpus"][:1]
    data["gpus"][0]["series"] = series
    data["stress"]["gpus"] = data["stress"]["gpus"][:1]
    data["stress"]["peer_gb_per_s"] = [[None]]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(data))
    return path


def test_a_clock_that_falls_inside_a_burst_is_read_there_and_slows_the_rest_of_it(
    tmp_path: Path,
) -> None:
    # 0.23 s into the first burst the clock falls to 990 of 1980 MHz, and is back at
    # 0.43 s: no reading between bursts could see it.
    path = one_h200(tmp_path, [{"t": 0.23, "sm_clock_mhz": 990}, {"t": 0.43, "sm_clock_mhz": 1980}])
    sim = load_stress_simulation(path)
    start = sim.sampler([0])
    start.start()
    work = sim.machine.matmul([0], "bf16", 0.5)[0]
    readings = start.stop()[0]
    assert [s.sm_clock_mhz for s in readings] == [1980, 1980, 990]  # at 0, 0.2 and 0.4 s
    # The steps from 0.25 to 0.45 s (4 of 0.05 s) at half speed: 780 x (0.3 + 0.2 / 2) TFLOP.
    assert work.amount == pytest.approx(780e12 * (0.3 + 0.1))
    assert work.rate / 1e12 == pytest.approx(624.0)


def test_the_course_of_each_reading_comes_from_the_readings_during_the_bursts(
    tmp_path: Path,
) -> None:
    # The clock sags from 1980 to 1600 MHz from second 1, and is back at 1980 MHz from
    # second 3.05 on: the sag shows only in readings taken under load.
    path = one_h200(
        tmp_path,
        [
            {"t": 1.0, "sm_clock_mhz": 1800, "temperature_c": 70},
            {"t": 2.0, "sm_clock_mhz": 1600, "temperature_c": 80},
            {"t": 3.05, "sm_clock_mhz": 1980, "temperature_c": 60},
        ],
    )
    sim = load_stress_simulation(path)
    result = run_stress(
        StressPlan(seconds=5), sim.backend, lambda _: ("simulated", sim.machine), sim.clock,
        own_pid=1, sampler=sim.sampler,
    )  # fmt: skip
    r = result.gpus[0].readings
    assert r.sm_clock_mhz is not None and r.temperature_c is not None
    assert (r.sm_clock_mhz.start, r.sm_clock_mhz.low, r.sm_clock_mhz.end) == (1980, 1600, 1980)
    assert r.temperature_c.high == 80 and r.sample_period_s == SAMPLE_PERIOD_S
    # 5 s: matmul 2.75 s over 5 dtypes (5 bursts of 0.55 s: 3 readings each), device
    # copies 0.5 s (3), memory test 0.75 s (4), host copies 4 x 0.125 s (1 each), no pair.
    assert r.samples == 15 + 3 + 4 + 4


class RecordingMachine:
    """A machine that records its bursts, for the order of readings and work."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def dtypes(self, index: int) -> dict[str, str | None]:
        return {"bf16": None}

    def matmul(self, indices: Sequence[int], dtype: str, seconds: float) -> dict[int, Work]:
        self.log.append(f"matmul {list(indices)}")
        return {i: Work(1e12, 1.0) for i in indices}

    def device_copy(self, indices: Sequence[int], seconds: float) -> dict[int, Work]:
        self.log.append("device_copy")
        return {i: Work(1e9, 1.0) for i in indices}

    def memtest(self, index: int, share: float, seconds: float) -> MemtestOutcome:
        self.log.append(f"memtest {index}")
        return MemtestOutcome(1, 0.8, (), 1, 0, (), seconds)

    def host_copy(self, index: int, direction: str, pinned: bool, seconds: float) -> Work:
        self.log.append(f"host_copy {index}")
        return Work(1e9, 1.0)

    def peer_copy(self, src: int, dst: int, seconds: float) -> Work | None:
        self.log.append(f"peer_copy {src}->{dst}")
        return Work(1e9, 1.0)

    def close(self) -> None:
        self.log.append("close")


def test_each_burst_runs_between_a_sampler_start_and_stop(tmp_path: Path) -> None:
    sim = load_stress_simulation(EXAMPLES / "healthy-h200.json")
    log: list[str] = []

    class LoggingSampler:
        def __init__(self, indices: Sequence[int]) -> None:
            self.indices = list(indices)

        def start(self) -> None:
            log.append(f"start {self.indices}")

        def stop(self) -> dict[int, list[GpuSample]]:
            log.append("stop")
            return {i: [sim.backend.sample(i)] for i in self.indices}

    run_stress(
        StressPlan(seconds=2, burst_s=1.0), sim.backend,
        lambda _: ("recording", RecordingMachine(log)), sim.clock, own_pid=1,
        sampler=LoggingSampler,
    )  # fmt: skip
    work = [line for line in log if line not in ("stop", "close") and not line.startswith("s")]
    assert work[:2] == ["matmul [0, 1]", "matmul [0]"]  # together, then GPU 0 alone
    assert "matmul [1]" in work and "device_copy" in work and "peer_copy 1->0" in work
    # Every burst, and only bursts, between a start of both GPUs' readings and a stop.
    for n, line in enumerate(log[:-1]):
        if line in work:
            assert log[n - 1] == "start [0, 1]" and log[n + 1] == "stop", (n, log[n - 1 : n + 2])
    assert log.count("start [0, 1]") == log.count("stop") == len(work)
