"""Is each GPU sound under load: memory test, ECC counters, clocks and heat, dcgmi.

Pure functions from a :class:`~.results.StressResult` to findings (docs/stress.md lists
the ids). Which clock event reasons count, their names and fixes, and the slowdown
temperature margin come from :mod:`trainmedic.gpu.faults`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from trainmedic.doctor.stress.results import Drift, GpuStress, StressResult
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults

THROTTLE_MIN_SHARE = 0.1
"""A slowdown reason counts when it held in at least this share of the readings under
load (one reading in ten: a brief brake is noise, a steady one costs throughput)."""
MIN_READINGS = 3
"""Fewer readings than this say nothing about the load's course."""
CLOCK_FALL_MIN = 0.15
"""An SM clock that ends this share below where it started fell under load."""
MEMTEST_PAGE_BYTES = 2 * 1024 * 1024
"""Errors are grouped into pages of this size (the GPU's large pages), so that one bad
row shows as one page."""
MAX_PAGES_SHOWN = 16

Check = Callable[[StressResult], list[Finding]]


def _pct(share: float) -> str:
    return f"{share:.0%}".replace("%", " %")


def leading_slowdown(g: GpuStress) -> tuple[faults.ClockReasonRule, float] | None:
    """The most specific slowdown reason that held in at least
    :data:`THROTTLE_MIN_SHARE` of the readings, with its share."""
    if g.readings.samples < MIN_READINGS:
        return None
    for rule in faults.CLOCK_RULES:
        share = g.readings.reason_shares.get(rule.key, 0.0)
        if share >= THROTTLE_MIN_SHARE:
            return rule, share
    return None


def _drift_evidence(g: GpuStress) -> dict[str, Any]:
    r = g.readings
    return {
        "readings": r.samples,
        "sm_clock_mhz": None if r.sm_clock_mhz is None else r.sm_clock_mhz.to_dict(),
        "sm_clock_max_mhz": r.sm_clock_max_mhz,
        "mean_clock_ratio": r.mean_clock_ratio,
        "power_w": None if r.power_w is None else r.power_w.to_dict(),
        "power_limit_w": r.power_limit_w,
        "temperature_c": None if r.temperature_c is None else r.temperature_c.to_dict(),
        "temperature_slowdown_c": r.temperature_slowdown_c,
        "clock_event_shares": dict(r.reason_shares),
    }


def _clock_loss(g: GpuStress) -> float | None:
    ratio = g.readings.mean_clock_ratio
    return None if ratio is None else round(min(1.0, max(0.0, 1 - ratio)), 4)


def _clock_course(clock: Drift | None) -> str:
    """``its SM clock fell from 1980 to 1200 MHz (-39 %)``, naming the end when it came
    back up."""
    if clock is None or clock.start <= 0:
        return ""
    text = (
        f"its SM clock fell from {clock.start:.0f} to {clock.low:.0f} MHz "
        f"({clock.low / clock.start - 1:+.0%})"
    ).replace("%", " %")
    if clock.low == clock.start:
        return f"its SM clock held at {clock.start:.0f} MHz"
    return text + (f" and ended at {clock.end:.0f} MHz" if clock.end > clock.low else "")


def check_throttling(result: StressResult) -> list[Finding]:
    """A slowdown reason held through the load; else an SM clock that fell by
    :data:`CLOCK_FALL_MIN` or more with no reason given."""
    out = []
    for g in result.gpus:
        clock = g.readings.sm_clock_mhz
        fell = clock is not None and clock.change is not None and clock.change <= -CLOCK_FALL_MIN
        course = _clock_course(clock)
        lead = leading_slowdown(g)
        if lead is not None:
            rule, share = lead
            out.append(
                Finding(
                    id="stress.throttled_under_load",
                    category=Category.THERMAL,
                    severity=Severity(rule.level),
                    title=(
                        f"GPU {g.index} under load: {rule.name} active {_pct(share)} of the "
                        "time" + (f"; {course}" if course else "")
                    ),
                    evidence={**_drift_evidence(g), "leading_reason": rule.key},
                    detail=f"{rule.name.capitalize()}: {rule.meaning}.",
                    fix=rule.fix.replace("<index>", str(g.index)),
                    impact=_clock_loss(g),
                    subject=f"gpu{g.index}",
                )
            )
        elif fell and g.readings.samples >= MIN_READINGS:
            out.append(
                Finding(
                    id="stress.clock_fell_under_load",
                    category=Category.THERMAL,
                    severity=Severity.WARNING,
                    title=f"GPU {g.index} under load: {course}, with no clock event reason "
                    "reported",
                    evidence=_drift_evidence(g),
                    fix=f"Watch it under load (nvidia-smi -i {g.index} -q -d "
                    "PERFORMANCE,CLOCK,POWER,TEMPERATURE -l 1): a clock falling with no reason "
                    "is often the power supply or the driver's power management; compare "
                    "with the other GPUs and report it if only this one falls.",
                    impact=_clock_loss(g),
                    subject=f"gpu{g.index}",
                )
            )
    return out


