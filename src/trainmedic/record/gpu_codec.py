"""JSON form of GPU samples in ``gpu.jsonl``: short keys, delta-encoded per GPU.

A GPU is read every second or so for days, and most of a reading repeats the
one before: :class:`GpuSampleEncoder` writes a GPU's first sample whole and
then only the fields that changed; :class:`GpuSampleDecoder` rebuilds each
sample from the one before it. :data:`GPU_KEYS` is the key table
(docs/run-record.md explains every key with its unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from trainmedic.gpu.types import EccCounts, GpuProcess, GpuSample, MigDevice, RemappedRows
from trainmedic.record.values import (
    PCT_DIGITS,
    TIME_DIGITS,
    int_value,
    opt_bool,
    opt_float,
    opt_int,
    rounded,
    str_value,
)

# --- GPU samples (delta-encoded per GPU) ----------------------------------------------

# GpuSample field -> key in gpu.jsonl. ``ecc``, ``remapped_rows``, the PCIe link
# and ``processes`` are arrays (orders in _ECC, _ROWS, _LINK, _PROC).
GPU_KEYS: dict[str, str] = {
    "timestamp": "t",
    "index": "i",
    "name": "nm",
    "uuid": "id",
    "memory_total_bytes": "mt",
    "memory_used_bytes": "mu",
    "utilization_gpu_pct": "ug",
    "utilization_memory_pct": "um",
    "temperature_c": "tc",
    "temperature_slowdown_c": "tsd",
    "temperature_shutdown_c": "tsh",
    "power_draw_w": "pw",
    "power_limit_w": "pl",
    "sm_clock_mhz": "sm",
    "sm_clock_max_mhz": "smx",
    "clock_event_reasons": "ce",
    "ecc": "ecc",
    "retired_pages_pending": "rpp",
    "remapped_rows": "rr",
    "pcie_link": "lk",
    "pcie_traffic": "tr",
    "processes": "pr",
    "persistence_mode": "pm",
    "compute_capability": "cc",
    "pci_bus_id": "pci",
    "mig_mode": "mig",
    "mig_devices": "migd",
    "processes_unreadable": "pru",
    "unreachable": "un",
    "unavailable": "na",
    "fabric": "fab",
}
_ECC = (
    "volatile_corrected",
    "volatile_uncorrected",
    "aggregate_corrected",
    "aggregate_uncorrected",
)
_ROWS = ("correctable", "uncorrectable", "pending", "failure")
_LINK = ("gen_current", "gen_max", "gen_gpu_max", "width_current", "width_max")
_TRAFFIC = ("tx_kib_per_s", "rx_kib_per_s")
_PROC = ("pid", "used_memory_bytes", "user", "name")
_MIG = (
    "uuid",
    "gpu_instance_id",
    "compute_instance_id",
    "memory_total_bytes",
    "memory_used_bytes",
)
_GPU_TEXTS = (
    "name",
    "uuid",
    "pci_bus_id",
    "processes_unreadable",
    "unreachable",
    "unavailable",
    "fabric",
)
_GPU_SCALARS = (
    *_GPU_TEXTS,
    "mig_mode",
    "memory_total_bytes",
    "memory_used_bytes",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "temperature_c",
    "temperature_slowdown_c",
    "temperature_shutdown_c",
    "power_draw_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "clock_event_reasons",
    "retired_pages_pending",
    "persistence_mode",
)
_GPU_ROUNDED = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "temperature_c",
    "temperature_slowdown_c",
    "temperature_shutdown_c",
    "power_draw_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
)


def _gpu_fields(s: GpuSample) -> dict[str, Any]:
    """Every stored field of ``s`` as a JSON value (``None`` for unknown)."""
    out: dict[str, Any] = {}
    for name in _GPU_SCALARS:
        value = getattr(s, name)
        out[name] = rounded(value, PCT_DIGITS) if name in _GPU_ROUNDED else value
    out["ecc"] = [getattr(s.ecc, n) for n in _ECC]
    out["remapped_rows"] = [getattr(s.remapped_rows, n) for n in _ROWS]
    out["pcie_link"] = [getattr(s.pcie, n) for n in _LINK]
    out["pcie_traffic"] = [getattr(s.pcie, n) for n in _TRAFFIC]
    out["processes"] = [[getattr(p, n) for n in _PROC] for p in s.processes]
    out["compute_capability"] = None if s.compute_capability is None else list(s.compute_capability)
    out["mig_devices"] = [[getattr(m, n) for n in _MIG] for m in s.mig_devices]
    return out


def _empty(value: Any) -> bool:
    """Whether ``value`` carries no information (what a first line may leave out)."""
    if value is None:
        return True
    return isinstance(value, list) and all(v is None for v in value) and bool(value)


class GpuSampleEncoder:
    """Encodes GPU samples as changes against the previous line of the same GPU.

    Each line has ``t`` and ``i``, plus only the fields whose value differs from
    the last line written for that GPU index (an explicit ``null`` when a value
    became unknown). A GPU's first line has every field that is known. Names,
    limits and counters rarely change, so a typical line is ~100 bytes.
    Not thread-safe: the store serialises calls.
    """

    def __init__(self) -> None:
        self._last: dict[int, dict[str, Any]] = {}

    def encode(self, s: GpuSample) -> dict[str, Any]:
        current = _gpu_fields(s)
        previous = self._last.get(s.index)
        out: dict[str, Any] = {"t": rounded(s.timestamp, TIME_DIGITS), "i": s.index}
        for name, value in current.items():
            if previous is None:
                if _empty(value) or (name in ("processes", "mig_devices") and not value):
                    continue
            elif previous[name] == value:
                continue
            out[GPU_KEYS[name]] = value
        self._last[s.index] = current
        return out


class GpuSampleDecoder:
    """Inverse of :class:`GpuSampleEncoder`; feed lines in file order."""

    def __init__(self) -> None:
        self._last: dict[int, GpuSample] = {}

    def decode(self, obj: Mapping[str, Any]) -> GpuSample:
        k = GPU_KEYS
        index = int_value(obj[k["index"]])
        base = self._last.get(index)
        if base is None:
            if k["name"] not in obj:
                raise KeyError("first line of a GPU needs 'nm'")
            base = GpuSample(timestamp=0.0, index=index, name="", uuid=None)
        changes: dict[str, Any] = {"timestamp": float(obj[k["timestamp"]])}
        for name in _GPU_SCALARS:
            key = k[name]
            if key not in obj:
                continue
            raw = obj[key]
            if name == "name":
                changes[name] = str_value(raw)
            elif name in _GPU_TEXTS:
                changes[name] = None if raw is None else str_value(raw)
            elif name in ("memory_total_bytes", "memory_used_bytes", "clock_event_reasons"):
                changes[name] = opt_int(raw)
            elif name in ("retired_pages_pending", "persistence_mode", "mig_mode"):
                changes[name] = opt_bool(raw)
            else:
                changes[name] = opt_float(raw)
        if k["ecc"] in obj:
            changes["ecc"] = EccCounts(*_ints(obj[k["ecc"]], len(_ECC)))
        if k["remapped_rows"] in obj:
            c, u, p, f = _array(obj[k["remapped_rows"]], len(_ROWS))
            changes["remapped_rows"] = RemappedRows(
                opt_int(c), opt_int(u), opt_bool(p), opt_bool(f)
            )
        pcie = base.pcie
        if k["pcie_link"] in obj:
            link = _ints(obj[k["pcie_link"]], len(_LINK))
            pcie = replace(pcie, **dict(zip(_LINK, link, strict=True)))
        if k["pcie_traffic"] in obj:
            traffic = _ints(obj[k["pcie_traffic"]], len(_TRAFFIC))
            pcie = replace(pcie, **dict(zip(_TRAFFIC, traffic, strict=True)))
        changes["pcie"] = pcie
        if k["processes"] in obj:
            changes["processes"] = tuple(_process(p) for p in _array(obj[k["processes"]], None))
        if k["mig_devices"] in obj:
            changes["mig_devices"] = tuple(_mig(m) for m in _array(obj[k["mig_devices"]], None))
        if k["compute_capability"] in obj:
            cc = obj[k["compute_capability"]]
            if cc is None:
                changes["compute_capability"] = None
            else:
                major, minor = _array(cc, 2)
                changes["compute_capability"] = (int_value(major), int_value(minor))
        sample = replace(base, **changes)
        self._last[index] = sample
        return sample


def _array(raw: Any, length: int | None) -> list[Any]:
    if not isinstance(raw, list) or (length is not None and len(raw) != length):
        raise TypeError(f"expected an array of {length or 'any'} items, got {raw!r}")
    return raw


def _ints(raw: Any, length: int) -> list[int | None]:
    return [opt_int(v) for v in _array(raw, length)]


def _mig(raw: Any) -> MigDevice:
    uuid, gi, ci, total, used = _array(raw, len(_MIG))
    return MigDevice(
        uuid=None if uuid is None else str_value(uuid),
        gpu_instance_id=opt_int(gi),
        compute_instance_id=opt_int(ci),
        memory_total_bytes=opt_int(total),
        memory_used_bytes=opt_int(used),
    )


def _process(raw: Any) -> GpuProcess:
    pid, mem, user, name = _array(raw, len(_PROC))
    return GpuProcess(
        pid=int_value(pid),
        used_memory_bytes=opt_int(mem),
        user=None if user is None else str_value(user),
        name=None if name is None else str_value(name),
    )
