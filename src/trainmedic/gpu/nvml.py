"""GPU readings from NVML through nvidia-ml-py, the official bindings.

The one module that imports ``pynvml`` (the module nvidia-ml-py installs).
How real drivers answer, and what follows:

* **Optional readings** (utilization, ECC, PCIe, clocks, processes, ...) go
  through :meth:`NvmlBackend._query`: any NVML error gives ``None``. "Not
  supported" is just that; any other answer (``Unknown`` - common inside
  containers - ``NoPermission``, even ``GpuIsLost``) is also named in the
  reading's ``unavailable``. One optional query never decides that a GPU is
  lost.
* **A lost GPU** is one whose *core* queries (PCI info, memory info), or
  whose handle, answer ``GpuIsLost``, ``ResetRequired`` or ``Unknown`` twice
  in a row (:meth:`NvmlBackend._core`); an optional query that answers so
  makes the reading ask a core query once more at its end. The reading says
  so in ``unreachable``, keeps only identities read earlier (never made-up
  ones: a UUID may end up in ``CUDA_VISIBLE_DEVICES``), and the cached handle
  is dropped so a recovered GPU is found again. A handle refused for another
  reason (``NoPermission``: a GPU this container may not use) is a reading
  with nothing in it and the refusal in ``unavailable``, not a lost GPU.
* ``NVMLLibraryMismatchError`` (a plain ``Exception``, not an ``NVMLError``)
  from the v3 process query on drivers without it (R495 and older): the v2
  query is used from then on. So is it when the v3 query answers with
  impossible pids (the 535.98 driver's v3 structure mismatch).
* Functions the bindings or the driver lack (the "throttle" spelling of the
  clock reasons goes away with CUDA 14) are looked up with ``getattr`` and
  read as "not supported".
* **PCIe traffic** comes from the byte counters
  (``NVML_FI_DEV_PCIE_COUNT_TX_BYTES``/``RX_BYTES``, one field-value call):
  the rate over the time between two readings. Where the driver lacks them,
  ``nvmlDeviceGetPcieThroughput`` is asked at most every
  :data:`PCIE_THROUGHPUT_PERIOD_S`: each call blocks ~20 ms in the driver.
* MIG mode (``nvmlDeviceGetMigMode``): utilization and row remapping are not
  supported, and the whole GPU's process list needs privileges; the MIG
  instances are read one by one and their processes joined. When no list can
  be read, ``processes_unreadable`` says why: *unknown*, never *none*.
* **Shutdown** waits for the calls in flight (a sampler thread whose join
  timed out may still be inside NVML): ``nvmlShutdown`` under a running call
  frees what that call uses. When they do not end in time, NVML is left to
  the process's exit.

Why one module of this length: it is the only importer of NVML, so every driver quirk
above lives behind one seam (:class:`~trainmedic.gpu.backend.GpuBackend`); split, the
quirks would leak into callers.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import replace
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
    """The GPU cannot be reached (core queries failed twice); carries NVML's words."""


class _Refused(Exception):
    """The driver gave no handle for a GPU it lists, for another reason than a lost GPU."""


#: NVML errors that may mean the GPU itself is gone or wedged, not a missing
#: feature; only the core queries' answers decide (``Unknown`` alone is also
#: the common answer of optional queries inside containers).
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_ResetRequired", "NVMLError_Unknown")
#: Answers that mean "this GPU or driver lacks the reading": not worth a note.
_ABSENT_ERRORS = ("NVMLError_NotSupported", "NVMLError_NotFound", "NVMLError_FunctionNotFound")
#: Linux pids never exceed 2**22 (pid_max's ceiling): a larger one is a garbled structure.
_PID_MAX = 1 << 22
PCIE_THROUGHPUT_PERIOD_S = 10.0
"""Seconds between PCIe throughput queries of one GPU where the byte counters are
missing: each call blocks ~20 ms in the driver, twice a reading."""
CLOSE_WAIT_S = 2.0
"""Seconds :meth:`NvmlBackend.close` waits for calls in flight before it leaves
NVML running rather than shut it down under them."""
_NVML_SUCCESS = 0
_FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}  # 0: not supported


