"""Typed GPU readings, as NVML gives them.

Every field a GPU may not support is ``Optional``: ``None`` means "not
supported or not readable on this GPU", never "zero". Units are in the names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag


class ClockEventReason(IntFlag):
    """NVML's clock event (formerly "throttle") reason bits.

    Values are NVML's ``nvmlClocksEventReason*`` constants (``BOARD_LIMIT`` and
    ``RELIABILITY`` came with R550-era drivers). What each means for training,
    and when it counts, is :mod:`trainmedic.gpu.faults`.
    """

    NONE = 0
    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100
    BOARD_LIMIT = 0x200
    RELIABILITY = 0x400


@dataclass(frozen=True)
class GpuProcess:
    """A compute process using a GPU.

    Attributes:
        pid: process id as NVML reports it (the host's pid namespace).
        used_memory_bytes: GPU memory it holds, or ``None`` when hidden.
        user: owner's user name when it could be resolved, else ``None``.
        name: executable name when known.
    """

    pid: int
    used_memory_bytes: int | None = None
    user: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class PcieLink:
    """PCIe link state of a GPU.

    Attributes:
        gen_current: link generation in use now (drops when idle to save power).
        gen_max: highest generation the GPU *and its slot* support.
        gen_gpu_max: highest generation the GPU itself supports.
        width_current: lanes in use now.
        width_max: lanes the GPU and slot support.
        tx_kib_per_s / rx_kib_per_s: PCIe traffic over NVML's ~20 ms window.
    """

    gen_current: int | None = None
    gen_max: int | None = None
    gen_gpu_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None
    tx_kib_per_s: int | None = None
    rx_kib_per_s: int | None = None


@dataclass(frozen=True)
class RemappedRows:
    """Row-remapping state (Ampere and newer)."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass(frozen=True)
class EccCounts:
    """ECC error counters. Volatile counts reset at driver load; aggregate never."""

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU in MIG mode.

    Attributes:
        uuid: ``MIG-...`` UUID (what ``CUDA_VISIBLE_DEVICES`` may name), or
            ``None`` when unreadable.
        gpu_instance_id / compute_instance_id: NVML's instance ids (the
            ``GPU-I:`` of a MIG Xid line), ``None`` when unreadable.
        memory_total_bytes / memory_used_bytes: the instance's own memory.
    """

    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU at one moment.

    Attributes:
        timestamp: seconds on the sampling clock (``time.time()`` for NVML).
        index: NVML device index.
        utilization_gpu_pct: share of the last sample period a kernel ran, 0..100.
        utilization_memory_pct: share of time device memory was read or written.
        clock_event_reasons: raw NVML bitmask, see :class:`ClockEventReason`.
        compute_capability: ``(major, minor)``, e.g. ``(9, 0)`` for H100.
        uuid: ``GPU-...`` UUID; ``None`` when the driver could not tell (a GPU
            lost before it was ever read). Never made up: it may end up in
            ``CUDA_VISIBLE_DEVICES``.
        unreachable: why the driver could not reach this GPU at all (fallen off
            the bus, lost, needs a reset), else ``None``; every reading is then
            ``None`` and only identities read earlier remain.
        pci_bus_id: PCI address as ``0000:3b:00.0`` (what Xid lines name).
        mig_mode: MIG mode is on (``True``), off (``False``), or unknown or not
            supported by this GPU (``None``).
        mig_devices: the MIG instances, when MIG is on and they could be read.
        processes_unreadable: why the process list could not be read (MIG
            without privileges, no permission); ``processes`` is then empty and
            means *unknown*, not *none*. ``None`` when it was read.
        unavailable: the readings the driver refused for another reason than
            "not supported", with its words (``"ECC counts (Unknown)"``): common
            inside containers, and no sign of a lost GPU. ``None`` when none was.
        fabric: the GPU's registration with the NVLink fabric on NVSwitch
            machines (HGX), which Fabric Manager performs and CUDA waits for:
            ``"completed"``, ``"in_progress"``, ``"not_started"`` or
            ``"failed: <NVML's error>"``; ``None`` where the GPU has no fabric
            or the driver cannot tell.
    """

    timestamp: float
    index: int
    name: str
    uuid: str | None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    clock_event_reasons: int | None = None
    ecc: EccCounts = field(default_factory=EccCounts)
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows = field(default_factory=RemappedRows)
    pcie: PcieLink = field(default_factory=PcieLink)
    processes: tuple[GpuProcess, ...] = ()
    persistence_mode: bool | None = None
    compute_capability: tuple[int, int] | None = None
    unreachable: str | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    processes_unreadable: str | None = None
    unavailable: str | None = None
    fabric: str | None = None

    @property
    def memory_free_bytes(self) -> int | None:
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return max(0, self.memory_total_bytes - self.memory_used_bytes)

    @property
    def reasons(self) -> ClockEventReason:
        """The clock event reasons as flags (``NONE`` when unsupported)."""
        return ClockEventReason(self.clock_event_reasons or 0)

    @property
    def known_processes(self) -> tuple[GpuProcess, ...] | None:
        """The compute processes, or ``None`` when they could not be read."""
        return None if self.processes_unreadable is not None else self.processes

    @property
    def ref(self) -> GpuRef:
        """This GPU by every identity the reading knows."""
        return GpuRef(index=self.index, uuid=self.uuid or None, pci_bus_id=self.pci_bus_id)


@dataclass(frozen=True)
class DriverInfo:
    """The NVIDIA driver.

    Attributes:
        version: driver version string, e.g. ``"550.54.15"``.
        cuda_version: highest CUDA version the driver supports, ``(major, minor)``.
    """

    version: str | None
    cuda_version: tuple[int, int] | None


@dataclass(frozen=True)
class GpuRef:
    """A GPU named by any of its identities (whichever the evidence gives).

    Attributes:
        index: NVML index (``nvidia-smi`` order, PCI bus order).
        uuid: ``GPU-...`` UUID.
        pci_bus_id: PCI address, normalised to ``0000:3b:00.0`` form, lower case.
    """

    index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None

    def __str__(self) -> str:
        if self.index is not None:
            return f"gpu{self.index}"
        return self.uuid or self.pci_bus_id or "gpu?"

    def same_gpu(self, other: GpuRef) -> bool:
        """True when any identity both sides know is equal."""
        if self.uuid and other.uuid:
            return self.uuid.lower() == other.uuid.lower()
        if self.pci_bus_id and other.pci_bus_id:
            return normalize_pci_bus_id(self.pci_bus_id) == normalize_pci_bus_id(other.pci_bus_id)
        return self.index is not None and self.index == other.index


def normalize_pci_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML), ``0000:3b:00`` (Xid), ``3b:00.0`` -> ``0000:3b:00.0``."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:  # bus:device.function without a domain
        parts.insert(0, "0000")
    domain = parts[0][-4:].rjust(4, "0")
    bus = parts[1].rjust(2, "0")
    device_function = parts[2] if len(parts) > 2 else "00"
    if "." not in device_function:
        device_function += ".0"
    return f"{domain}:{bus}:{device_function}"
