"""GPU readings from NVML through nvidia-ml-py, the official bindings.

The one module that imports ``pynvml`` (the module nvidia-ml-py installs).
Every query goes through :meth:`NvmlBackend._query`, which turns "not
supported", "no permission" and similar answers into ``None`` so a reading a
GPU lacks is data, not an error. How real drivers answer, and what follows:

* ``GpuIsLost``, ``ResetRequired`` or ``Unknown`` from any query of a GPU: the
  GPU cannot be reached (fallen off the bus, needs a reset). The reading says
  so in ``unreachable``, keeps only identities read earlier (never made-up
  ones: a UUID may end up in ``CUDA_VISIBLE_DEVICES``), and the cached handle
  is dropped so a recovered GPU is found again.
* ``NVMLLibraryMismatchError`` (a plain ``Exception``, not an ``NVMLError``)
  from the v3 process query on drivers without it (R495 and older): the v2
  query is used from then on. So is it when the v3 query answers with
  impossible pids (the 535.98 driver's v3 structure mismatch).
* MIG mode (``nvmlDeviceGetMigMode``): utilization and row remapping are not
  supported, and the whole GPU's process list needs privileges; the MIG
  instances are read one by one and their processes joined. When no list can
  be read, ``processes_unreadable`` says why: *unknown*, never *none*.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainmedic.gpu.backend import GpuBackend, NoGpuBackend, XidNotice, XidWatch
from trainmedic.gpu.types import (
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuSample,
    MigDevice,
    PcieLink,
    RemappedRows,
    normalize_pci_bus_id,
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


class _GpuLost(Exception):
    """A query said the GPU cannot be reached; carries NVML's words."""


#: NVML errors meaning the GPU itself is gone or wedged, not a missing feature.
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_Unknown")
#: Linux pids never exceed 2**22 (pid_max's ceiling): a larger one is a garbled structure.
_PID_MAX = 1 << 22


