"""GPU clocks held down by heat or power during the run (``thermal``).

Reason semantics match doctor's (docs/doctor-checks.md, "thermal"): hardware
thermal slowdown, the power brake, hardware slowdown and software thermal
slowdown count at once, the most specific one naming the finding (NVML sets
HW_SLOWDOWN together with the thermal and power-brake bits); the software
power cap counts only on a loaded GPU (utilization >= ``gpu_loaded_util_pct``)
whose SM clock sits below ``power_cap_clock_ratio`` of its maximum (a busy
GPU often touches its cap near full clock); a reading with the GPU_IDLE
reason never counts. The run adds time: the share of the observed time the
GPU spent slowed.
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import Interval, RunView, sample_intervals
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import ClockEventReason, GpuSample

R = ClockEventReason

#: reasons that count at once, most specific first, with the id suffix each gives.
HARD_REASONS: tuple[tuple[ClockEventReason, str], ...] = (
    (R.HW_THERMAL_SLOWDOWN, "hw_thermal"),
    (R.HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
    (R.HW_SLOWDOWN, "hw_slowdown"),
    (R.SW_THERMAL_SLOWDOWN, "sw_thermal"),
)
HARD_MASK = (
    R.HW_POWER_BRAKE_SLOWDOWN | R.HW_SLOWDOWN | R.HW_THERMAL_SLOWDOWN | R.SW_THERMAL_SLOWDOWN
)

_NAMES = {
    "hw_power_brake": "power brake",
    "hw_slowdown": "hardware slowdown",
    "hw_thermal": "hardware thermal slowdown",
    "sw_thermal": "thermal slowdown",
    "sw_power_cap": "power cap",
}
_FIX = {
    "hw_power_brake": "The server asserted the external power brake: check the power "
    "supplies, the BMC/IPMI event log (ipmitool sel list) and the rack's power budget; on a "
    "rented machine report the node to the provider.",
    "hw_slowdown": "Hardware slowdown (heat or power): check cooling and power delivery "
    "(nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER); clean dust, fix airflow, or drain "
    "the GPU if it repeats at normal temperature.",
    "hw_thermal": "The GPU overheats: improve airflow and cooling (fans, dust, blocked "
    "slots, room temperature) or lower the power limit (nvidia-smi -pl) for steady clocks.",
    "sw_thermal": "The driver slows the GPU for heat: improve airflow and cooling or lower "
    "the power limit (nvidia-smi -pl) for steady clocks.",
    "sw_power_cap": "The power limit holds clocks down: raise it toward the default "
    "(nvidia-smi -q -d POWER; sudo nvidia-smi -pl <watts>) or ask the provider.",
}


def is_loaded(g: GpuSample, th: Thresholds) -> bool:
    """A kernel ran at least ``gpu_loaded_util_pct`` of the time and the GPU is not idle."""
    if R.GPU_IDLE in g.reasons:
        return False
    return g.utilization_gpu_pct is not None and g.utilization_gpu_pct >= th.gpu_loaded_util_pct


def active_reasons(g: GpuSample, th: Thresholds) -> ClockEventReason:
    """The reasons that slow this reading's GPU (semantics in the module docstring)."""
    if g.clock_event_reasons is None or R.GPU_IDLE in g.reasons:
        return R.NONE
    active = g.reasons & HARD_MASK
    if (
        R.SW_POWER_CAP in g.reasons
        and is_loaded(g, th)
        and g.sm_clock_mhz is not None
        and g.sm_clock_max_mhz
        and g.sm_clock_mhz < th.power_cap_clock_ratio * g.sm_clock_max_mhz
    ):
        active |= R.SW_POWER_CAP
    return active


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
    hard = seen & HARD_MASK
    if hard:
        key = next(name for flag, name in HARD_REASONS if flag in hard)
        severity = Severity.ERROR if share >= th.throttle_error_share else Severity.WARNING
    elif share >= th.power_cap_min_share:
        key, severity = "sw_power_cap", Severity.WARNING
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
        "reasons": [name for flag, name in HARD_REASONS if flag in seen]
        + (["sw_power_cap"] if R.SW_POWER_CAP in seen else []),
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
    return Finding(
        id=f"thermal.throttle.{key}",
        category=Category.THERMAL,
        severity=severity,
        title=f"GPU {index} was slowed ({_NAMES[key]}) during {share:.0%} of the run",
        evidence=ev,
        fix=_FIX[key],
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
        fix=_FIX["hw_thermal"],
        impact=None,
        subject=f"gpu{index}",
    )
