"""Heat and power limits that slow the GPU down (docs/doctor-checks.md, "thermal").

Judged from one reading per GPU: the temperature's margin to the slowdown
threshold and the clock event reasons NVML reports as active right now.
"""

from __future__ import annotations

from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import ClockEventReason, GpuSample

# Within this many degrees of the slowdown threshold a loaded GPU's normal
# swings (a few degrees between workload phases, fan ramp lag, inlet
# temperature drifting over the day) carry it into hardware slowdown.
NEAR_SLOWDOWN_MARGIN_C = 5.0
# "Under load": a kernel ran at least half the time, so a low clock costs
# throughput; below that the driver lowering clocks is power management.
LOADED_UTILIZATION_PCT = 50.0
# Boost clocks under full load sit a little under the maximum on healthy GPUs;
# below 85 % of it the power cap is taking a real share of throughput.
POWER_CAP_CLOCK_RATIO = 0.85


def reason_names(reasons: ClockEventReason) -> list[str]:
    """The active reasons as snake-case names, in NVML bit order."""
    return [
        flag.name.lower()
        for flag in ClockEventReason
        if flag.name is not None and flag is not ClockEventReason.NONE and flag in reasons
    ]


def _evidence(s: GpuSample) -> dict[str, Any]:
    return {
        "temperature_c": s.temperature_c,
        "slowdown_temperature_c": s.temperature_slowdown_c,
        "sm_clock_mhz": s.sm_clock_mhz,
        "sm_clock_max_mhz": s.sm_clock_max_mhz,
        "utilization_gpu_pct": s.utilization_gpu_pct,
        "power_draw_w": s.power_draw_w,
        "power_limit_w": s.power_limit_w,
        "clock_event_reasons": reason_names(s.reasons),
    }


def _loaded(s: GpuSample) -> bool:
    return s.utilization_gpu_pct is not None and s.utilization_gpu_pct >= LOADED_UTILIZATION_PCT


def _clock_ratio(s: GpuSample) -> float | None:
    if s.sm_clock_mhz is None or not s.sm_clock_max_mhz:
        return None
    return s.sm_clock_mhz / s.sm_clock_max_mhz


def _clock_loss(s: GpuSample) -> float | None:
    """Share of compute throughput the lowered SM clock costs a busy GPU.

    An upper bound: compute-bound kernels scale with the SM clock, memory-bound
    ones less. ``None`` when the GPU is idle or clocks are unknown.
    """
    ratio = _clock_ratio(s)
    if ratio is None or not _loaded(s):
        return None
    return round(min(1.0, max(0.0, 1.0 - ratio)), 3)