class NvmlBackend:
    """Live readings of the GPUs this machine's driver exposes."""

    def __init__(self, pynvml: Any) -> None:
        self._nvml = pynvml
        self._handles: dict[int, Any] = {}
        # name, uuid and PCI bus id of each GPU as last read, for a GPU that is lost later.
        self._identity: dict[int, tuple[str | None, str | None, str | None]] = {}
        self._closed = False
        self._lost = tuple(c for n in _LOST_ERRORS if (c := getattr(pynvml, n, None)) is not None)
        mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()
        self._process_v2 = False  # the v3 process query is missing or broken here

    @property
    def kind(self) -> str:
        return "nvml"

    @property
    def absent_reason(self) -> str | None:
        return None

    def _query(self, fn: Callable[..., T] | None, *args: Any) -> T | None:
        """``fn(*args)``, or ``None`` for a reading this GPU or driver lacks.

        Raises :class:`_GpuLost` when the answer says the GPU is unreachable.
        """
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if self._lost and isinstance(exc, self._lost):
                raise _GpuLost(_describe(exc)) from None
            return None  # NotSupported, NoPermission, NotFound...: no value
        except self._mismatch:
            return None  # the bindings call a function this driver's NVML lacks

    def _system(self, fn: Callable[..., T] | None, *args: Any) -> T | None:
        """A query about the driver, not a GPU: every failure is "no value"."""
        try:
            return self._query(fn, *args)
        except _GpuLost:
            return None

    def driver(self) -> DriverInfo | None:
        n = self._nvml
        version = self._system(n.nvmlSystemGetDriverVersion)
        cuda = self._system(n.nvmlSystemGetCudaDriverVersion_v2) or self._system(
            n.nvmlSystemGetCudaDriverVersion
        )
        cuda_version = (int(cuda) // 1000, (int(cuda) % 1000) // 10) if cuda else None
        return DriverInfo(version=_text(version), cuda_version=cuda_version)

    def device_count(self) -> int:
        return int(self._system(self._nvml.nvmlDeviceGetCount) or 0)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            try:
                self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
            except self._nvml.NVMLError as exc:
                # A GPU that fell off the bus still has an index: report it, don't crash.
                raise _GpuLost(_describe(exc)) from None
        return self._handles[index]

    def sample(self, index: int) -> GpuSample:
        try:
            return self._read(index)
        except _GpuLost as lost:
            # The handle of a lost GPU is stale; a reset GPU gets a new one.
            self._handles.pop(index, None)
            name, uuid, pci = self._identity.get(index, (None, None, None))
            return GpuSample(
                timestamp=time.time(),
                index=index,
                name=name or f"GPU {index}",
                uuid=uuid,
                pci_bus_id=pci,
                unreachable=str(lost),
            )

    def _read(self, index: int) -> GpuSample:
        n = self._nvml
        q = self._query
        h = self._handle(index)
        name = _text(q(n.nvmlDeviceGetName, h))
        uuid = _text(q(n.nvmlDeviceGetUUID, h))
        pci = self._pci_bus_id(h)
        known = self._identity.get(index, (None, None, None))
        self._identity[index] = (name or known[0], uuid or known[1], pci or known[2])
        mem = q(n.nvmlDeviceGetMemoryInfo, h)
        util = q(n.nvmlDeviceGetUtilizationRates, h)
        power_mw = q(n.nvmlDeviceGetPowerUsage, h)
        limit_mw = q(n.nvmlDeviceGetEnforcedPowerLimit, h)
        # Older nvidia-ml-py releases only have the "throttle" spelling.
        reasons = q(getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None), h)
        if reasons is None:
            reasons = q(n.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        remapped = q(n.nvmlDeviceGetRemappedRows, h)
        pending_pages = q(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        cc = q(n.nvmlDeviceGetCudaComputeCapability, h)
        persistence = q(n.nvmlDeviceGetPersistenceMode, h)
        mig_mode = self._mig_mode(h)
        mig_handles = self._mig_handles(h) if mig_mode else []
        processes, unreadable = self._processes(h, mig_mode, mig_handles)
        return GpuSample(
            timestamp=time.time(),
            index=index,
            name=name or f"GPU {index}",
            uuid=uuid,
            pci_bus_id=pci,
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
            processes=processes,
            processes_unreadable=unreadable,
            persistence_mode=None if persistence is None else bool(persistence),
            compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
            mig_mode=mig_mode,
            mig_devices=tuple(self._mig_device(mh) for mh in mig_handles),
        )

    def _pci_bus_id(self, h: Any) -> str | None:
        info = self._query(self._nvml.nvmlDeviceGetPciInfo, h)
        bus = _text(getattr(info, "busId", None)) if info is not None else None
        return normalize_pci_bus_id(bus) if bus else None

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

    # --- MIG -------------------------------------------------------------------------------

    def _mig_mode(self, h: Any) -> bool | None:
        """Current MIG mode; ``None`` on GPUs without MIG or drivers that cannot tell."""
        mode = self._query(getattr(self._nvml, "nvmlDeviceGetMigMode", None), h)
        if mode is None:
            return None
        current = mode[0] if isinstance(mode, (list, tuple)) else mode
        return int(current) == int(getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _mig_handles(self, h: Any) -> list[Any]:
        n = self._nvml
        count = self._query(getattr(n, "nvmlDeviceGetMaxMigDeviceCount", None), h) or 0
        get = getattr(n, "nvmlDeviceGetMigDeviceHandleByIndex", None)
        # Empty slots answer NotFound: skipped.
        found = (self._query(get, h, i) for i in range(int(count)))
        return [mh for mh in found if mh is not None]

    def _mig_device(self, mh: Any) -> MigDevice:
        n = self._nvml
        q = self._query
        mem = q(n.nvmlDeviceGetMemoryInfo, mh)
        gi = q(getattr(n, "nvmlDeviceGetGpuInstanceId", None), mh)
        ci = q(getattr(n, "nvmlDeviceGetComputeInstanceId", None), mh)
        return MigDevice(
            uuid=_text(q(n.nvmlDeviceGetUUID, mh)),
            gpu_instance_id=None if gi is None else int(gi),
            compute_instance_id=None if ci is None else int(ci),
            memory_total_bytes=None if mem is None else int(mem.total),
            memory_used_bytes=None if mem is None else int(mem.used),
        )

    # --- processes -------------------------------------------------------------------------

    def _processes(
        self, h: Any, mig_mode: bool | None, mig_handles: list[Any]
    ) -> tuple[tuple[GpuProcess, ...], str | None]:
        """The GPU's compute processes, or ``((), why)`` when they cannot be read."""
        raw, why = self._process_list(h)
        if raw is None and mig_mode:
            # The whole GPU's list needs privileges in MIG mode; each instance's does not.
            if not mig_handles:
                return (), f"MIG mode: {why}; no MIG instance could be read"
            merged: dict[int, Any] = {}
            for mh in mig_handles:
                part, part_why = self._process_list(mh)
                if part is None:
                    return (), f"MIG mode: {part_why} for a MIG instance"
                merged.update((int(p.pid), p) for p in part)
            raw = list(merged.values())
        if raw is None:
            return (), why
        out = []
        for p in raw:
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
        return tuple(out), None

    def _process_list(self, h: Any) -> tuple[list[Any] | None, str]:
        """NVML's process list of ``h`` (a GPU or MIG handle), or ``(None, why)``."""
        n = self._nvml
        v2 = getattr(n, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        if not self._process_v2:
            try:
                procs = n.nvmlDeviceGetComputeRunningProcesses(h)
            except self._mismatch:
                self._process_v2 = True  # R495-era driver: no v3 query
            except n.NVMLError as exc:
                if self._lost and isinstance(exc, self._lost):
                    raise _GpuLost(_describe(exc)) from None
                if type(exc).__name__ != "NVMLError_FunctionNotFound":
                    return None, f"the process list cannot be read ({_describe(exc)})"
                self._process_v2 = True
            else:
                if v2 is None or all(0 < int(p.pid) <= _PID_MAX for p in procs):
                    return list(procs), ""
                self._process_v2 = True  # impossible pids: the driver fills v2 structures
        if v2 is None:
            return None, "the process list cannot be read (no process query in this NVML)"
        try:
            return list(v2(h)), ""
        except n.NVMLError as exc:
            if self._lost and isinstance(exc, self._lost):
                raise _GpuLost(_describe(exc)) from None
            return None, f"the process list cannot be read ({_describe(exc)})"

    def xid_watch(self) -> XidWatch | None:
        """NVML's Xid events of every GPU (needs no root, unlike the kernel log)."""
        n = self._nvml
        kind = getattr(n, "nvmlEventTypeXidCriticalError", None)
        create = getattr(n, "nvmlEventSetCreate", None)
        if kind is None or create is None or not hasattr(n, "nvmlEventSetWait_v2"):
            return None
        event_set = self._system(create)
        if event_set is None:
            return None
        registered = 0
        for index in range(self.device_count()):
            try:
                h = self._handle(index)
                n.nvmlDeviceRegisterEvents(h, kind, event_set)
                registered += 1
            except (_GpuLost, n.NVMLError):
                continue  # NotSupported on this GPU, or lost: the others are watched
        if not registered:
            self._system(getattr(n, "nvmlEventSetFree", None), event_set)
            return None
        return _NvmlXidWatch(n, event_set)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._system(self._nvml.nvmlShutdown)


class _NvmlXidWatch:
    """Waits on an NVML event set registered for Xid critical errors."""

    def __init__(self, nvml: Any, event_set: Any) -> None:
        self._nvml = nvml
        self._set = event_set

    def wait(self, timeout_s: float) -> list[XidNotice]:
        n = self._nvml
        out: list[XidNotice] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._set, timeout_ms)
            except n.NVMLError:
                return out  # Timeout: nothing more now (or the set broke)
            index: int | None
            try:
                index = int(n.nvmlDeviceGetIndex(data.device))
            except (n.NVMLError, AttributeError, TypeError):
                index = None
            instance = getattr(data, "gpuInstanceId", None)
            out.append(
                XidNotice(
                    code=int(data.eventData),
                    gpu_index=index,
                    # 0xFFFFFFFF: not a MIG instance.
                    gpu_instance=None if instance in (None, 0xFFFFFFFF) else int(instance),
                )
            )
            timeout_ms = 0  # drain what is queued, then return

    def close(self) -> None:
        free = getattr(self._nvml, "nvmlEventSetFree", None)
        if free is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                free(self._set)


def _describe(exc: BaseException) -> str:
    """NVML's words for an error, with its class: ``"GPU is lost (GpuIsLost)"``."""
    kind = type(exc).__name__.removeprefix("NVMLError_")
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{text} ({kind})" if text and text != kind else kind


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
