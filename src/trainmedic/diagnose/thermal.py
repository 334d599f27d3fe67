"""GPU clocks held down by heat or power during the run (``thermal``).

Which clock event reasons count, their names and fixes are doctor's, from
one table (:mod:`trainmedic.gpu.faults`): hardware thermal slowdown, the
power brake, hardware slowdown and software thermal slowdown count at once,
the most specific naming the finding; limits (the power cap, the board limit,
the reliability limit) count only on a loaded GPU (utilization >=
``gpu_loaded_util_pct``) whose SM clock sits below ``power_cap_clock_ratio``
of its maximum; a reading with the GPU_IDLE reason never counts. The run adds
time: the share of the observed time the GPU spent slowed; a hard slowdown
holding less than ``throttle_error_share`` of it is a warning, not an error.
The slowed readings are joined to the steps they overlap: the share of steps
that ran slowed and how much longer their median is than the others' ("power
brake active in 41 % of steps; they take 18 % longer"), when at least three
steps fall on each side.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import Interval, RunView, sample_intervals
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import ClockEventReason, GpuSample

R = ClockEventReason


def is_loaded(g: GpuSample, th: Thresholds) -> bool:
    """A kernel ran at least ``gpu_loaded_util_pct`` of the time and the GPU is not idle."""
    return faults.is_loaded(g, th.gpu_loaded_util_pct)


def active_reasons(g: GpuSample, th: Thresholds) -> ClockEventReason:
    """The reasons that slow this reading's GPU (:func:`trainmedic.gpu.faults.active_reasons`)."""
    return faults.active_reasons(g, th.gpu_loaded_util_pct, th.power_cap_clock_ratio)


def throttled_intervals(view: RunView, th: Thresholds) -> list[Interval]:
    """Periods in which any job GPU was slowed (for the stall rule)."""
    out: list[Interval] = []
    for index in view.job_gpu_indices:
        series = view.gpu_series(index, steady_only=False)
        ivs = sample_intervals([g.timestamp for g in series])
        out += [iv for g, iv in zip(series, ivs, strict=True) if active_reasons(g, th)]
    return out


def throttling(view: RunView, th: Thresholds) -> list[Finding]:
    findings = []
    for index in view.job_gpu_indices:
        series = view.gpu_series(index)
        finding = _throttle(index, series, view, th) or _margin(index, series, th)
        if finding is not None:
            findings.append(finding)
    return findings


def _throttle(index: int, series: list[GpuSample], view: RunView, th: Thresholds) -> Finding | None:
    intervals = sample_intervals([g.timestamp for g in series])
    covered = sum(b - a for a, b in intervals)
    hits = [
        (g, iv, active)
        for g, iv in zip(series, intervals, strict=True)
        if (active := active_reasons(g, th))
    ]
    if not hits or covered <= 0:
        return None
    seen = R.NONE
    for _, _, a in hits:
        seen |= a
    hit_t = sum(iv[1] - iv[0] for _, iv, _ in hits)
    share = min(1.0, hit_t / covered)
    rule = faults.leading_rule(seen)
    if rule is None:
        return None
    if rule.hard:
        brief = share < th.throttle_error_share
        severity = Severity.WARNING if brief else Severity(rule.level)
    elif share >= th.power_cap_min_share:
        severity = Severity(rule.level)
    else:
        return None

    deficits = [
        1.0 - g.sm_clock_mhz / g.sm_clock_max_mhz
        for g, _, _ in hits
        if g.sm_clock_mhz is not None and g.sm_clock_max_mhz
    ]
    if deficits:
        # Time at reduced clock x how far the clock fell: the compute time lost when GPU-bound.
        impact: float | None = min(1.0, share * max(0.0, sum(deficits) / len(deficits)))
    else:
        impact = view.slowdown_share([iv for _, iv, _ in hits])
    temps = [g.temperature_c for g in series if g.temperature_c is not None]
    ev: dict[str, Any] = {
        "reasons": faults.rule_keys(seen),
        "throttled_time_share": share,
        "throttled_samples": len(hits),
        "samples": len(series),
        "throttle_error_share": th.throttle_error_share,
    }
    if deficits:
        ev["clock_deficit_mean"] = sum(deficits) / len(deficits)
        ev["sm_clock_max_mhz"] = max(g.sm_clock_max_mhz or 0.0 for g, _, _ in hits)
    if temps:
        ev["temperature_max_c"] = max(temps)
    slowdown = [g.temperature_slowdown_c for g in series if g.temperature_slowdown_c]
    if slowdown:
        ev["temperature_slowdown_c"] = min(slowdown)
    power = [g.power_draw_w for g, _, _ in hits if g.power_draw_w is not None]
    limit = [g.power_limit_w for g in series if g.power_limit_w]
    if power:
        ev["power_draw_mean_w"] = sum(power) / len(power)
    if limit:
        ev["power_limit_w"] = min(limit)
    title = f"GPU {index} was slowed ({rule.name}) during {share:.0%} of the run"
    joined = view.steps_slower_during([iv for _, iv, _ in hits])
    if joined is not None:
        # The steps that ran while it was slowed, against the others: what it cost them.
        steps_share, slower = joined
        ev["throttled_steps_share"] = round(steps_share, 4)
        ev["throttled_steps_slower_share"] = round(slower, 4)
        title += (
            f"; {steps_share:.0%} of the steps ran while it was, "
            + (f"{slower:.0%} longer than the others" if slower >= 0.01 else
               "no longer than the others")
        )
    return Finding(
        id=f"thermal.throttle.{rule.key}",
        category=Category.THERMAL,
        severity=severity,
        title=title,
        evidence=ev,
        detail=f"{rule.name.capitalize()}: {rule.meaning}.",
        fix=rule.fix,
        impact=impact,
        subject=f"gpu{index}",
    )


def _margin(index: int, series: list[GpuSample], th: Thresholds) -> Finding | None:
    """Loaded temperature within ``temperature_margin_c`` of the slowdown temperature."""
    pairs = [
        (g.temperature_c, g.temperature_slowdown_c)
        for g in series
        if is_loaded(g, th) and g.temperature_c is not None and g.temperature_slowdown_c
    ]
    if not pairs:
        return None
    temp, slowdown = max(pairs, key=lambda p: p[0] - p[1])
    if temp < slowdown - th.temperature_margin_c:
        return None
    return Finding(
        id="thermal.temperature_margin",
        category=Category.THERMAL,
        severity=Severity.WARNING,
        title=(
            f"GPU {index} ran {slowdown - temp:.0f} °C from its slowdown temperature"
            if temp < slowdown
            else f"GPU {index} reached its slowdown temperature ({temp:.0f} °C)"
        ),
        evidence={
            "temperature_max_c": temp,
            "temperature_slowdown_c": slowdown,
            "temperature_margin_c": th.temperature_margin_c,
        },
        fix=faults.CLOCK_RULE_BY_KEY["hw_thermal"].fix,
        impact=None,
        subject=f"gpu{index}",
    )
