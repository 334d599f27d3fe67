"""Whole stress runs on the simulated machine: the bundled examples give exactly their
findings, with their numbers; the checks before the load refuse what they must."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from trainmedic.doctor.stress.judge import judge_stress
from trainmedic.doctor.stress.results import StressResult
from trainmedic.doctor.stress.runner import (
    GpuBusyError,
    NoGpuToStress,
    StressPlan,
    parse_gpu_list,
    run_stress,
    select_gpus,
)
from trainmedic.doctor.stress.simulated import (
    SimulatedClock,
    SimulatedStressMachine,
    load_stress_simulation,
)
from trainmedic.errors import SimulationFileError, UsageError
from trainmedic.gpu.backend import NoGpuBackend
from trainmedic.simulation import load_simulation

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "simulations" / "stress"
FAULTS = EXAMPLES / "four-h100-faults.json"


def run_file(path: Path, seconds: float = 20.0, **plan: Any) -> StressResult:
    sim = load_stress_simulation(path)
    return run_stress(
        StressPlan(seconds=seconds, **plan),
        sim.backend,
        lambda _: ("simulated", sim.machine),
        sim.clock,
        own_pid=1,
        sampler=sim.sampler,
    )


@pytest.fixture(scope="module")
def faults() -> StressResult:
    return run_file(FAULTS)


def keys(result: StressResult) -> set[tuple[str, str, str | None]]:
    return {
        (f.id, f.severity.value, f.subject)
        for f in judge_stress(result)
        if f.severity.value != "info"
    }


def test_the_faulty_machine_gives_exactly_its_findings(faults: StressResult) -> None:
    assert keys(faults) == {
        ("stress.throttled_under_load", "error", "gpu3"),
        ("stress.matmul_slower_than_peers", "warning", "gpu3"),
        ("stress.matmul_below_datasheet", "warning", "gpu3"),
        ("stress.matmul_slow_alone", "warning", "gpu3"),
        ("stress.memory_test_errors", "error", "gpu2"),
        ("stress.ecc_errors_under_load", "error", "gpu2"),
        ("stress.pcie_link_degraded_under_load", "warning", "gpu1"),
        ("stress.host_bandwidth_below_link", "warning", "gpu1"),
        ("stress.temperature_near_slowdown", "warning", "gpu1"),
        ("stress.peer_bandwidth_below_nvlink", "warning", "gpu1-gpu2"),
        ("stress.peer_bandwidth_slower_than_pairs", "warning", "gpu1-gpu2"),
        ("stress.no_peer_access", "warning", "gpus"),
    }


def test_the_run_follows_its_budget_on_the_injected_clock(faults: StressResult) -> None:
    # 20 s: matmul 10 s (5 dtypes x 4 bursts), each GPU alone 1 s (2 bursts), device
    # copies 2 s, then per GPU a 3 s memory test and 2 s of host copies, and 10 peer
    # pairs of 0.1667 s (2 have no access).
    assert faults.elapsed_s == pytest.approx(10 + 4 * 1 + 2 + 4 * (3 + 2) + 10 * 2 / 12)
    assert faults.machine == "simulated" and faults.backend == "simulated"
    g0 = faults.gpus[0]
    assert [g0.tflops[d].bursts for d in ("fp8", "bf16", "fp16", "tf32", "fp32")] == [4] * 5
    assert g0.tflops_alone["fp8"].bursts == 2 and g0.together_share("fp8") == 1.0
    # Every 0.2 s during the bursts (at 0, 0.2 and 0.4 s of each 0.5 s one): 20 matmul
    # bursts, 8 alone and 4 copy bursts x 3; 4 memory tests of 3 s x 15; 16 host bursts
    # x 3; 10 peer bursts of 0.1667 s x 1 (the 2 pairs without access did no work).
    assert {g.readings.samples for g in faults.gpus} == {60 + 24 + 12 + 60 + 48 + 10}
    assert {g.readings.sample_period_s for g in faults.gpus} == {0.2}


def test_a_power_brake_slows_gpu3_against_its_peers(faults: StressResult) -> None:
    g3 = faults.gpus[3]
    # The brake holds 1200 of 1980 MHz from second 1 to 15: bf16 runs at 2-4 s.
    assert g3.tflops["bf16"].mean == pytest.approx(760 * 1200 / 1980, abs=0.01)
    assert g3.peak_share("bf16") == pytest.approx(760 * 1200 / 1980 / 989.5, abs=1e-4)
    assert faults.gpus[0].peak_share("bf16") == pytest.approx(760 / 989.5, abs=1e-4)
    # 84 of 214 readings fall in the brake: 18 matmul bursts x 3 (t = 1.0 ... 9.9), the
    # 8 alone bursts x 3, and 6 readings of the device copies (t = 14.0 ... 14.9).
    assert g3.readings.reason_shares == {"hw_power_brake": 0.3925, "hw_slowdown": 0.3925}
    assert g3.readings.sm_clock_mhz is not None and g3.readings.sm_clock_mhz.low == 1200
    findings = {f.id: f for f in judge_stress(faults) if f.subject == "gpu3"}
    peers = findings["stress.matmul_slower_than_peers"]
    assert peers.title == (
        "GPU 3 reaches 47 % of its bf16 peak while GPUs 0-2 reach 77 %; "
        "power brake active 39 % of the time"
    )
    assert peers.evidence["ratio_to_peers"] == pytest.approx(0.6061, abs=1e-4)
    assert peers.impact == pytest.approx(0.3939, abs=1e-4)
    throttled = findings["stress.throttled_under_load"]
    assert throttled.title == (
        "GPU 3 under load: power brake active 39 % of the time; its SM "
        "clock fell from 1980 to 1200 MHz (-39 %) and ended at 1980 MHz"
    )
    assert throttled.impact == pytest.approx(1 - throttled.evidence["mean_clock_ratio"])
    assert "ipmitool sel list" in throttled.fix
    # Alone (at 12-13 s, still braked) it is as slow: the GPU, not the others' load.
    alone = findings["stress.matmul_slow_alone"]
    assert alone.category.value == "gpu_capacity"
    assert alone.evidence["tflops_alone"] == pytest.approx(1350 * 1200 / 1980, abs=1e-3)
    assert alone.evidence["peers_median_tflops_alone"] == 1350.0
    assert alone.impact == pytest.approx(1 - 1200 / 1980, abs=1e-4)


def test_memory_errors_and_ecc_on_gpu2(faults: StressResult) -> None:
    g2 = faults.gpus[2]
    assert g2.memtest is not None
    # 80 % of (80 GiB - 0.5 GiB) free; passes: 3 s / (63.6 GiB x 5 patterns / 2950 GB/s).
    assert g2.memtest.tested_bytes == int(79.5 * 2**30 * 0.8) // 4 * 4
    assert g2.memtest.passes == 25 and g2.memtest.errors == 3 * 25
    assert g2.memtest.error_offsets == (1048576, 1048580, 7340032)
    findings = {f.id: f for f in judge_stress(faults) if f.subject == "gpu2"}
    mem = findings["stress.memory_test_errors"]
    assert mem.evidence["pages_2mib"] == [0, 3] and mem.evidence["errors"] == 75
    ecc = findings["stress.ecc_errors_under_load"]
    assert ecc.evidence["volatile_uncorrected_delta"] == 2
    assert ecc.evidence["remap_pending_after"] is True


def test_gpu1_link_heat_and_peer_path(faults: StressResult) -> None:
    g1 = faults.gpus[1]
    assert (g1.readings.link_gen_under_load, g1.link.gen_max) == (3, 5)
    assert g1.host_gb_per_s["h2d_pinned"].mean == 11.5
    assert g1.readings.temperature_c is not None and g1.readings.temperature_c.high == 84
    findings = {(f.id, f.subject): f for f in judge_stress(faults)}
    host = findings[("stress.host_bandwidth_below_link", "gpu1")]
    assert host.evidence["link_allows_gb_per_s"] == 63.008
    assert host.impact == pytest.approx(1 - 11.5 / 63.008, abs=1e-4)
    nvlink = findings[("stress.peer_bandwidth_below_nvlink", "gpu1-gpu2")]
    assert nvlink.evidence == {"gb_per_s": 38.0, "nvlink_one_way_gb_per_s": 450.0, "min_share": 0.5}
    no_peer = findings[("stress.no_peer_access", "gpus")]
    assert no_peer.evidence["pairs_without_peer_access"] == [[0, 3], [3, 0]]


def test_the_healthy_h200s_give_no_warning() -> None:
    result = run_file(EXAMPLES / "healthy-h200.json", seconds=10)
    findings = judge_stress(result)
    assert {f.severity.value for f in findings} == {"info"}
    assert [f.id for f in findings] == ["stress.figures"] * 2
    g = result.gpus[0]
    assert g.datasheet is not None and g.datasheet.model == "H200 SXM"
    assert g.peak_share("bf16") == pytest.approx(780 / 989.5, abs=1e-4)
    assert findings[0].title.startswith("GPU 0 (H200 SXM): fp8 1450 (73 %), bf16 780 (79 %)")


def test_only_the_gpus_asked_for_run(tmp_path: Path) -> None:
    result = run_file(FAULTS, seconds=5, gpus=(1, 3))
    assert [g.index for g in result.gpus] == [1, 3]
    assert [(p.src, p.dst) for p in result.peers] == [(1, 3), (3, 1)]


def with_process(tmp_path: Path) -> Path:
    data = json.loads(FAULTS.read_text())
    data = copy.deepcopy(data)
    data["gpus"][2]["processes"] = [{"pid": 4242, "used_memory_bytes": 1 << 30, "name": "python"}]
    path = tmp_path / "busy.json"
    path.write_text(json.dumps(data))
    return path


def test_a_busy_gpu_is_refused_before_any_work(tmp_path: Path) -> None:
    sim = load_stress_simulation(with_process(tmp_path))
    opened: list[int] = []

    def open_machine(_: object) -> tuple[str, SimulatedStressMachine]:
        opened.append(1)
        return "simulated", sim.machine

    with pytest.raises(GpuBusyError, match=r"GPU 2 is in use by pid 4242 \(python\)") as info:
        run_stress(
            StressPlan(seconds=5),
            sim.backend,
            open_machine,
            sim.clock,
            own_pid=1,
            sampler=sim.sampler,
        )
    assert info.value.exit_code == 4 and opened == [] and sim.clock() == 0


def test_force_stresses_a_busy_gpu_and_our_own_process_never_counts(tmp_path: Path) -> None:
    sim = load_stress_simulation(with_process(tmp_path))
    result = run_stress(
        StressPlan(seconds=5, force=True),
        sim.backend,
        lambda _: ("simulated", sim.machine),
        sim.clock,
        own_pid=1,
        sampler=sim.sampler,
    )
    assert len(result.gpus) == 4 and sim.machine.closed
    sim = load_stress_simulation(with_process(tmp_path))
    result = run_stress(
        StressPlan(seconds=5),
        sim.backend,
        lambda _: ("simulated", sim.machine),
        sim.clock,
        own_pid=4242,
        sampler=sim.sampler,
    )
    assert len(result.gpus) == 4


def test_no_gpu_is_exit_3_and_a_missing_one_a_usage_error() -> None:
    none = NoGpuBackend("no NVIDIA driver: libnvidia-ml.so was not found")
    with pytest.raises(NoGpuToStress, match="no GPU to stress: no NVIDIA driver") as info:
        select_gpus(none, None)
    assert info.value.exit_code == 3
    with pytest.raises(UsageError, match=r"--gpus: no GPU 9 \(this machine has no GPU\)"):
        select_gpus(none, (9,))
    sim = load_stress_simulation(FAULTS)
    with pytest.raises(UsageError, match=r"no GPU 4 \(this machine has GPUs 0-3\)"):
        select_gpus(sim.backend, (0, 4))


@pytest.mark.parametrize(
    ("text", "gpus"),
    [("0", (0,)), ("0,2", (0, 2)), ("1-3", (1, 2, 3)), (" 3 , 0-1 ", (3, 0, 1)), ("2,2", (2,))],
)
def test_gpu_lists(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpu_list(text) == gpus


@pytest.mark.parametrize("text", ["x", "", "-1", "1-", "3-1", "0,,1", "1.5", "٣", "0-99999999"])
def test_bad_gpu_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="--gpus"):
        parse_gpu_list(text)


def test_the_stress_section_is_checked_and_plain_doctor_accepts_it(tmp_path: Path) -> None:
    assert load_simulation(FAULTS).backend.device_count() == 4  # doctor without --stress
    data = json.loads(FAULTS.read_text())
    data["stress"]["gpus"][1]["matmul_tflops"]["bf16"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(SimulationFileError, match=r"stress.gpus\[1\].matmul_tflops.bf16: expected"):
        load_stress_simulation(bad)
    del data["stress"]
    bad.write_text(json.dumps(data))
    with pytest.raises(SimulationFileError, match="stress: missing"):
        load_stress_simulation(bad)


def test_the_simulated_clock_only_moves_when_told() -> None:
    clock = SimulatedClock()
    clock.advance(1.5)
    clock.advance(-3)
    assert clock() == 1.5
