"""Thermal checks: temperature margin, clock event reasons, power cap under load."""

from __future__ import annotations

import pytest

from support.facts import finding_keys, make_facts, make_gpu_sample, make_loaded_gpu_sample
from trainmedic.doctor.checks.thermal import (
    CHECKS,
    check_clock_events,
    check_temperature_margin,
)
from trainmedic.findings.model import Finding, Severity
from trainmedic.gpu.types import ClockEventReason as R
from trainmedic.gpu.types import GpuSample


def run_all(*gpus: GpuSample) -> list[Finding]:
    facts = make_facts(gpus=list(gpus))
    return [f for check in CHECKS for f in check(facts)]


def test_healthy_idle_and_loaded_gpus_give_no_thermal_finding() -> None:
    assert run_all(make_gpu_sample(), make_loaded_gpu_sample()) == []


@pytest.mark.parametrize(
    ("temperature_c", "expected"),
    [
        (81.9, set()),
        (82.0, {("thermal.temperature_near_slowdown", "warning", "gpu0")}),
        (86.5, {("thermal.temperature_near_slowdown", "warning", "gpu0")}),
        (87.0, {("thermal.temperature_at_slowdown", "error", "gpu0")}),
        (90.0, {("thermal.temperature_at_slowdown", "error", "gpu0")}),
    ],
)
def test_temperature_margin_to_slowdown_threshold_of_87c(
    temperature_c: float, expected: set[tuple[str, str, str]]
) -> None:
    facts = make_facts(gpus=[make_gpu_sample(temperature_c=temperature_c)])
    assert finding_keys(check_temperature_margin(facts)) == expected


def test_temperature_evidence_names_margin_and_threshold() -> None:
    facts = make_facts(gpus=[make_gpu_sample(temperature_c=84.0)])
    (finding,) = check_temperature_margin(facts)
    assert finding.evidence["margin_c"] == 3.0
    assert finding.evidence["temperature_c"] == 84.0
    assert finding.evidence["slowdown_temperature_c"] == 87.0
    assert "84 °C" in finding.title and "87 °C" in finding.title


def test_unknown_temperature_threshold_stays_quiet() -> None:
    facts = make_facts(gpus=[make_gpu_sample(temperature_c=95.0, temperature_slowdown_c=None)])
    assert check_temperature_margin(facts) == []


@pytest.mark.parametrize(
    ("reasons", "expected_id", "severity"),
    [
        (R.HW_SLOWDOWN, "thermal.clock_event.hw_slowdown", Severity.ERROR),
        (R.SW_THERMAL_SLOWDOWN, "thermal.clock_event.sw_thermal", Severity.WARNING),
        (R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN, "thermal.clock_event.hw_thermal", Severity.ERROR),
        (
            R.HW_SLOWDOWN | R.HW_POWER_BRAKE_SLOWDOWN,
            "thermal.clock_event.hw_power_brake",
            Severity.ERROR,
        ),
    ],
)
def test_each_slowdown_reason_is_reported_at_once(
    reasons: R, expected_id: str, severity: Severity
) -> None:
    # Idle GPU: the reason alone is enough, no load needed.
    facts = make_facts(gpus=[make_gpu_sample(clock_event_reasons=int(reasons))])
    (finding,) = check_clock_events(facts)
    assert (finding.id, finding.severity, finding.subject) == (expected_id, severity, "gpu0")
    assert finding.impact is None  # idle: no throughput to lose
    assert set(finding.evidence["clock_event_reasons"]) == {
        f.name.lower() for f in R if f.name and f is not R.NONE and f in reasons
    }


def test_hw_slowdown_impact_is_the_clock_lost_under_load() -> None:
    gpu = make_loaded_gpu_sample(
        clock_event_reasons=int(R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN),
        sm_clock_mhz=990.0,
        temperature_c=91.0,
    )
    (finding,) = check_clock_events(make_facts(gpus=[gpu]))
    assert finding.id == "thermal.clock_event.hw_thermal"
    assert finding.impact == pytest.approx(0.5)
    assert finding.evidence["sm_clock_mhz"] == 990.0
    assert finding.evidence["sm_clock_max_mhz"] == 1980.0