class _Calls:
    """Counts the threads inside NVML, so that shutdown never runs under one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self.closed = False

    @contextlib.contextmanager
    def inside(self) -> Any:
        with self._cond:
            if self.closed:
                raise RuntimeError("NVML was shut down")
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                if not self._busy:
                    self._cond.notify_all()

    def close(self, wait_s: float) -> bool:
        """Refuse new calls; whether the calls in flight ended within ``wait_s``."""
        with self._cond:
            self.closed = True
            return self._cond.wait_for(lambda: self._busy == 0, timeout=wait_s)


class _Reading:
    """What one reading of one GPU collected besides the values: refusals, suspicion."""

    def __init__(self) -> None:
        self.refused: dict[str, str] = {}  # reading -> NVML's words
        self.suspect = False  # an optional query answered as a lost GPU would


class NvmlBackend:
    """Live readings of the GPUs this machine's driver exposes.

    Args:
        pynvml: the bindings module (a stand-in in tests).
        monotonic: the clock of the PCIe throughput fallback's period (seconds).
        close_wait_s: see :data:`CLOSE_WAIT_S`.
    """

    def __init__(
        self,
        pynvml: Any,
        monotonic: Callable[[], float] = time.monotonic,
        close_wait_s: float = CLOSE_WAIT_S,
    ) -> None:
        self._nvml = pynvml
        self._monotonic = monotonic
        self._close_wait_s = close_wait_s
        self._handles: dict[int, Any] = {}
        # name, uuid and PCI bus id of each GPU as last read, for a GPU that is lost later.
        self._identity: dict[int, tuple[str | None, str | None, str | None]] = {}
        self._calls = _Calls()
        self._closed = False
        self._lost = tuple(c for n in _LOST_ERRORS if (c := getattr(pynvml, n, None)) is not None)
        self._absent = tuple(
            c for n in _ABSENT_ERRORS if (c := getattr(pynvml, n, None)) is not None
        )
        mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()
        self._process_v2 = False  # the v3 process query is missing or broken here
        # PCIe byte counters as last read: index -> (tx bytes, rx bytes, seconds).
        self._pcie_counts: dict[int, tuple[int, int, float]] = {}
        self._pcie_counters_missing: set[int] = set()
        self._throughput_at: dict[int, float] = {}  # index -> when it was last asked
        self._reading = _Reading()

    @property
    def kind(self) -> str:
        return "nvml"

    @property
    def absent_reason(self) -> str | None:
        return None

    def _query(self, fn: Callable[..., T] | None, *args: Any, what: str = "") -> T | None:
        """``fn(*args)``, or ``None`` for a reading this GPU or driver cannot give.

        Never raises for an NVML error: a refusal other than "not supported" is
        named in the reading's ``unavailable`` (as ``what``, else the function's
        name), and one that a lost GPU would give makes the reading check a core
        query again before it ends.
        """
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if not isinstance(exc, self._absent):
                self._reading.refused.setdefault(what or _short(fn), _kind(exc))
                if self._lost and isinstance(exc, self._lost):
                    self._reading.suspect = True
            return None
        except self._mismatch:
            return None  # the bindings call a function this driver's NVML lacks

    def _core(self, fn: Callable[..., T], h: Any, what: str) -> T | None:
        """A query every reachable GPU answers: a lost GPU's answer, twice, raises
        :class:`_GpuLost`; any other refusal is "no value", as in :meth:`_query`."""
        for attempt in range(2):
            try:
                return fn(h)
            except self._nvml.NVMLError as exc:
                if not (self._lost and isinstance(exc, self._lost)):
                    if not isinstance(exc, self._absent):
                        self._reading.refused.setdefault(what, _kind(exc))
                    return None
                if attempt:
                    raise _GpuLost(_describe(exc)) from None
        return None  # pragma: no cover - the loop returns or raises

    def _system(self, fn: Callable[..., T] | None, *args: Any) -> T | None:
        """A query about the driver, not a GPU: every failure is "no value"."""
        if fn is None:
            return None
        try:
            with self._calls.inside():
                return fn(*args)
        except (self._nvml.NVMLError, RuntimeError, *self._mismatch):
            return None

    def driver(self) -> DriverInfo | None:
        n = self._nvml
        version = self._system(n.nvmlSystemGetDriverVersion)
        cuda = self._system(getattr(n, "nvmlSystemGetCudaDriverVersion_v2", None)) or self._system(
            getattr(n, "nvmlSystemGetCudaDriverVersion", None)
        )
        cuda_version = (int(cuda) // 1000, (int(cuda) % 1000) // 10) if cuda else None
        return DriverInfo(version=_text(version), cuda_version=cuda_version)

    def device_count(self) -> int:
        return int(self._system(self._nvml.nvmlDeviceGetCount) or 0)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            for attempt in range(2):
                try:
                    self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
                    break
                except self._nvml.NVMLError as exc:
                    # A GPU that fell off the bus still has an index: report it, don't crash.
                    if not (self._lost and isinstance(exc, self._lost)):
                        raise _Refused(_describe(exc)) from None
                    if attempt:
                        raise _GpuLost(_describe(exc)) from None
        return self._handles[index]

    def sample(self, index: int) -> GpuSample:
        with self._calls.inside():
            self._reading = _Reading()
            try:
                return self._read(index)
            except _GpuLost as lost:
                # The handle of a lost GPU is stale; a reset GPU gets a new one.
                self._handles.pop(index, None)
                self._pcie_counts.pop(index, None)
                return self._identity_only(index, unreachable=str(lost))
            except _Refused as refused:
                why = f"every reading: the driver gives no handle ({refused})"
                return self._identity_only(index, unavailable=why)

    def _identity_only(
        self, index: int, unreachable: str | None = None, unavailable: str | None = None
    ) -> GpuSample:
        """A reading with nothing read: only the identities read earlier, never made up."""
        name, uuid, pci = self._identity.get(index, (None, None, None))
        return GpuSample(
            timestamp=time.time(),
            index=index,
            name=name or f"GPU {index}",
            uuid=uuid,
            pci_bus_id=pci,
            unreachable=unreachable,
            unavailable=unavailable,
        )

    def _read(self, index: int) -> GpuSample:
        n = self._nvml
        q = self._query
        h = self._handle(index)
        # The core queries first: a lost GPU is known after two of them.
        pci = self._pci_bus_id(h)
        mem = self._core(n.nvmlDeviceGetMemoryInfo, h, "memory")
        name = _text(q(n.nvmlDeviceGetName, h, what="name"))
        uuid = _text(q(n.nvmlDeviceGetUUID, h, what="UUID"))
        known = self._identity.get(index, (None, None, None))
        self._identity[index] = (name or known[0], uuid or known[1], pci or known[2])
        util = q(n.nvmlDeviceGetUtilizationRates, h, what="utilization")
        power_mw = q(n.nvmlDeviceGetPowerUsage, h, what="power draw")
        limit_mw = q(n.nvmlDeviceGetEnforcedPowerLimit, h, what="power limit")
        reasons = self._clock_event_reasons(h)
        remapped = q(n.nvmlDeviceGetRemappedRows, h, what="remapped rows")
        pending_pages = q(n.nvmlDeviceGetRetiredPagesPendingStatus, h, what="retired pages")
        cc = q(n.nvmlDeviceGetCudaComputeCapability, h, what="compute capability")
        persistence = q(n.nvmlDeviceGetPersistenceMode, h, what="persistence mode")
        mig_mode = self._mig_mode(h)
        mig_handles = self._mig_handles(h) if mig_mode else []
        processes, unreadable = self._processes(h, mig_mode, mig_handles)
        sample = GpuSample(
            timestamp=time.time(),
            index=index,
            name=name or f"GPU {index}",
            uuid=uuid,
            pci_bus_id=pci,
            memory_total_bytes=None if mem is None else int(mem.total),
            memory_used_bytes=None if mem is None else int(mem.used),
            utilization_gpu_pct=None if util is None else float(util.gpu),
            utilization_memory_pct=None if util is None else float(util.memory),
            temperature_c=_float(
                q(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU, what="temperature")
            ),
            temperature_slowdown_c=_float(
                q(
                    n.nvmlDeviceGetTemperatureThreshold,
                    h,
                    n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                    what="temperature thresholds",
                )
            ),
            temperature_shutdown_c=_float(
                q(
                    n.nvmlDeviceGetTemperatureThreshold,
                    h,
                    n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                    what="temperature thresholds",
                )
            ),
            power_draw_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            sm_clock_mhz=_float(q(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM, what="SM clock")),
            sm_clock_max_mhz=_float(
                q(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM, what="SM clock")
            ),
            clock_event_reasons=None if reasons is None else int(reasons),
            ecc=self._ecc(h),
            retired_pages_pending=None if pending_pages is None else bool(pending_pages),
            remapped_rows=_remapped(remapped),
            pcie=self._pcie(index, h),
            processes=processes,
            processes_unreadable=unreadable,
            persistence_mode=None if persistence is None else bool(persistence),
            compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
            mig_mode=mig_mode,
            mig_devices=tuple(self._mig_device(mh) for mh in mig_handles),
            fabric=self._fabric(h),
        )
        if self._reading.suspect:
            # An optional query answered as a lost GPU would: lost only if a core
            # query now fails too (raises _GpuLost), else it was that query alone.
            self._core(n.nvmlDeviceGetMemoryInfo, h, "memory")
        refused = self._reading.refused
        if refused:
            notes = ", ".join(f"{what} ({kind})" for what, kind in refused.items())
            sample = replace(sample, unavailable=notes)
        return sample

    def _clock_event_reasons(self, h: Any) -> int | None:
        n = self._nvml
        # Older nvidia-ml-py releases only have the "throttle" spelling; newer ones
        # (CUDA 14) only the "event" one.
        reasons = self._query(
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None), h, what="clock reasons"
        )
        if reasons is None:
            reasons = self._query(
                getattr(n, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
                h,
                what="clock reasons",
            )
        return None if reasons is None else int(reasons)

    def _pci_bus_id(self, h: Any) -> str | None:
        info = self._core(self._nvml.nvmlDeviceGetPciInfo, h, "PCI info")
        bus = _text(getattr(info, "busId", None)) if info is not None else None
        return normalize_pci_bus_id(bus) if bus else None

    def _ecc(self, h: Any) -> EccCounts:
        n = self._nvml
        q = self._query
        unc, cor = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        get = n.nvmlDeviceGetTotalEccErrors
        return EccCounts(
            volatile_corrected=q(get, h, cor, vol, what="ECC counts"),
            volatile_uncorrected=q(get, h, unc, vol, what="ECC counts"),
            aggregate_corrected=q(get, h, cor, agg, what="ECC counts"),
            aggregate_uncorrected=q(get, h, unc, agg, what="ECC counts"),
        )

    def _pcie(self, index: int, h: Any) -> PcieLink:
        n = self._nvml
        q = self._query
        tx, rx = self._pcie_traffic(index, h)
        return PcieLink(
            gen_current=q(n.nvmlDeviceGetCurrPcieLinkGeneration, h, what="PCIe link"),
            gen_max=q(n.nvmlDeviceGetMaxPcieLinkGeneration, h, what="PCIe link"),
            gen_gpu_max=q(n.nvmlDeviceGetGpuMaxPcieLinkGeneration, h, what="PCIe link"),
            width_current=q(n.nvmlDeviceGetCurrPcieLinkWidth, h, what="PCIe link"),
            width_max=q(n.nvmlDeviceGetMaxPcieLinkWidth, h, what="PCIe link"),
            tx_kib_per_s=tx,
            rx_kib_per_s=rx,
        )

    def _pcie_traffic(self, index: int, h: Any) -> tuple[int | None, int | None]:
        """PCIe traffic in KiB/s: from the byte counters between two readings, else
        from the throughput query at most every :data:`PCIE_THROUGHPUT_PERIOD_S`."""
        if index not in self._pcie_counters_missing:
            counts = self._pcie_counters(h)
            if counts is not None:
                last = self._pcie_counts.get(index)
                self._pcie_counts[index] = counts
                return _rates(last, counts)
            self._pcie_counters_missing.add(index)
        now = self._monotonic()
        last_asked = self._throughput_at.get(index)
        if last_asked is not None and now - last_asked < PCIE_THROUGHPUT_PERIOD_S:
            return None, None
        self._throughput_at[index] = now
        n = self._nvml
        get = n.nvmlDeviceGetPcieThroughput
        return (
            self._query(get, h, n.NVML_PCIE_UTIL_TX_BYTES, what="PCIe throughput"),
            self._query(get, h, n.NVML_PCIE_UTIL_RX_BYTES, what="PCIe throughput"),
        )

    def _pcie_counters(self, h: Any) -> tuple[int, int, float] | None:
        """The PCIe byte counters (sent, received) and when they were read (seconds),
        or ``None`` where this GPU or driver lacks them."""
        n = self._nvml
        ids = (
            getattr(n, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", None),
            getattr(n, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", None),
        )
        get = getattr(n, "nvmlDeviceGetFieldValues", None)
        if get is None or None in ids:
            return None
        values = self._query(get, h, list(ids), what="PCIe counters")
        if values is None:
            return None
        try:
            tx, rx = values[0], values[1]
            if int(tx.nvmlReturn) != _NVML_SUCCESS or int(rx.nvmlReturn) != _NVML_SUCCESS:
                return None
            # The field's own timestamp (microseconds) dates the count, not our clock.
            when = int(tx.timestamp) / 1e6 if int(tx.timestamp) else self._monotonic()
            return int(tx.value.ullVal), int(rx.value.ullVal), when
        except (AttributeError, IndexError, TypeError, ValueError):
            return None

    def _fabric(self, h: Any) -> str | None:
        """The GPU's NVLink fabric registration (see :attr:`GpuSample.fabric`)."""
        n = self._nvml
        make = getattr(n, "c_nvmlGpuFabricInfoV_t", None)
        get = getattr(n, "nvmlDeviceGetGpuFabricInfoV", None)
        if make is None or get is None:
            make = getattr(n, "c_nvmlGpuFabricInfo_t", None)
            get = getattr(n, "nvmlDeviceGetGpuFabricInfo", None)
        if make is None or get is None:
            return None
        info = make()
        # NVML fills the structure through its pointer.
        if self._query(get, h, ctypes.byref(info), what="fabric state") is None:
            return None
        state = _FABRIC_STATES.get(int(info.state) & 0xFF)
        status = int(getattr(info, "status", _NVML_SUCCESS))
        if state == "completed" and status != _NVML_SUCCESS:
            return f"failed: {_describe(n.NVMLError(status))}"
        return state

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
                if type(exc).__name__ != "NVMLError_FunctionNotFound":
                    return None, self._unreadable(exc)
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
            return None, self._unreadable(exc)

    def _unreadable(self, exc: BaseException) -> str:
        """Why the process list is unknown; an answer a lost GPU would give makes the
        reading check a core query again (as :meth:`_query` does)."""
        if self._lost and isinstance(exc, self._lost):
            self._reading.suspect = True
        return f"the process list cannot be read ({_describe(exc)})"

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
                with self._calls.inside():
                    h = self._handle(index)
                    n.nvmlDeviceRegisterEvents(h, kind, event_set)
                registered += 1
            except (_GpuLost, _Refused, RuntimeError, n.NVMLError):
                continue  # NotSupported on this GPU, or lost: the others are watched
        if not registered:
            self._system(getattr(n, "nvmlEventSetFree", None), event_set)
            return None
        return _NvmlXidWatch(n, event_set, self._calls)

    def close(self) -> None:
        """Shut NVML down once every call in flight has ended (see the module's
        docstring); later calls read nothing."""
        if self._closed:
            return
        self._closed = True
        if not self._calls.close(self._close_wait_s):
            return  # a thread is still inside NVML: shutting down now would free its memory
        with contextlib.suppress(self._nvml.NVMLError, *self._mismatch):
            self._nvml.nvmlShutdown()


