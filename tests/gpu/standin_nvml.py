"""A stand-in ``pynvml`` that answers as real drivers do, for machines without a GPU.

It is built on the installed nvidia-ml-py: its error classes (``NVMLError``
and the ``NVMLError_*`` subclasses, ``NVMLLibraryMismatchError`` - a plain
``Exception``) and constants are the real ones, only the functions answer from
a JSON-able state. The states reproduce what real hardware and drivers do:

* ``"lost": "GpuIsLost"`` (or ``ResetRequired``, ``Unknown``): every query of
  that GPU raises it, from the start or after ``lost_after_s`` seconds;
* ``"errors": {"nvmlDeviceGetX": "NotSupported"}``: one query fails;
* ``driver.process_query``: ``"v3"`` (default), ``"v2_only"`` (R495 and older:
  the v3 call raises ``NVMLLibraryMismatchError`` as nvidia-ml-py's version
  check does), ``"v3_garbled"`` (535.98: v3 returns impossible pids);
* ``"mig": {...}``: MIG mode on - utilization and remapped rows not
  supported, the whole GPU's process list needs privileges, each MIG
  instance answers for itself;
* ``"xids": [{"after_s": 0.5, "code": 79}]``: Xid critical-error events the
  NVML event set delivers (``nvmlEventSetWait_v2``) once that much time has
  passed since ``nvmlInit``;
* ``"fail_next": {"nvmlDeviceGetMemoryInfo": ["Unknown"]}``: the next calls of
  a query fail with these errors, one call each (``None``: that call
  answers), then it answers again (a transient driver hiccup);
* ``"pcie_counters": [tx_bytes, rx_bytes, timestamp_us]``: the PCIe byte
  counters the field-value query answers (absent: the driver answers
  "not supported" for those fields, as before R5xx);
* ``"fabric": [state, status]``: the NVLink fabric registration
  (``NVML_GPU_FABRIC_STATE_*`` and an ``nvmlReturn_t``); absent: not supported;
* ``driver.removed``: functions the bindings no longer have (CUDA 14 drops
  the "throttle" spellings).

``build(state)`` returns a module to put in ``sys.modules["pynvml"]``; the
``shim/pynvml.py`` next to this file does the same in a subprocess from the
state file named by ``TRAINMEDIC_STANDIN_NVML``.
"""

from __future__ import annotations

import copy
import time
import types
from typing import Any

import pynvml as real

GIB = 1 << 30
MIB = 1 << 20
NOT_AVAILABLE = 2**64 - 1
ERRORS: dict[str, type[Exception]] = {
    "NotSupported": real.NVMLError_NotSupported,
    "NoPermission": real.NVMLError_NoPermission,
    "GpuIsLost": real.NVMLError_GpuIsLost,
    "ResetRequired": real.NVMLError_ResetRequired,
    "Unknown": real.NVMLError_Unknown,
    "NotFound": real.NVMLError_NotFound,
    "FunctionNotFound": real.NVMLError_FunctionNotFound,
    "LibraryNotFound": real.NVMLError_LibraryNotFound,
    "DriverNotLoaded": real.NVMLError_DriverNotLoaded,
    "Timeout": real.NVMLError_Timeout,
}


def h100(**overrides: Any) -> dict[str, Any]:
    """A healthy H100 80GB at work."""
    device: dict[str, Any] = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-5f1c2d3e-0000-1111-2222-333344445555",
        "pci_bus_id": "00000000:3B:00.0",
        "memory_total": 80 * GIB,
        "memory_used": 2 * GIB,
        "utilization": [87, 41],
        "temperature": 71,
        "slowdown": 88,
        "shutdown": 93,
        "power_mw": 312_500,
        "limit_mw": 700_000,
        "sm_clock": 1275,
        "sm_clock_max": 1980,
        "reasons": 0x4,
        "throttle_reasons": 0x8,
        "ecc": [4, 1, 120, 2],  # volatile corrected/uncorrected, aggregate corrected/uncorrected
        "pending_pages": 0,
        "remapped": [3, 1, 1, 0],
        "pcie": {"gen": 5, "gen_max": 5, "gen_gpu_max": 5, "width": 16, "width_max": 16},
        "pcie_throughput": [1200, 3400],
        "processes": [],
        "persistence": 1,
        "cc": [9, 0],
    }
    device.update(overrides)
    return device