def check_temperature(result: StressResult) -> list[Finding]:
    """The hottest reading within :data:`trainmedic.gpu.faults.NEAR_SLOWDOWN_MARGIN_C` of
    the slowdown threshold (a warning), or at it (an error)."""
    out = []
    for g in result.gpus:
        temp, limit = g.readings.temperature_c, g.readings.temperature_slowdown_c
        if temp is None or limit is None:
            continue
        margin = limit - temp.high
        if margin > faults.NEAR_SLOWDOWN_MARGIN_C:
            continue
        at = margin <= 0
        out.append(
            Finding(
                id="stress.temperature_at_slowdown" if at else "stress.temperature_near_slowdown",
                category=Category.THERMAL,
                severity=Severity.ERROR if at else Severity.WARNING,
                title=(
                    f"GPU {g.index} heated from {temp.start:.0f} to {temp.high:.0f} °C under "
                    f"load, "
                    + ("at or over" if at else f"{margin:.0f} °C under")
                    + f" its slowdown threshold of {limit:.0f} °C"
                ),
                evidence={
                    **_drift_evidence(g),
                    "margin_c": round(margin, 1),
                    "near_margin_c": faults.NEAR_SLOWDOWN_MARGIN_C,
                },
                fix=faults.CLOCK_RULE_BY_KEY["hw_thermal"].fix,
                impact=_clock_loss(g) if at else None,
                subject=f"gpu{g.index}",
            )
        )
    return out


def check_memtest(result: StressResult) -> list[Finding]:
    """Words of device memory that read back different from what was written."""
    out = []
    for g in result.gpus:
        m = g.memtest
        if m is None or m.errors == 0:
            continue
        pages = sorted({o // MEMTEST_PAGE_BYTES for o in m.error_offsets})
        out.append(
            Finding(
                id="stress.memory_test_errors",
                category=Category.HARDWARE_FAULT,
                severity=Severity.ERROR,
                title=(
                    f"GPU {g.index}'s memory test read {m.errors} wrong word(s) in "
                    f"{len(pages)} page(s) of 2 MiB, over {m.tested_bytes / 2**30:.1f} GiB "
                    f"({_pct(m.share_of_free)} of its free memory)"
                ),
                evidence={
                    "errors": m.errors,
                    "pages_2mib": pages[:MAX_PAGES_SHOWN],
                    "pages_count": len(pages),
                    "first_error_offsets": [hex(o) for o in m.error_offsets[:MAX_PAGES_SHOWN]],
                    "tested_bytes": m.tested_bytes,
                    "share_of_free": m.share_of_free,
                    "patterns": list(m.patterns),
                    "passes": m.passes,
                    "ecc_volatile_uncorrected_after": g.ecc_after.volatile_uncorrected,
                },
                detail="Offsets are within the tested allocation (device virtual memory): the "
                "driver's row remapping and ECC counters name the physical rows.",
                fix=f"Drain GPU {g.index}: stop scheduling work on it, run dcgmi diag -r 3 and "
                "report it to the provider or NVIDIA support with this finding.",
                impact=None,
                subject=f"gpu{g.index}",
            )
        )
    return out


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before


def check_ecc(result: StressResult) -> list[Finding]:
    """ECC errors counted during the run; a row remap that became pending."""
    out = []
    for g in result.gpus:
        unc = _delta(g.ecc_before.volatile_uncorrected, g.ecc_after.volatile_uncorrected)
        cor = _delta(g.ecc_before.volatile_corrected, g.ecc_after.volatile_corrected)
        pending = bool(g.rows_after.pending) and not g.rows_before.pending
        if not (unc and unc > 0) and not (cor and cor > 0) and not pending:
            continue
        error = bool(unc and unc > 0) or pending
        what = []
        if unc:
            what.append(f"{unc} uncorrectable")
        if cor:
            what.append(f"{cor} corrected")
        title = f"GPU {g.index} counted " + " and ".join(what) + " ECC error(s) under load"
        if not what:
            title = f"GPU {g.index} has a row remap pending after the load"
        elif pending:
            title += "; a row remap is now pending"
        out.append(
            Finding(
                id="stress.ecc_errors_under_load",
                category=Category.HARDWARE_FAULT,
                severity=Severity.ERROR if error else Severity.WARNING,
                title=title,
                evidence={
                    "volatile_uncorrected_delta": unc,
                    "volatile_corrected_delta": cor,
                    "ecc_before": vars(g.ecc_before),
                    "ecc_after": vars(g.ecc_after),
                    "remap_pending_after": g.rows_after.pending,
                },
                fix=(
                    f"Drain GPU {g.index} and reset it (nvidia-smi -r -i {g.index}) so the "
                    "pending remap applies; uncorrectable errors kill the processes using the "
                    "memory: report the GPU if they recur."
                )
                if error
                else "Corrected errors cost nothing now; watch the counter (nvidia-smi -q -d ECC): "
                "a rising count precedes uncorrectable errors.",
                impact=None,
                subject=f"gpu{g.index}",
            )
        )
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "test"


def check_dcgm(result: StressResult) -> list[Finding]:
    """Each failed or warned dcgmi diag test, per GPU."""
    outcome = result.dcgm
    if outcome is None or not outcome.ran:
        return []
    out = []
    for v in outcome.verdicts:
        if not (v.failed or v.warned):
            continue
        who = f"GPU {v.gpu}" if v.gpu is not None else "the system"
        said = f": {v.messages[0]}" if v.messages else ""
        out.append(
            Finding(
                id=f"stress.dcgm.{_slug(v.test)}",
                category=Category.HARDWARE_FAULT,
                severity=Severity.ERROR if v.failed else Severity.WARNING,
                title=f"dcgmi diag -r {outcome.level}: {v.test} {v.status.lower()}ed on {who}"
                + said,
                evidence={
                    "level": outcome.level,
                    "category": v.category,
                    "test": v.test,
                    "status": v.status,
                    "messages": list(v.messages),
                },
                fix="Follow the message's advice in the DCGM diagnostics guide "
                "(docs.nvidia.com/datacenter/dcgm, 'DCGM Diagnostics'); a failed hardware "
                "test means draining the GPU and reporting it.",
                impact=None,
                subject=f"gpu{v.gpu}" if v.gpu is not None else "host",
            )
        )
    return out


HEALTH_CHECKS: tuple[Check, ...] = (
    check_throttling,
    check_temperature,
    check_memtest,
    check_ecc,
    check_dcgm,
)