class _NvmlXidWatch:
    """Waits on an NVML event set registered for Xid critical errors."""

    def __init__(self, nvml: Any, event_set: Any, calls: _Calls) -> None:
        self._nvml = nvml
        self._set = event_set
        self._calls = calls

    def wait(self, timeout_s: float) -> list[XidNotice]:
        try:
            with self._calls.inside():
                return self._wait(timeout_s)
        except RuntimeError:
            return []  # NVML was shut down: no more events

    def _wait(self, timeout_s: float) -> list[XidNotice]:
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
        if free is None:
            return
        with contextlib.suppress(self._nvml.NVMLError, RuntimeError), self._calls.inside():
            free(self._set)


def _describe(exc: BaseException) -> str:
    """NVML's words for an error, with its class: ``"GPU is lost (GpuIsLost)"``."""
    kind = type(exc).__name__.removeprefix("NVMLError_")
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{text} ({kind})" if text and text != kind else kind


def _rates(
    last: tuple[int, int, float] | None, now: tuple[int, int, float]
) -> tuple[int | None, int | None]:
    """KiB/s sent and received between two readings of the PCIe byte counters;
    ``None`` for a first reading, or counters that went back (a GPU reset)."""
    if last is None or now[2] <= last[2] or now[0] < last[0] or now[1] < last[1]:
        return None, None
    seconds = now[2] - last[2]
    return round((now[0] - last[0]) / 1024 / seconds), round((now[1] - last[1]) / 1024 / seconds)


def _kind(exc: BaseException) -> str:
    """NVML's error class without its prefix: ``"Unknown"``, ``"NoPermission"``."""
    return type(exc).__name__.removeprefix("NVMLError_")


def _short(fn: Callable[..., Any]) -> str:
    """A query's name without NVML's prefix: ``"TotalEccErrors"``."""
    return getattr(fn, "__name__", "query").removeprefix("nvmlDeviceGet")


def _owner(pid: int) -> tuple[str | None, str | None]:
    """User and executable name of ``pid`` when visible from here."""
    from trainmedic.host import ps

    try:
        p = ps.Process(pid)
        return p.username(), p.name()
    except (ps.Error, OSError):
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
