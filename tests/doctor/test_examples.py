"""Every example simulation yields exactly the findings its story describes.

Runs all doctor checks (every module in the runner), so a check that fires
where it should not on any example fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.facts import finding_keys
from trainmedic.doctor.checks import thermal
from trainmedic.doctor.facts import MachineFacts
from trainmedic.doctor.gather import DoctorRequest, gather_facts, gpu_facts
from trainmedic.doctor.runner import run_checks
from trainmedic.simulation import load_simulation

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "simulations"


def inventory(n: int) -> set[tuple[str, str, str | None]]:
    return {("inventory.gpu", "info", f"gpu{i}") for i in range(n)}


EXPECTED: dict[str, set[tuple[str, str, str | None]]] = {
    "healthy.json": inventory(2),
    "no-driver.json": {("inventory.no_gpu", "info", "host")},
    "thermal-throttling.json": inventory(2)
    | {
        ("thermal.temperature_at_slowdown", "error", "gpu0"),
        ("thermal.clock_event.hw_thermal", "error", "gpu0"),
        ("thermal.clock_event.sw_power_cap", "warning", "gpu1"),
    },
    "pcie-degraded.json": inventory(3)
    | {
        ("hardware.pcie.width_degraded", "warning", "gpu0"),
        ("hardware.pcie.slot_below_gpu_max", "warning", "gpu1"),
        ("hardware.pcie.gen_degraded", "warning", "gpu2"),
    },
    "ecc-remapped-rows.json": inventory(2)
    | {
        ("hardware.ecc.volatile_uncorrectable", "error", "gpu1"),
        ("hardware.remapped_rows_pending", "warning", "gpu1"),
    },
    "lost-gpu-xid.json": inventory(2)
    | {
        ("hardware.gpu_unreachable", "error", "gpu1"),
        ("hardware.xid.79", "error", "gpu1"),
        ("hardware.xid.63", "info", "gpu0"),
    },
    "mig.json": inventory(1) | {("gpu.mig_mode", "info", "gpu0")},
    "driver-older-than-torch.json": inventory(4)
    | {("driver.cuda_newer_than_driver", "error", "host")},
    "other-tenant.json": inventory(4)
    | {
        ("contention.gpu.foreign_processes", "warning", "gpu0"),
        ("contention.gpu.foreign_processes", "warning", "gpu1"),
        ("contention.gpu.busy_without_user", "warning", "gpu0"),
        ("contention.gpu.busy_without_user", "warning", "gpu1"),
        ("gpu_memory.used_by_others", "warning", "gpu0"),
        ("gpu_memory.used_by_others", "warning", "gpu1"),
        ("gpu_memory.used_by_others", "warning", "gpu2"),
    },
}


def test_every_example_file_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_gives_exactly_its_findings(name: str) -> None:
    facts = gather_facts(DoctorRequest(simulate=str(EXAMPLES / name)))
    assert finding_keys(run_checks(facts)) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_is_self_contained(name: str) -> None:
    # torch and host come from the file, so the findings do not depend on
    # the machine running the test.
    doc = json.loads((EXAMPLES / name).read_text())
    assert isinstance(doc["description"], str) and doc["description"]
    assert doc["host"] == {}
    assert isinstance(doc["torch"]["version"], str)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttling_series_replays_the_run() -> None:
    clock = FakeClock()
    simulation = load_simulation(EXAMPLES / "thermal-throttling.json", clock=clock)
    assert simulation.backend.duration_s == 180.0
    host = simulation.host
    assert host is not None

    def thermal_at(t: float) -> set[tuple[str, str, str | None]]:
        clock.now = t
        facts = MachineFacts(
            host=host,
            gpu=gpu_facts(simulation.backend),
            torch=simulation.torch,
        )
        return finding_keys(run_checks(facts, thermal.CHECKS))

    hot = {
        ("thermal.temperature_at_slowdown", "error", "gpu0"),
        ("thermal.clock_event.hw_thermal", "error", "gpu0"),
        ("thermal.clock_event.sw_power_cap", "warning", "gpu1"),
    }
    assert thermal_at(0) == hot
    # Half a minute in, GPU 0 has cooled to 87 °C: 2 °C under its threshold,
    # slowed by software only.
    assert thermal_at(30) == {
        ("thermal.temperature_near_slowdown", "warning", "gpu0"),
        ("thermal.clock_event.sw_thermal", "warning", "gpu0"),
        ("thermal.clock_event.sw_power_cap", "warning", "gpu1"),
    }
    assert thermal_at(60) == hot
    assert thermal_at(1000) == hot
