"""The NVML backend against a small in-memory stand-in for ``pynvml``.

The fake answers the same calls nvidia-ml-py offers, with values chosen so a
mixed-up constant or unit shows: the slowdown and shutdown thresholds differ,
power is in milliwatts, the CUDA version is NVML's integer.
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from trainmedic.gpu.backend import NoGpuBackend, sample_all
from trainmedic.gpu.nvml import NvmlBackend, open_nvml
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    PcieLink,
    RemappedRows,
)

GIB = 1 << 30
NOT_AVAILABLE = 2**64 - 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


def make_device(**overrides: Any) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": b"NVIDIA A100-SXM4-80GB",
        "uuid": "GPU-5f1c",
        "memory": SimpleNamespace(total=80 * GIB, used=2 * GIB, free=78 * GIB),
        "utilization": SimpleNamespace(gpu=87, memory=41),
        "temperature": 71,
        "thresholds": {1: 88, 0: 93},  # slowdown, shutdown
        "power_mw": 312_500,
        "limit_mw": 400_000,
        "sm_clock": 1275,
        "sm_clock_max": 1410,
        "reasons": int(ClockEventReason.SW_POWER_CAP),
        "throttle_reasons": int(ClockEventReason.HW_SLOWDOWN),
        "ecc": {(0, 0): 4, (1, 0): 1, (0, 1): 120, (1, 1): 2},  # (type, counter)
        "pages_pending": 1,
        "remapped": (3, 1, 1, 0),
        "pcie": {"gen": 3, "gen_max": 4, "gen_gpu_max": 4, "width": 8, "width_max": 16},
        "pcie_throughput": {0: 1200, 1: 3400},
        "processes": [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=GIB),
            SimpleNamespace(pid=2**22 + 12345, usedGpuMemory=NOT_AVAILABLE),
        ],
        "persistence": 1,
        "cc": (8, 0),
    }
    device.update(overrides)
    return device


class FakeNvml:
    """The subset of ``pynvml`` the backend uses; names in ``unsupported`` raise."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NoPermission = NVMLError_NoPermission
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(
        self,
        devices: list[dict[str, Any]],
        unsupported: set[str] | None = None,
        init_error: Exception | None = None,
    ) -> None:
        self.devices = devices
        self.unsupported = unsupported or set()
        self.init_error = init_error
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if name.startswith("nvml") and callable(value):
            unsupported = object.__getattribute__(self, "unsupported")
            calls = object.__getattribute__(self, "calls")

            def call(*args: Any, _fn: Callable[..., Any] = value) -> Any:
                calls.append(name)
                if name in unsupported:
                    raise NVMLError_NotSupported(name)
                return _fn(*args)

            return call
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12020

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.devices[index]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> Any:
        return h["name"]

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> Any:
        return h["uuid"]

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        return h["memory"]

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> Any:
        return h["utilization"]

    def nvmlDeviceGetTemperature(self, h: dict[str, Any], sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(h["temperature"])

    def nvmlDeviceGetTemperatureThreshold(self, h: dict[str, Any], kind: int) -> int:
        return int(h["thresholds"][kind])

    def nvmlDeviceGetPowerUsage(self, h: dict[str, Any]) -> int:
        return int(h["power_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h: dict[str, Any]) -> int:
        return int(h["limit_mw"])

    def nvmlDeviceGetClockInfo(self, h: dict[str, Any], clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(h["sm_clock"])

    def nvmlDeviceGetMaxClockInfo(self, h: dict[str, Any], clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(h["sm_clock_max"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: dict[str, Any]) -> int:
        return int(h["reasons"])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: dict[str, Any]) -> int:
        return int(h["throttle_reasons"])

    def nvmlDeviceGetTotalEccErrors(self, h: dict[str, Any], error_type: int, counter: int) -> int:
        return int(h["ecc"][(error_type, counter)])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: dict[str, Any]) -> int:
        return int(h["pages_pending"])

    def nvmlDeviceGetRemappedRows(self, h: dict[str, Any]) -> tuple[int, ...]:
        return tuple(h["remapped"])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return int(h["pcie"]["gen"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return int(h["pcie"]["gen_max"])

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return int(h["pcie"]["gen_gpu_max"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return int(h["pcie"]["width"])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return int(h["pcie"]["width_max"])

    def nvmlDeviceGetPcieThroughput(self, h: dict[str, Any], counter: int) -> int:
        return int(h["pcie_throughput"][counter])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Any]:
        return list(h["processes"])

    def nvmlDeviceGetPersistenceMode(self, h: dict[str, Any]) -> int:
        return int(h["persistence"])

    def nvmlDeviceGetCudaComputeCapability(self, h: dict[str, Any]) -> tuple[int, int]:
        return (int(h["cc"][0]), int(h["cc"][1]))


ALL_DEVICE_QUERIES = {
    name
    for name in dir(FakeNvml)
    if name.startswith("nvmlDevice")
    and name not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex")
}


def test_every_reading_is_converted_to_sample_units() -> None:
    backend = NvmlBackend(FakeNvml([make_device()]))
    assert backend.kind == "nvml"
    assert backend.absent_reason is None
    assert backend.device_count() == 1
    s = backend.sample(0)
    assert s.index == 0
    assert s.name == "NVIDIA A100-SXM4-80GB"  # bytes decoded
    assert s.uuid == "GPU-5f1c"
    assert (s.memory_total_bytes, s.memory_used_bytes) == (80 * GIB, 2 * GIB)
    assert (s.utilization_gpu_pct, s.utilization_memory_pct) == (87.0, 41.0)
    assert (s.temperature_c, s.temperature_slowdown_c, s.temperature_shutdown_c) == (
        71.0,
        88.0,
        93.0,
    )
    assert (s.power_draw_w, s.power_limit_w) == (312.5, 400.0)
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz) == (1275.0, 1410.0)
    assert s.reasons == ClockEventReason.SW_POWER_CAP
    assert s.ecc == EccCounts(
        volatile_corrected=4,
        volatile_uncorrected=1,
        aggregate_corrected=120,
        aggregate_uncorrected=2,
    )
    assert s.retired_pages_pending is True
    assert s.remapped_rows == RemappedRows(
        correctable=3, uncorrectable=1, pending=True, failure=False
    )
    assert s.pcie == PcieLink(3, 4, 4, 8, 16, 1200, 3400)
    assert s.persistence_mode is True
    assert s.compute_capability == (8, 0)


def test_processes_resolve_owner_and_hidden_memory() -> None:
    s = NvmlBackend(FakeNvml([make_device()])).sample(0)
    mine, ghost = s.processes
    assert mine == GpuProcess(
        pid=os.getpid(), used_memory_bytes=GIB, user=getpass.getuser(), name=mine.name
    )
    assert mine.name  # this test's own interpreter
    # A pid this namespace cannot see, with memory NVML hides.
    assert ghost == GpuProcess(pid=2**22 + 12345, used_memory_bytes=None, user=None, name=None)


def test_not_supported_readings_become_none() -> None:
    fake = FakeNvml([make_device()], unsupported=ALL_DEVICE_QUERIES)
    s = NvmlBackend(fake).sample(0)
    assert s.name == "GPU 0" and s.uuid == "GPU-0"
    assert s.memory_total_bytes is None and s.memory_free_bytes is None
    assert s.utilization_gpu_pct is None
    assert s.temperature_c is None and s.temperature_slowdown_c is None
    assert s.power_draw_w is None and s.power_limit_w is None
    assert s.sm_clock_mhz is None and s.clock_event_reasons is None
    assert s.ecc == EccCounts()
    assert s.retired_pages_pending is None
    assert s.remapped_rows == RemappedRows()
    assert s.pcie == PcieLink()
    assert s.processes == ()
    assert s.persistence_mode is None and s.compute_capability is None


def test_older_driver_falls_back_to_throttle_reasons() -> None:
    fake = FakeNvml([make_device()], unsupported={"nvmlDeviceGetCurrentClocksEventReasons"})
    assert NvmlBackend(fake).sample(0).reasons == ClockEventReason.HW_SLOWDOWN


def test_driver_versions() -> None:
    assert NvmlBackend(FakeNvml([])).driver() == DriverInfo("550.54.15", (12, 4))
    old = FakeNvml([], unsupported={"nvmlSystemGetCudaDriverVersion_v2"})
    assert NvmlBackend(old).driver() == DriverInfo("550.54.15", (12, 2))


def test_sample_all_reads_every_gpu_and_close_shuts_down_once() -> None:
    fake = FakeNvml([make_device(), make_device(uuid="GPU-second", cc=(9, 0))])
    backend = NvmlBackend(fake)
    samples = sample_all(backend)
    assert [(s.index, s.uuid, s.compute_capability) for s in samples] == [
        (0, "GPU-5f1c", (8, 0)),
        (1, "GPU-second", (9, 0)),
    ]
    backend.close()
    backend.close()
    assert fake.calls.count("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (NVMLError_LibraryNotFound(), "no NVIDIA driver: libnvidia-ml.so was not found"),
        (NVMLError_DriverNotLoaded(), "the NVIDIA kernel driver is not loaded"),
        (NVMLError_NoPermission(), "no permission to talk to the NVIDIA driver"),
        (NVMLError("Unknown Error"), "NVML failed to start: Unknown Error"),
    ],
)
def test_open_without_driver_gives_no_gpu_backend(
    monkeypatch: pytest.MonkeyPatch, error: Exception, reason: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([make_device()], init_error=error))
    backend = open_nvml()
    assert isinstance(backend, NoGpuBackend)
    assert (backend.kind, backend.absent_reason, backend.driver(), backend.device_count()) == (
        "none",
        reason,
        None,
        0,
    )


def test_open_with_driver_gives_nvml_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([make_device()]))
    backend = open_nvml()
    assert backend.kind == "nvml"
    assert backend.device_count() == 1


def test_gpu_lost_from_the_bus_is_a_sample_not_a_crash() -> None:
    class LostGpu(FakeNvml):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
            raise NVMLError("GPU is lost")

    backend = NvmlBackend(LostGpu([make_device()]))
    sample = backend.sample(0)
    assert sample.unreachable is not None and "lost" in sample.unreachable
    assert sample.memory_total_bytes is None and sample.temperature_c is None
