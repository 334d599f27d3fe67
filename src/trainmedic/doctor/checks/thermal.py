"""Heat and power limits that slow the GPU down (docs/doctor-checks.md, "thermal").

Judged from one reading per GPU: the temperature's margin to the slowdown
threshold and the clock event reasons NVML reports as active right now. Which
reasons count, under which thresholds, their names and fixes come from
:mod:`trainmedic.gpu.faults`, the table the run diagnosis uses too.
"""

from __future__ import annotations

from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample

NEAR_SLOWDOWN_MARGIN_C = faults.NEAR_SLOWDOWN_MARGIN_C
LOADED_UTILIZATION_PCT = faults.LOADED_UTILIZATION_PCT
POWER_CAP_CLOCK_RATIO = faults.LIMIT_CLOCK_RATIO


def reason_names(reasons: Any) -> list[str]:
    """The active reasons as snake-case names, in NVML bit order."""
    return faults.reason_names(reasons)


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


def _clock_loss(s: GpuSample) -> float | None:
    """Share of compute throughput the lowered SM clock costs a busy GPU.

    An upper bound: compute-bound kernels scale with the SM clock, memory-bound
    ones less. ``None`` when the GPU is idle or clocks are unknown.
    """
    ratio = faults.clock_ratio(s)
    if ratio is None or not faults.is_loaded(s):
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
                    fix=faults.CLOCK_RULE_BY_KEY["hw_thermal"].fix,
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
                    fix=faults.CLOCK_RULE_BY_KEY["hw_thermal"].fix,
                    impact=None,
                    subject=f"gpu{s.index}",
                )
            )
    return out


def check_clock_events(facts: MachineFacts) -> list[Finding]:
    """The clock event reasons slowing each GPU now: one finding per GPU, named by
    the most specific reason (NVML sets HW_SLOWDOWN together with the thermal and
    power-brake bits). Limits count only under load with the clock held low."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        active = faults.active_reasons(s)
        rule = faults.leading_rule(active)
        if rule is None:
            continue
        evidence = {**_evidence(s), "active_reasons": faults.rule_keys(active)}
        ratio = faults.clock_ratio(s)
        if rule.hard:
            title = f"GPU {s.index} is slowed by {rule.name}: {rule.meaning}"
        else:
            assert ratio is not None  # a limit only counts with a known, low clock
            evidence["sm_clock_ratio"] = round(ratio, 3)
            title = f"GPU {s.index} is held at {ratio:.0%} of its maximum SM clock by its "
            if rule.flag is faults.R.SW_POWER_CAP and s.power_limit_w is not None:
                title += f"power limit of {s.power_limit_w:.0f} W"
            else:
                title += rule.name
        out.append(
            Finding(
                id=f"thermal.clock_event.{rule.key}",
                category=Category.THERMAL,
                severity=Severity(rule.level),
                title=title,
                evidence=evidence,
                detail=f"{rule.name.capitalize()}: {rule.meaning}.",
                fix=rule.fix.replace("<index>", str(s.index)),
                impact=_clock_loss(s),
                subject=f"gpu{s.index}",
            )
        )
    return out


CHECKS = (check_temperature_margin, check_clock_events)
