"""GPU readings behind one seam: NVML (nvidia-ml-py) or a simulation file."""

from trainmedic.gpu.backend import GpuBackend, NoGpuBackend, open_backend, sample_all
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuSample,
    PcieLink,
    RemappedRows,
)

__all__ = [
    "ClockEventReason",
    "DriverInfo",
    "EccCounts",
    "GpuBackend",
    "GpuProcess",
    "GpuSample",
    "NoGpuBackend",
    "PcieLink",
    "RemappedRows",
    "open_backend",
    "sample_all",
]
