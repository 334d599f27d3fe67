"""GPU readings from NVML through nvidia-ml-py, the official bindings.

The one module that imports ``pynvml`` (the module nvidia-ml-py installs).
Every query goes through :func:`_query`, which turns "not supported", "no
permission" and similar answers into ``None`` so a reading a GPU lacks is
data, not an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainmedic.gpu.backend import GpuBackend, NoGpuBackend
from trainmedic.gpu.types import (
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuSample,
    PcieLink,
    RemappedRows,
)

T = TypeVar("T")

_init_lock = threading.Lock()


def open_nvml() -> GpuBackend:
    """An NVML backend, or a :class:`NoGpuBackend` saying why there is none."""
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        return NoGpuBackend("nvidia-ml-py is not installed")
    with _init_lock:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return NoGpuBackend(_describe_init_error(pynvml, exc))
        except OSError as exc:  # pragma: no cover - broken library install
            return NoGpuBackend(f"NVML library could not be loaded: {exc}")
    return NvmlBackend(pynvml)


def _describe_init_error(pynvml: Any, exc: Exception) -> str:
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return "no NVIDIA driver: libnvidia-ml.so was not found"
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return "the NVIDIA kernel driver is not loaded"
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return "no permission to talk to the NVIDIA driver"
    return f"NVML failed to start: {exc}"


class NvmlBackend:
    """Live readings of the GPUs this machine's driver exposes."""

    def __init__(self, pynvml: Any) -> None:
        self._nvml = pynvml
        self._handles: dict[int, Any] = {}
        self._closed = False

    @property
    def kind(self) -> str:
        return "nvml"

    @property
    def absent_reason(self) -> str | None:
        return None

    def _query(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            # NotSupported, NoPermission, Unknown, GpuIsLost...: all mean
            # "no value" for a reading; the caller shows it as unsupported.
            return None

    def driver(self) -> DriverInfo | None:
        n = self._nvml
        version = self._query(n.nvmlSystemGetDriverVersion)
        cuda = self._query(n.nvmlSystemGetCudaDriverVersion_v2) or self._query(
            n.nvmlSystemGetCudaDriverVersion
        )
        cuda_version = (int(cuda) // 1000, (int(cuda) % 1000) // 10) if cuda else None
        return DriverInfo(version=_text(version), cuda_version=cuda_version)

    def device_count(self) -> int:
        return int(self._query(self._nvml.nvmlDeviceGetCount) or 0)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def sample(self, index: int) -> GpuSample:
        n = self._nvml
        q = self._query
        try:
            h = self._handle(index)
        except self._nvml.NVMLError as exc:
            # A GPU that fell off the bus still has an index; report it, don't crash.
            return GpuSample(
                timestamp=time.time(),
                index=index,
                name=f"GPU {index}",
                uuid=f"GPU-{index}",
                unreachable=str(exc) or type(exc).__name__,
            )
        mem = q(n.nvmlDeviceGetMemoryInfo, h)
        util = q(n.nvmlDeviceGetUtilizationRates, h)
        power_mw = q(n.nvmlDeviceGetPowerUsage, h)
        limit_mw = q(n.nvmlDeviceGetEnforcedPowerLimit, h)
        # Older nvidia-ml-py releases only have the "throttle" spelling.
        reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = q(reasons_fn, h) if reasons_fn is not None else None
        if reasons is None:
            reasons = q(n.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        remapped = q(n.nvmlDeviceGetRemappedRows, h)
        pending_pages = q(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        cc = q(n.nvmlDeviceGetCudaComputeCapability, h)
        persistence = q(n.nvmlDeviceGetPersistenceMode, h)
        return GpuSample(
            timestamp=time.time(),
            index=index,
            name=_text(q(n.nvmlDeviceGetName, h)) or f"GPU {index}",
            uuid=_text(q(n.nvmlDeviceGetUUID, h)) or f"GPU-{index}",
            memory_total_bytes=None if mem is None else int(mem.total),
            memory_used_bytes=None if mem is None else int(mem.used),
            utilization_gpu_pct=None if util is None else float(util.gpu),
            utilization_memory_pct=None if util is None else float(util.memory),
            temperature_c=_float(q(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)),
            temperature_slowdown_c=_float(
                q(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            ),
            temperature_shutdown_c=_float(
                q(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
            ),
            power_draw_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            sm_clock_mhz=_float(q(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)),
            sm_clock_max_mhz=_float(q(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM)),
            clock_event_reasons=None if reasons is None else int(reasons),
            ecc=self._ecc(h),
            retired_pages_pending=None if pending_pages is None else bool(pending_pages),
            remapped_rows=_remapped(remapped),
            pcie=self._pcie(h),
            processes=self._processes(h),
            persistence_mode=None if persistence is None else bool(persistence),
            compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
        )

    def _ecc(self, h: Any) -> EccCounts:
        n = self._nvml
        q = self._query
        unc, cor = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        return EccCounts(
            volatile_corrected=q(n.nvmlDeviceGetTotalEccErrors, h, cor, vol),
            volatile_uncorrected=q(n.nvmlDeviceGetTotalEccErrors, h, unc, vol),
            aggregate_corrected=q(n.nvmlDeviceGetTotalEccErrors, h, cor, agg),
            aggregate_uncorrected=q(n.nvmlDeviceGetTotalEccErrors, h, unc, agg),
        )

    def _pcie(self, h: Any) -> PcieLink:
        n = self._nvml
        q = self._query
        return PcieLink(
            gen_current=q(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
            gen_max=q(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
            gen_gpu_max=q(n.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
            width_current=q(n.nvmlDeviceGetCurrPcieLinkWidth, h),
            width_max=q(n.nvmlDeviceGetMaxPcieLinkWidth, h),
            tx_kib_per_s=q(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES),
            rx_kib_per_s=q(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES),
        )

    def _processes(self, h: Any) -> tuple[GpuProcess, ...]:
        procs = self._query(self._nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            user, name = _owner(int(p.pid))
            out.append(
                GpuProcess(
                    pid=int(p.pid),
                    # NVML reports hidden usage as NVML_VALUE_NOT_AVAILABLE (2**64-1).
                    used_memory_bytes=None if used is None or used >= 2**63 else int(used),
                    user=user,
                    name=name,
                )
            )
        return tuple(out)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._query(self._nvml.nvmlShutdown)


def _owner(pid: int) -> tuple[str | None, str | None]:
    """User and executable name of ``pid`` when visible from here."""
    import psutil

    try:
        p = psutil.Process(pid)
        return p.username(), p.name()
    except (psutil.Error, OSError):
        return None, None


def _remapped(value: Any) -> RemappedRows:
    if value is None:
        return RemappedRows()
    cor, unc, pending, failure = value
    return RemappedRows(int(cor), int(unc), bool(pending), bool(failure))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
