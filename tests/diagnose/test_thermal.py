"""Throttling during the run, from simulated GPU series."""

from __future__ import annotations

import pytest

from support.builders import T0, during, make_gpu, make_gpu_series, make_record, make_steps
from trainmedic.diagnose.thermal import active_reasons, throttling
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import ClockEventReason as R
from trainmedic.record.types import RunRecord

TH = Thresholds()


def throttled_record(
    reasons: int, seconds: float, *, clock: float = 1200.0, **fields: object
) -> RunRecord:
    """A 20 s run (200 steps of 0.1 s) with ``reasons`` active for the first ``seconds``."""
    series = make_gpu_series(20)
    series = during(
        series, T0, T0 + seconds, clock_event_reasons=int(reasons), sm_clock_mhz=clock, **fields
    )
    return make_record(make_steps(200), gpu=series)


def run(record: RunRecord) -> list[Finding]:
    return throttling(RunView.of(record), TH)


def test_hw_slowdown_counts_at_once_with_share_and_clock_deficit_impact() -> None:
    (f,) = run(throttled_record(R.HW_SLOWDOWN, 2.0, clock=990.0))
    assert f.id == "thermal.throttle.hw_slowdown" and f.category is Category.THERMAL
    assert f.severity is Severity.WARNING and f.subject == "gpu0"
    assert f.evidence["throttled_time_share"] == pytest.approx(0.1)
    assert f.evidence["clock_deficit_mean"] == pytest.approx(0.5)
    assert f.impact == pytest.approx(0.1 * 0.5)


def test_long_hard_throttle_is_an_error() -> None:
    (f,) = run(throttled_record(R.HW_THERMAL_SLOWDOWN, 5.0, temperature_c=90.0))
    assert f.id == "thermal.throttle.hw_thermal" and f.severity is Severity.ERROR
    assert f.evidence["throttled_time_share"] == pytest.approx(0.25)
    assert f.evidence["temperature_max_c"] == 90.0


def test_most_specific_reason_names_the_finding() -> None:
    # NVML sets HW_SLOWDOWN together with the thermal and power-brake bits
    reasons = R.HW_SLOWDOWN | R.HW_POWER_BRAKE_SLOWDOWN
    (f,) = run(throttled_record(reasons, 1.0))
    assert f.id == "thermal.throttle.hw_power_brake"
    assert f.evidence["reasons"] == ["hw_power_brake", "hw_slowdown"]
    (g,) = run(throttled_record(R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN, 1.0))
    assert g.id == "thermal.throttle.hw_thermal"


def test_power_cap_counts_only_with_clocks_well_below_max() -> None:
    near_max = throttled_record(R.SW_POWER_CAP, 10.0, clock=1800.0)  # 91 % of max
    assert run(near_max) == []
    held_down = throttled_record(R.SW_POWER_CAP, 10.0, clock=1500.0)  # 76 %
    (f,) = run(held_down)
    assert f.id == "thermal.throttle.sw_power_cap" and f.severity is Severity.WARNING
    assert f.evidence["throttled_time_share"] == pytest.approx(0.5)


def test_power_cap_edges() -> None:
    # 85 % of 1980 MHz = 1683 MHz: at the ratio is not "below"
    assert run(throttled_record(R.SW_POWER_CAP, 10.0, clock=1683.0)) == []
    assert len(run(throttled_record(R.SW_POWER_CAP, 10.0, clock=1682.0))) == 1
    # 10 % of the run is the minimum share; 5 % is not enough
    assert len(run(throttled_record(R.SW_POWER_CAP, 2.0, clock=1000.0))) == 1
    assert run(throttled_record(R.SW_POWER_CAP, 1.0, clock=1000.0)) == []
    # the power cap needs load: 49 % busy is not loaded
    assert run(throttled_record(R.SW_POWER_CAP, 10.0, clock=1000.0, utilization_gpu_pct=49.0)) == []


def test_idle_gpu_never_counts_and_hard_reasons_count_at_once() -> None:
    idle_bit = make_gpu(clock_event_reasons=int(R.GPU_IDLE | R.HW_SLOWDOWN))
    low_util = make_gpu(clock_event_reasons=int(R.HW_SLOWDOWN), utilization_gpu_pct=10.0)
    unknown = make_gpu(clock_event_reasons=None)
    assert active_reasons(idle_bit, TH) == R.NONE
    assert active_reasons(low_util, TH) == R.HW_SLOWDOWN
    assert active_reasons(unknown, TH) == R.NONE


def test_harmless_reasons_are_quiet() -> None:
    assert run(throttled_record(R.SYNC_BOOST | R.APPLICATIONS_CLOCKS_SETTING, 20.0)) == []


def test_temperature_near_slowdown_without_throttle() -> None:
    (f,) = run(throttled_record(0, 3.0, clock=1980.0, temperature_c=82.0))
    assert f.id == "thermal.temperature_margin" and f.severity is Severity.WARNING
    assert f.evidence["temperature_slowdown_c"] == 87.0
    assert run(throttled_record(0, 3.0, clock=1980.0, temperature_c=81.9)) == []


def test_throttle_impact_falls_back_to_step_slowdown_without_clocks() -> None:
    series = make_gpu_series(23, sm_clock_mhz=None, sm_clock_max_mhz=None)
    series = during(series, T0 + 10.5, T0 + 15.0, clock_event_reasons=int(R.HW_SLOWDOWN))
    # 10 s of 0.1 s steps, 5 s of 0.2 s steps while throttled, 7.5 s of 0.1 s steps
    steps = make_steps(200, durations=[0.1] * 100 + [0.2] * 25 + [0.1] * 75)
    (f,) = throttling(RunView.of(make_record(steps, gpu=series)), TH)
    assert f.impact == pytest.approx(25 * 0.1 / 22.5)
    assert "clock_deficit_mean" not in f.evidence


def test_the_slowed_readings_are_joined_to_the_steps_they_overlap() -> None:
    # Power brake for 8 s in the middle of the run (readings once a second); the 68 steps
    # in it take 0.118 s, the 120 around them 0.1 s.
    durations = [0.1] * 60 + [0.118] * 68 + [0.1] * 60
    series = during(make_gpu_series(20), T0 + 6.0, T0 + 14.0,
                    clock_event_reasons=int(R.HW_SLOWDOWN | R.HW_POWER_BRAKE_SLOWDOWN),
                    sm_clock_mhz=1200.0)  # fmt: skip
    (f,) = run(make_record(make_steps(len(durations), durations=durations), gpu=series))
    assert f.id == "thermal.throttle.hw_power_brake"
    share = f.evidence["throttled_steps_share"]
    # (each reading stands for the second around it: a few steps each side are taken in)
    assert 68 / 188 <= share <= 80 / 188
    assert f.evidence["throttled_steps_slower_share"] == pytest.approx(0.18, abs=1e-6)
    assert f"{share:.0%} of the steps ran while it was, 18% longer than the others" in f.title


def test_slowed_steps_no_longer_than_the_others_are_said_so() -> None:
    (f,) = run(throttled_record(R.HW_SLOWDOWN, 4.0, clock=990.0))
    assert f.evidence["throttled_steps_slower_share"] == pytest.approx(0.0)
    assert "no longer than the others" in f.title