@pytest.mark.parametrize(
    "reasons",
    [R.GPU_IDLE, R.SYNC_BOOST, R.APPLICATIONS_CLOCKS_SETTING, R.NONE, R.SW_POWER_CAP],
)
def test_benign_reasons_give_no_clock_event_finding(reasons: R) -> None:
    facts = make_facts(gpus=[make_loaded_gpu_sample(clock_event_reasons=int(reasons))])
    assert check_clock_events(facts) == []


def test_unknown_reasons_stay_quiet() -> None:
    facts = make_facts(gpus=[make_gpu_sample(clock_event_reasons=None)])
    assert run_all(*facts.gpu.samples) == []


def test_power_cap_under_load_with_low_clock_is_a_warning() -> None:
    gpu = make_loaded_gpu_sample(
        clock_event_reasons=int(R.SW_POWER_CAP), sm_clock_mhz=1485.0, power_draw_w=699.0
    )
    (finding,) = check_clock_events(make_facts(gpus=[gpu]))
    assert (finding.id, finding.severity) == ("thermal.clock_event.sw_power_cap", Severity.WARNING)
    assert finding.evidence["sm_clock_ratio"] == 0.75
    assert finding.impact == pytest.approx(0.25)
    assert "75%" in finding.title and "700 W" in finding.title
    assert "-pl" in finding.fix


@pytest.mark.parametrize(
    ("utilization_gpu_pct", "sm_clock_mhz"),
    [
        (98.0, 1700.0),  # power cap active but clock at 86 % of max: normal boost behaviour
        (30.0, 1000.0),  # light load: a low clock costs little
        (None, 1000.0),  # utilization unknown
    ],
)
def test_power_cap_stays_quiet_unless_busy_and_well_below_max(
    utilization_gpu_pct: float | None, sm_clock_mhz: float
) -> None:
    gpu = make_loaded_gpu_sample(
        clock_event_reasons=int(R.SW_POWER_CAP),
        utilization_gpu_pct=utilization_gpu_pct,
        sm_clock_mhz=sm_clock_mhz,
    )
    assert check_clock_events(make_facts(gpus=[gpu])) == []


@pytest.mark.parametrize(
    ("reason", "key"), [(R.BOARD_LIMIT, "board_limit"), (R.RELIABILITY, "reliability")]
)
def test_board_and_reliability_limits_count_like_the_power_cap(reason: R, key: str) -> None:
    held = make_loaded_gpu_sample(clock_event_reasons=int(reason), sm_clock_mhz=1188.0)
    (finding,) = check_clock_events(make_facts(gpus=[held]))
    assert (finding.id, finding.severity) == (f"thermal.clock_event.{key}", Severity.WARNING)
    assert finding.evidence["sm_clock_ratio"] == 0.6
    assert finding.evidence["clock_event_reasons"] == [key]
    near_max = make_loaded_gpu_sample(clock_event_reasons=int(reason), sm_clock_mhz=1900.0)
    assert check_clock_events(make_facts(gpus=[near_max])) == []


def test_a_hard_reason_and_a_limit_give_one_finding_named_by_the_hard_one() -> None:
    gpu = make_loaded_gpu_sample(
        clock_event_reasons=int(R.SW_THERMAL_SLOWDOWN | R.SW_POWER_CAP), sm_clock_mhz=1000.0
    )
    (finding,) = check_clock_events(make_facts(gpus=[gpu]))
    assert finding.id == "thermal.clock_event.sw_thermal"
    assert finding.evidence["active_reasons"] == ["sw_thermal", "sw_power_cap"]


def test_findings_are_per_gpu() -> None:
    hot = make_gpu_sample(temperature_c=88.0, clock_event_reasons=int(R.SW_THERMAL_SLOWDOWN))
    keys = finding_keys(run_all(make_gpu_sample(), hot))
    assert keys == {
        ("thermal.temperature_at_slowdown", "error", "gpu1"),
        ("thermal.clock_event.sw_thermal", "warning", "gpu1"),
    }
