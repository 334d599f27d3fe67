"""The GPU backend's readings through a stress run, summed up per GPU.

Pure: from the :class:`~trainmedic.gpu.types.GpuSample` objects read during the bursts
(:mod:`.sampling`) to :class:`~.results.LoadReadings`: each reading's course from the
first reading under load to the last, and each slowdown reason's share of them. Which
clock event reasons count, and when, is
:mod:`trainmedic.gpu.faults` (the table doctor and the run diagnosis read too).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmedic.doctor.stress.results import Drift, LoadReadings
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample


def summarize_load(
    samples: Sequence[GpuSample],
    link_samples: Sequence[GpuSample] = (),
    period_s: float | None = None,
) -> LoadReadings:
    """The readings of one GPU taken during the bursts, every ``period_s`` seconds;
    ``link_samples`` are those taken during its host copies (the PCIe link's state under
    load)."""
    last = samples[-1] if samples else None
    ratios = [r for r in (faults.clock_ratio(s) for s in samples) if r is not None]
    shares: dict[str, float] = {}
    if samples:
        for rule in faults.CLOCK_RULES:
            hits = sum(1 for s in samples if rule.flag in faults.active_reasons(s))
            if hits:
                shares[rule.key] = round(hits / len(samples), 4)
    gens = [s.pcie.gen_current for s in link_samples if s.pcie.gen_current is not None]
    widths = [s.pcie.width_current for s in link_samples if s.pcie.width_current is not None]
    return LoadReadings(
        samples=len(samples),
        sm_clock_mhz=Drift.of([s.sm_clock_mhz for s in samples]),
        power_w=Drift.of([s.power_draw_w for s in samples]),
        temperature_c=Drift.of([s.temperature_c for s in samples]),
        sm_clock_max_mhz=last.sm_clock_max_mhz if last else None,
        power_limit_w=last.power_limit_w if last else None,
        temperature_slowdown_c=last.temperature_slowdown_c if last else None,
        mean_clock_ratio=round(sum(ratios) / len(ratios), 4) if ratios else None,
        reason_shares=shares,
        link_gen_under_load=max(gens) if gens else None,
        link_width_under_load=max(widths) if widths else None,
        sample_period_s=period_s,
    )
