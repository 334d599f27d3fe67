"""The demo's scenarios: the script's flags, and GPU simulation files that tell their story.

The GPU scenarios' files are checked against the real diagnosis without
running any training: their readings, replayed on an injected clock next to
steps and host readings like those of the demo's CPU training, must give the
scenario's finding first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import builders
from trainmedic.demo.scenarios import (
    DEFAULT_SCENARIO,
    SCENARIOS,
    SCRIPT,
    SIMULATIONS_DIR,
    Scenario,
    dataset_dir,
)
from trainmedic.demo.verdict import judge
from trainmedic.diagnose import diagnose_run
from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import HostSample, LoaderInfo, RunMeta, RunRecord, StepRecord
from trainmedic.simulation import load_simulation

JOB_PID = 4242
GPU_SCENARIOS = [s for s in SCENARIOS.values() if s.simulation]


def test_default_is_input_bound_and_every_name_is_its_key() -> None:
    assert DEFAULT_SCENARIO == "input-bound"
    assert all(name == s.name for name, s in SCENARIOS.items())
    assert set(SCENARIOS) == {
        "healthy",
        "input-bound",
        "slow-storage",
        "stalls",
        "throttling",
        "contention",
        "memory-pressure",
    }


def test_the_script_and_every_simulation_file_ship_in_the_package() -> None:
    assert SCRIPT.is_file() and (SCRIPT.parent / "digits.py").is_file()
    for s in GPU_SCENARIOS:
        assert s.simulation_path is not None and s.simulation_path.parent == SIMULATIONS_DIR
        assert s.simulation_path.is_file()


def test_input_bound_loads_in_the_training_process_with_a_heavy_transform() -> None:
    args = SCENARIOS["input-bound"].script_args(100)
    assert args[:2] == ["--steps", "100"]
    assert "--augment" in args and "--workers" not in args  # num_workers=0


def test_file_scenarios_read_and_write_under_the_scratch_directory(tmp_path: Path) -> None:
    storage = SCENARIOS["slow-storage"].script_args(50, tmp_path)
    assert storage[storage.index("--dataset-dir") + 1] == str(dataset_dir(tmp_path))
    assert float(storage[storage.index("--read-delay-ms") + 1]) > 0
    assert int(storage[storage.index("--workers") + 1]) >= 2
    stalls = SCENARIOS["stalls"].script_args(700, tmp_path)
    assert stalls[stalls.index("--checkpoint-dir") + 1] == str(tmp_path / "checkpoints")
    with pytest.raises(ValueError, match="scratch"):
        SCENARIOS["slow-storage"].script_args(50)


def test_the_stalls_scenario_saves_often_enough_for_several_stalls(tmp_path: Path) -> None:
    s = SCENARIOS["stalls"]
    args = s.script_args(s.steps, tmp_path)
    every = int(args[args.index("--checkpoint-every") + 1])
    assert s.steps // every >= 2  # one stall is information only


# --- the GPU scenarios' simulation files against the real diagnosis ------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_cpu_training(start: float, seconds: float, step_s: float = 0.012) -> list[StepRecord]:
    """Steps of a compute-bound CPU job: no CUDA readings, autocast off, data ready."""
    n = int(seconds / step_s)
    return [
        StepRecord(
            step=i + 1,
            t=start + (i + 1) * step_s,
            duration_s=step_s,
            data_wait_s=0.0005,
            compute_s=step_s - 0.001,
            samples=64,
            pid=JOB_PID,
            autocast=False,
        )
        for i in range(n)
    ]


def make_host(t: float) -> HostSample:
    """The demo machine: the job busy on 1.9 of 2 cores, nobody else."""
    return builders.make_host(
        t,
        job_cpu_pct=190.0,
        job_rss_bytes=900 << 20,
        job_processes=1,
        system_cpu_pct=97.0,
        usable_cores=2.0,
        iowait_pct=0.0,
        disk_read_bytes_per_s=0.0,
        net_recv_bytes_per_s=0.0,
        net_sent_bytes_per_s=0.0,
        mem_available_bytes=20 << 30,
        others_cpu_pct=2.0,
    )


def replay(scenario: Scenario, seconds: float = 16.0) -> tuple[RunRecord, MachineFacts]:
    """A run as the demo records it: the file loaded at 0 s, training from 4 s on."""
    assert scenario.simulation_path is not None
    clock = FakeClock()
    simulation = load_simulation(scenario.simulation_path, clock=clock)
    backend = simulation.backend
    gpu: list[GpuSample] = []
    for t in range(int(seconds) + 1):
        clock.now = float(t)
        gpu += [backend.sample(i) for i in range(backend.device_count())]
    origin = gpu[0].timestamp
    steps = make_cpu_training(origin + 4.0, seconds - 5.0)
    record = RunRecord(
        meta=RunMeta(
            run_id="demo",
            command=("python", "train_lenet.py"),
            cwd="/",
            started_at=origin,
            ended_at=origin + seconds,
            exit_code=0,
            gpu_backend="simulated",
        ),
        steps=steps,
        windows=[],
        loaders=[LoaderInfo(origin + 3.5, JOB_PID, 1, 0, 64, False, None, False, "map", 4096)],
        loader_activity=[],
        gpu=gpu,
        host=[make_host(origin + t) for t in range(1, int(seconds) + 1)],
        events=[],
    )
    assert simulation.host is not None  # the files state the host, so its user
    machine = MachineFacts(
        host=simulation.host,
        gpu=GpuFacts(backend="simulated", driver=backend.driver(), samples=tuple(gpu[:1])),
        torch=None,
    )
    return record, machine


@pytest.mark.parametrize("scenario", GPU_SCENARIOS, ids=lambda s: s.name)
def test_simulation_file_gives_the_scenarios_finding_first(scenario: Scenario) -> None:
    record, machine = replay(scenario)
    findings = diagnose_run(record, machine)
    verdict = judge(scenario, findings)
    assert verdict.ok, [f.id for f in findings]
    # The GPU story is the only one: the CPU training itself is healthy.
    assert [f.id for f in findings if f.severity.value != "info"] == [scenario.expected]


def test_throttling_file_is_slowed_most_of_the_run_at_about_half_clock() -> None:
    record, machine = replay(SCENARIOS["throttling"])
    (finding,) = [f for f in diagnose_run(record, machine) if f.id.startswith("thermal.")]
    assert finding.severity.value == "error"
    assert finding.evidence["throttled_time_share"] >= 0.9
    assert 0.25 <= finding.evidence["clock_deficit_mean"] <= 0.55


def test_memory_pressure_file_fills_the_gpu_past_95_percent() -> None:
    record, machine = replay(SCENARIOS["memory-pressure"])
    (finding,) = [f for f in diagnose_run(record, machine) if f.id.startswith("memory.")]
    assert finding.evidence["memory_peak_share"] >= 0.95
    assert finding.evidence["memory_total_gib"] == 16


def test_contention_file_has_another_users_process_on_every_reading() -> None:
    record, _ = replay(SCENARIOS["contention"])
    users = [{p.user for p in g.processes} for g in record.gpu]
    assert all(u == {"trainer", "tenant-b"} for u in users)


@pytest.mark.parametrize("scenario", GPU_SCENARIOS, ids=lambda s: s.name)
def test_simulation_files_keep_to_the_format(scenario: Scenario) -> None:
    assert scenario.simulation_path is not None
    data = json.loads(scenario.simulation_path.read_text())
    assert data["description"] and data["host"] == {}
    # Pre-Ampere GPUs: no bf16 tensor cores, so full precision is not a finding here.
    assert all(float(g["compute_capability"]) < 8.0 for g in data["gpus"])