def check_temperature_margin(facts: MachineFacts) -> list[Finding]:
    """Temperature at or within a few degrees of the slowdown threshold."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        if s.temperature_c is None or s.temperature_slowdown_c is None:
            continue
        margin = s.temperature_slowdown_c - s.temperature_c
        evidence = {**_evidence(s), "margin_c": round(margin, 1)}
        if margin <= 0:
            out.append(
                Finding(
                    id="thermal.temperature_at_slowdown",
                    category=Category.THERMAL,
                    severity=Severity.ERROR,
                    title=(
                        f"GPU {s.index} is at {s.temperature_c:.0f} °C, at or over its "
                        f"slowdown threshold of {s.temperature_slowdown_c:.0f} °C"
                    ),
                    evidence=evidence,
                    fix=_COOLING_FIX,
                    impact=_clock_loss(s),
                    subject=f"gpu{s.index}",
                )
            )
        elif margin <= NEAR_SLOWDOWN_MARGIN_C:
            out.append(
                Finding(
                    id="thermal.temperature_near_slowdown",
                    category=Category.THERMAL,
                    severity=Severity.WARNING,
                    title=(
                        f"GPU {s.index} is at {s.temperature_c:.0f} °C, only {margin:.0f} °C "
                        f"below its slowdown threshold of {s.temperature_slowdown_c:.0f} °C"
                    ),
                    evidence=evidence,
                    fix=_COOLING_FIX,
                    impact=None,
                    subject=f"gpu{s.index}",
                )
            )
    return out


_COOLING_FIX = (
    "Improve cooling: check the fans and their speed (nvidia-smi -q -d TEMPERATURE,PERFORMANCE), "
    "airflow through the chassis (blanking panels, nothing blocking intake), dust on heatsinks "
    "and filters, and the room's inlet temperature; on a rented or cloud machine, report the "
    "node to the provider and move to another one."
)

# (flag, id suffix, severity, what it means, fix); the most specific reason wins
# over HW_SLOWDOWN, which NVML also sets for thermal and power-brake slowdowns.
_CLOCK_EVENTS: tuple[tuple[ClockEventReason, str, Severity, str, str], ...] = (
    (
        ClockEventReason.HW_THERMAL_SLOWDOWN,
        "hw_thermal",
        Severity.ERROR,
        "hardware thermal slowdown: the GPU is too hot and hardware cut its clocks",
        _COOLING_FIX,
    ),
    (
        ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
        "hw_power_brake",
        Severity.ERROR,
        "hardware power brake: the system asserted the external power brake and the GPU "
        "cut its clocks",
        "The power brake comes from the server, not the GPU: check the power supplies "
        "(a failed or missing redundant PSU), the BMC/IPMI event log (ipmitool sel list) and "
        "the rack's power budget; on a rented machine, report the node to the provider.",
    ),
    (
        ClockEventReason.HW_SLOWDOWN,
        "hw_slowdown",
        Severity.ERROR,
        "hardware slowdown: clocks cut by half or more (temperature, power draw spike or "
        "power supply fault)",
        "Check temperature and power (nvidia-smi -q -d TEMPERATURE,POWER,PERFORMANCE) and "
        "dmesg for Xid errors; if the GPU is cool and within its power limit, the power "
        "delivery is suspect: drain the node and have the hardware checked.",
    ),
    (
        ClockEventReason.SW_THERMAL_SLOWDOWN,
        "sw_thermal",
        Severity.WARNING,
        "software thermal slowdown: the driver lowers clocks to keep the GPU under its "
        "maximum operating temperature",
        _COOLING_FIX,
    ),
)


def check_clock_events(facts: MachineFacts) -> list[Finding]:
    """Active thermal and power-brake clock event reasons, one finding each."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        reasons = s.reasons
        specific_hw = reasons & (
            ClockEventReason.HW_THERMAL_SLOWDOWN | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
        )
        for flag, suffix, severity, meaning, fix in _CLOCK_EVENTS:
            if flag not in reasons:
                continue
            if flag is ClockEventReason.HW_SLOWDOWN and specific_hw:
                continue
            # Software thermal slowdown is the milder form of the same heat
            # problem; with the hardware one active it adds nothing.
            if (
                flag is ClockEventReason.SW_THERMAL_SLOWDOWN
                and ClockEventReason.HW_THERMAL_SLOWDOWN in reasons
            ):
                continue
            out.append(
                Finding(
                    id=f"thermal.clock_event.{suffix}",
                    category=Category.THERMAL,
                    severity=severity,
                    title=f"GPU {s.index} is slowed by {meaning}",
                    evidence=_evidence(s),
                    fix=fix,
                    impact=_clock_loss(s),
                    subject=f"gpu{s.index}",
                )
            )
    return out


def check_power_cap(facts: MachineFacts) -> list[Finding]:
    """The software power cap holding a busy GPU's clock well below its maximum.

    The power cap is active on many healthy GPUs under heavy load for a few
    percent of clock; it only counts when the GPU is busy *and* the clock is
    below :data:`POWER_CAP_CLOCK_RATIO` of its maximum.
    """
    out: list[Finding] = []
    for s in facts.gpu.samples:
        if ClockEventReason.SW_POWER_CAP not in s.reasons or not _loaded(s):
            continue
        ratio = _clock_ratio(s)
        if ratio is None or ratio >= POWER_CAP_CLOCK_RATIO:
            continue
        limit = f"{s.power_limit_w:.0f} W" if s.power_limit_w is not None else "its limit"
        out.append(
            Finding(
                id="thermal.clock_event.sw_power_cap",
                category=Category.THERMAL,
                severity=Severity.WARNING,
                title=(
                    f"GPU {s.index} is held at {ratio:.0%} of its maximum SM clock by its "
                    f"power limit of {limit}"
                ),
                evidence={**_evidence(s), "sm_clock_ratio": round(ratio, 3)},
                fix=(
                    "Compare the enforced power limit with the default and maximum "
                    "(nvidia-smi -q -d POWER); if someone lowered it, restore it with "
                    f"sudo nvidia-smi -i {s.index} -pl <default watts>. If it already is the "
                    "default, the card runs at its design power and only a GPU with a higher "
                    "power budget is faster."
                ),
                impact=_clock_loss(s),
                subject=f"gpu{s.index}",
            )
        )
    return out


CHECKS = (check_temperature_margin, check_clock_events, check_power_cap)
