"""Hand-built stress results for the judgment tests."""

from __future__ import annotations

from typing import Any

from trainmedic.doctor.stress import datasheet
from trainmedic.doctor.stress.machine import MEMTEST_PATTERNS, MemtestOutcome
from trainmedic.doctor.stress.results import Drift, GpuStress, LoadReadings, Rate, StressResult
from trainmedic.gpu.types import PcieLink


def rate(mean: float) -> Rate:
    return Rate(mean, mean, mean, 4)


def make_readings(**overrides: Any) -> LoadReadings:
    """Twenty readings of a GPU at full clock, 45 -> 70 °C of 87."""
    fields: dict[str, Any] = {
        "samples": 20,
        "sm_clock_mhz": Drift(1980, 1980, 1980, 1980),
        "power_w": Drift(650, 660, 640, 690),
        "temperature_c": Drift(45, 70, 45, 70),
        "sm_clock_max_mhz": 1980.0,
        "power_limit_w": 700.0,
        "temperature_slowdown_c": 87.0,
        "mean_clock_ratio": 1.0,
        "reason_shares": {},
        "link_gen_under_load": 5,
        "link_width_under_load": 16,
    }
    fields.update(overrides)
    return LoadReadings(**fields)


def make_gpu(index: int = 0, **overrides: Any) -> GpuStress:
    """A healthy H100 SXM5 at 77 % of its bf16 peak."""
    fields: dict[str, Any] = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index}",
        "datasheet": datasheet.lookup("NVIDIA H100 80GB HBM3"),
        "tflops": {"bf16": rate(760.0), "fp32": rate(51.0)},
        "not_measured": {},
        "memory_gb_per_s": rate(2950.0),
        "memtest": MemtestOutcome(64 << 30, 0.8, MEMTEST_PATTERNS, 3, 0, (), 3.0),
        "host_gb_per_s": {"h2d_pinned": rate(54.0), "d2h_pinned": rate(53.0)},
        "link": PcieLink(gen_current=1, gen_max=5, width_current=16, width_max=16),
        "readings": make_readings(),
    }
    fields.update(overrides)
    return GpuStress(**fields)


def make_result(*gpus: GpuStress, **overrides: Any) -> StressResult:
    fields: dict[str, Any] = {
        "seconds": 20.0,
        "elapsed_s": 35.0,
        "backend": "simulated",
        "machine": "simulated",
        "gpus": gpus or (make_gpu(),),
    }
    fields.update(overrides)
    return StressResult(**fields)