class Handle:
    """What nvmlDeviceGetHandleByIndex returns (an opaque pointer in the real library)."""

    def __init__(self, device: dict[str, Any], index: int, mig: dict[str, Any] | None = None):
        self.device = device
        self.index = index
        self.mig = mig  # the MIG instance this handle names, when it is a MIG handle


class Proc:
    def __init__(self, pid: int, used: int | None, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF):
        self.pid = pid
        # nvidia-ml-py turns NVML_VALUE_NOT_AVAILABLE into None itself.
        self.usedGpuMemory = None if used is None or used == NOT_AVAILABLE else used
        self.gpuInstanceId = gi
        self.computeInstanceId = ci


class _Value:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def build(state: dict[str, Any]) -> types.ModuleType:
    """A ``pynvml`` module answering from ``state`` ({"driver": {...}, "devices": [...]})."""
    state = copy.deepcopy(state)
    mod = types.ModuleType("pynvml")
    for name in dir(real):
        value = getattr(real, name)
        constant = name.startswith(("NVML", "nvmlClocks", "nvmlEventType")) and not callable(value)
        if constant or (isinstance(value, type) and issubclass(value, Exception)):
            setattr(mod, name, value)
    driver = state.get("driver", {})
    devices: list[dict[str, Any]] = state.get("devices", [])
    calls: list[str] = []
    mod.calls = calls  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    started = [time.monotonic()]

    def fail(kind: str) -> Exception:
        return ERRORS[kind]()

    def device_call(name: str, h: Handle) -> dict[str, Any]:
        calls.append(name)
        dev = h.device
        lost = dev.get("lost")
        if lost and time.monotonic() - started[0] >= dev.get("lost_after_s", 0.0):
            raise fail(lost)
        kind = dev.get("errors", {}).get(name)
        if kind:
            raise fail(kind)
        queued = dev.get("fail_next", {}).get(name)
        if queued:
            kind = queued.pop(0)  # None: this call answers
            if kind:
                raise fail(kind)
        return dev

    def mig_on(dev: dict[str, Any]) -> bool:
        return bool(dev.get("mig", {}).get("mode"))

    def nvmlInit() -> None:
        calls.append("nvmlInit")
        if driver.get("init_error"):
            raise fail(driver["init_error"])
        started[0] = time.monotonic()

    def nvmlShutdown() -> None:
        calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion() -> str:
        return str(driver.get("version", "550.54.15"))

    def nvmlSystemGetCudaDriverVersion_v2() -> int:
        return int(driver.get("cuda", 12040))

    def nvmlSystemGetCudaDriverVersion() -> int:
        return int(driver.get("cuda", 12040))

    def nvmlDeviceGetCount() -> int:
        return len(devices)

    def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
        calls.append("nvmlDeviceGetHandleByIndex")
        dev = devices[index]
        if dev.get("lost") and dev.get("lost_at_handle"):
            raise fail(dev["lost"])
        refused = dev.get("errors", {}).get("nvmlDeviceGetHandleByIndex")
        if refused:
            raise fail(refused)
        return Handle(dev, index)

    def simple(name: str, key: str, convert: Any = None) -> Any:
        def fn(h: Handle) -> Any:
            dev = device_call(name, h)
            value = (h.mig or {}).get(key, dev.get(key)) if h.mig else dev.get(key)
            if value is None:
                raise fail("NotSupported")
            return convert(value) if convert else value

        return fn

    mod.nvmlDeviceGetName = simple("nvmlDeviceGetName", "name")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetUUID = simple("nvmlDeviceGetUUID", "uuid")  # type: ignore[attr-defined]

    def nvmlDeviceGetPciInfo(h: Handle) -> Any:
        dev = device_call("nvmlDeviceGetPciInfo", h)
        if dev.get("pci_bus_id") is None:
            raise fail("NotSupported")
        bus = dev["pci_bus_id"].encode()  # ctypes char arrays come back as bytes
        return _Value(busId=bus, busIdLegacy=bus[4:])

    def nvmlDeviceGetMemoryInfo(h: Handle) -> Any:
        dev = device_call("nvmlDeviceGetMemoryInfo", h)
        src = h.mig if h.mig else dev
        total, used = src["memory_total"], src["memory_used"]
        return _Value(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(h: Handle) -> Any:
        dev = device_call("nvmlDeviceGetUtilizationRates", h)
        if mig_on(dev) or dev.get("utilization") is None:
            raise fail("NotSupported")  # not supported on MIG-enabled GPUs
        gpu, memory = dev["utilization"]
        return _Value(gpu=gpu, memory=memory)

    def nvmlDeviceGetTemperature(h: Handle, sensor: int) -> int:
        assert sensor == real.NVML_TEMPERATURE_GPU
        return int(device_call("nvmlDeviceGetTemperature", h)["temperature"])

    def nvmlDeviceGetTemperatureThreshold(h: Handle, kind: int) -> int:
        dev = device_call("nvmlDeviceGetTemperatureThreshold", h)
        if kind == real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return int(dev["slowdown"])
        if kind == real.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return int(dev["shutdown"])
        raise fail("NotSupported")

    mod.nvmlDeviceGetPowerUsage = simple("nvmlDeviceGetPowerUsage", "power_mw", int)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetEnforcedPowerLimit = simple(  # type: ignore[attr-defined]
        "nvmlDeviceGetEnforcedPowerLimit", "limit_mw", int
    )

    def nvmlDeviceGetClockInfo(h: Handle, clock: int) -> int:
        assert clock == real.NVML_CLOCK_SM
        return int(device_call("nvmlDeviceGetClockInfo", h)["sm_clock"])

    def nvmlDeviceGetMaxClockInfo(h: Handle, clock: int) -> int:
        assert clock == real.NVML_CLOCK_SM
        return int(device_call("nvmlDeviceGetMaxClockInfo", h)["sm_clock_max"])

    mod.nvmlDeviceGetCurrentClocksEventReasons = simple(  # type: ignore[attr-defined]
        "nvmlDeviceGetCurrentClocksEventReasons", "reasons", int
    )
    mod.nvmlDeviceGetCurrentClocksThrottleReasons = simple(  # type: ignore[attr-defined]
        "nvmlDeviceGetCurrentClocksThrottleReasons", "throttle_reasons", int
    )

    def nvmlDeviceGetTotalEccErrors(h: Handle, error_type: int, counter: int) -> int:
        dev = device_call("nvmlDeviceGetTotalEccErrors", h)
        if dev.get("ecc") is None:
            raise fail("NotSupported")
        unc = error_type == real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        agg = counter == real.NVML_AGGREGATE_ECC
        return int(dev["ecc"][2 * agg + unc])

    mod.nvmlDeviceGetRetiredPagesPendingStatus = simple(  # type: ignore[attr-defined]
        "nvmlDeviceGetRetiredPagesPendingStatus", "pending_pages", int
    )

    def nvmlDeviceGetRemappedRows(h: Handle) -> tuple[int, ...]:
        dev = device_call("nvmlDeviceGetRemappedRows", h)
        if mig_on(dev) or dev.get("remapped") is None:
            raise fail("NotSupported")  # MIG-enabled GPUs with active instances
        return tuple(dev["remapped"])

    def pcie(name: str, key: str) -> Any:
        def fn(h: Handle) -> int:
            return int(device_call(name, h)["pcie"][key])

        return fn

    mod.nvmlDeviceGetCurrPcieLinkGeneration = pcie("nvmlDeviceGetCurrPcieLinkGeneration", "gen")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMaxPcieLinkGeneration = pcie("nvmlDeviceGetMaxPcieLinkGeneration", "gen_max")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetGpuMaxPcieLinkGeneration = pcie(  # type: ignore[attr-defined]
        "nvmlDeviceGetGpuMaxPcieLinkGeneration", "gen_gpu_max"
    )
    mod.nvmlDeviceGetCurrPcieLinkWidth = pcie("nvmlDeviceGetCurrPcieLinkWidth", "width")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMaxPcieLinkWidth = pcie("nvmlDeviceGetMaxPcieLinkWidth", "width_max")  # type: ignore[attr-defined]

    def nvmlDeviceGetPcieThroughput(h: Handle, counter: int) -> int:
        dev = device_call("nvmlDeviceGetPcieThroughput", h)
        return int(dev["pcie_throughput"][counter == real.NVML_PCIE_UTIL_RX_BYTES])

    def nvmlDeviceGetFieldValues(h: Handle, field_ids: list[int]) -> list[Any]:
        dev = device_call("nvmlDeviceGetFieldValues", h)
        counters = dev.get("pcie_counters")
        out = []
        for field_id in field_ids:
            if counters is None or field_id not in (
                real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
            ):
                # The call succeeds; each field it cannot read says so itself.
                out.append(_Value(fieldId=field_id, nvmlReturn=real.NVML_ERROR_NOT_SUPPORTED))
                continue
            rx = field_id == real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
            out.append(
                _Value(
                    fieldId=field_id,
                    nvmlReturn=real.NVML_SUCCESS,
                    timestamp=counters[2],
                    value=_Value(ullVal=counters[1] if rx else counters[0]),
                )
            )
        return out

    def fabric_info(name: str) -> Any:
        def fn(h: Handle, info_ref: Any) -> int:
            dev = device_call(name, h)
            if dev.get("fabric") is None:
                raise fail("NotSupported")
            info = info_ref._obj  # NVML fills the structure behind the pointer
            info.state, info.status = dev["fabric"]
            return real.NVML_SUCCESS

        return fn

    mod.nvmlDeviceGetGpuFabricInfoV = fabric_info("nvmlDeviceGetGpuFabricInfoV")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetGpuFabricInfo = fabric_info("nvmlDeviceGetGpuFabricInfo")  # type: ignore[attr-defined]
    for struct in ("c_nvmlGpuFabricInfoV_t", "c_nvmlGpuFabricInfo_t"):
        setattr(mod, struct, getattr(real, struct))

    def process_list(h: Handle, garbled: bool) -> list[Proc]:
        dev = h.device
        if h.mig is not None:
            raw = h.mig.get("processes", [])
            gi, ci = h.mig.get("gi", 0), h.mig.get("ci", 0)
            return [Proc(p[0], p[1], gi, ci) for p in raw]
        if mig_on(dev) and not dev["mig"].get("privileged"):
            raise fail("NoPermission")  # aggregate information needs privileges
        raw = list(dev.get("processes", []))
        if mig_on(dev):
            raw = [p for m in dev["mig"].get("devices", []) for p in m.get("processes", [])]
        if garbled:
            # v2-sized structures read as v3: pids and sizes shift into each other.
            return [Proc((p[0] << 32) | 0x1F, p[1]) for p in raw]
        return [Proc(p[0], p[1]) for p in raw]

    def nvmlDeviceGetComputeRunningProcesses(h: Handle) -> list[Proc]:
        # nvidia-ml-py wraps this call: FunctionNotFound becomes NVMLLibraryMismatchError.
        query = driver.get("process_query", "v3")
        if query == "v2_only":
            calls.append("nvmlDeviceGetComputeRunningProcesses")
            raise real.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML "
                "lib version. Either use matching pyNVML and NVML lib versions or use a "
                "versioned function such as nvmlDeviceGetComputeRunningProcesses_v2"
            )
        device_call("nvmlDeviceGetComputeRunningProcesses", h)
        return process_list(h, garbled=query == "v3_garbled")

    def nvmlDeviceGetComputeRunningProcesses_v2(h: Handle) -> list[Proc]:
        device_call("nvmlDeviceGetComputeRunningProcesses_v2", h)
        return process_list(h, garbled=False)

    def nvmlDeviceGetPersistenceMode(h: Handle) -> int:
        return int(device_call("nvmlDeviceGetPersistenceMode", h)["persistence"])

    def nvmlDeviceGetCudaComputeCapability(h: Handle) -> tuple[int, int]:
        cc = device_call("nvmlDeviceGetCudaComputeCapability", h)["cc"]
        return (int(cc[0]), int(cc[1]))

    def nvmlDeviceGetMigMode(h: Handle) -> list[int]:
        dev = device_call("nvmlDeviceGetMigMode", h)
        if "mig" not in dev:
            raise fail("NotSupported")  # GPUs without MIG
        mode = int(dev["mig"].get("mode", 0))
        return [mode, int(dev["mig"].get("pending", mode))]

    def nvmlDeviceGetMaxMigDeviceCount(h: Handle) -> int:
        dev = device_call("nvmlDeviceGetMaxMigDeviceCount", h)
        if "mig" not in dev:
            raise fail("NotSupported")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(h: Handle, index: int) -> Handle:
        dev = device_call("nvmlDeviceGetMigDeviceHandleByIndex", h)
        found = dev.get("mig", {}).get("devices", [])
        if index >= len(found):
            raise fail("NotFound")  # an empty slot
        return Handle(dev, h.index, found[index])

    def mig_field(name: str, key: str) -> Any:
        def fn(h: Handle) -> int:
            device_call(name, h)
            if h.mig is None:
                raise fail("NotSupported")  # not a MIG device handle
            return int(h.mig[key])

        return fn

    mod.nvmlDeviceGetGpuInstanceId = mig_field("nvmlDeviceGetGpuInstanceId", "gi")  # type: ignore[attr-defined]
    mod.nvmlDeviceGetComputeInstanceId = mig_field("nvmlDeviceGetComputeInstanceId", "ci")  # type: ignore[attr-defined]

    class EventSet:
        def __init__(self) -> None:
            self.handles: list[Handle] = []
            self.delivered: set[tuple[int, int]] = set()

    def nvmlEventSetCreate() -> EventSet:
        calls.append("nvmlEventSetCreate")
        return EventSet()

    def nvmlDeviceRegisterEvents(h: Handle, types: int, event_set: EventSet) -> None:
        device_call("nvmlDeviceRegisterEvents", h)
        assert types & real.nvmlEventTypeXidCriticalError
        event_set.handles.append(h)

    def nvmlEventSetWait_v2(event_set: EventSet, timeoutms: int) -> Any:
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            elapsed = time.monotonic() - started[0]
            for h in event_set.handles:
                for k, xid in enumerate(h.device.get("xids", [])):
                    key = (h.index, k)
                    if key not in event_set.delivered and elapsed >= xid.get("after_s", 0.0):
                        event_set.delivered.add(key)
                        return _Value(
                            device=h,
                            eventType=real.nvmlEventTypeXidCriticalError,
                            eventData=xid["code"],
                            gpuInstanceId=xid.get("gi", 0xFFFFFFFF),
                            computeInstanceId=0xFFFFFFFF,
                        )
            if time.monotonic() >= deadline:
                raise fail("Timeout")
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def nvmlEventSetFree(event_set: EventSet) -> None:
        calls.append("nvmlEventSetFree")

    def nvmlDeviceGetIndex(h: Handle) -> int:
        return h.index

    for name, fn in list(locals().items()):
        if name.startswith("nvml") and callable(fn):
            setattr(mod, name, fn)
    for name in driver.get("removed", []):
        delattr(mod, name)
    return mod


def state(*devices: dict[str, Any], **driver: Any) -> dict[str, Any]:
    return {"driver": driver, "devices": list(devices)}
