"""GPU readings behind one seam (NVML or a simulation file), and what GPU faults mean."""

from trainmedic.gpu.backend import (
    GpuBackend,
    NoGpuBackend,
    XidNotice,
    XidWatch,
    sample_all,
)
from trainmedic.gpu.factory import open_backend
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuRef,
    GpuSample,
    MigDevice,
    PcieLink,
    RemappedRows,
    normalize_pci_bus_id,
)

__all__ = [
    "ClockEventReason",
    "DriverInfo",
    "EccCounts",
    "GpuBackend",
    "GpuProcess",
    "GpuRef",
    "GpuSample",
    "MigDevice",
    "NoGpuBackend",
    "PcieLink",
    "RemappedRows",
    "XidNotice",
    "XidWatch",
    "normalize_pci_bus_id",
    "open_backend",
    "sample_all",
]
