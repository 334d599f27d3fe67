"""JSON form of GPU samples in ``gpu.jsonl``: short keys, delta-encoded per GPU.

A GPU is read every second or so for days, and most of a reading repeats the
one before: :class:`GpuSampleEncoder` writes a GPU's first sample whole and
then only the fields that changed; :class:`GpuSampleDecoder` rebuilds each
sample from the one before it. :data:`GPU_KEYS` is the key table
(docs/run-record.md explains every key with its unit).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from trainmedic.gpu import fields as gpu_fields
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

GPU_KEYS: dict[str, str] = gpu_fields.record_keys()
"""GpuSample field -> key in gpu.jsonl (derived from :mod:`trainmedic.gpu.fields`)."""
_ECC = gpu_fields.ECC.member_names
_ROWS = gpu_fields.REMAPPED_ROWS.member_names
_LINK = gpu_fields.PCIE_LINK.member_names
_TRAFFIC = gpu_fields.PCIE_TRAFFIC.member_names
_PROC = gpu_fields.PROCESSES.member_names
_MIG = gpu_fields.MIG_DEVICES.member_names
_SCALAR_KINDS = {f.name: f.kind for f in gpu_fields.SCALARS}
_GPU_SCALARS = tuple(_SCALAR_KINDS)
_GPU_ROUNDED = frozenset(f.name for f in gpu_fields.SCALARS if f.rounded)


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
            else:
                changes[name] = _DECODE[_SCALAR_KINDS[name]](raw)
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


def _opt_text(raw: Any) -> str | None:
    return None if raw is None else str_value(raw)


_DECODE: dict[gpu_fields.Kind, Callable[[Any], Any]] = {
    "text": _opt_text,
    "int": opt_int,
    "float": opt_float,
    "bool": opt_bool,
}


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
