"""Simulation files (docs/simulation-format.md): reading, validating, applying a series entry.

:func:`load_simulation_json` reads a file within size and depth limits;
:func:`parse_document` validates it into typed readings, naming the file and
the field on every error (:class:`~trainmedic.errors.SimulationFileError`).
:class:`trainmedic.gpu.simulated.SimulatedBackend` replays what it returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainmedic import jsonfile
from trainmedic.errors import SimulationFileError
from trainmedic.gpu import fields as gpu_fields
from trainmedic.gpu.faults import GPU_AT_RE, parse_xid_line
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuSample,
    MigDevice,
    PcieLink,
    RemappedRows,
    normalize_pci_bus_id,
)

# field -> accepted JSON types (``None`` is accepted for every optional field), derived
# from the one description of GpuSample's fields.
_NUMBER = gpu_fields.JSON_TYPES["float"]
_SCALARS: dict[str, tuple[type, ...]] = {
    f.name: gpu_fields.JSON_TYPES[f.kind] for f in gpu_fields.SCALARS if f.simulated
}


def _members(*groups: gpu_fields.Group) -> dict[str, tuple[type, ...]]:
    return {m: gpu_fields.JSON_TYPES[kind] for g in groups for m, kind in g.members}


_GROUPS: dict[str, tuple[type, dict[str, tuple[type, ...]]]] = {
    "ecc": (EccCounts, _members(gpu_fields.ECC)),
    "remapped_rows": (RemappedRows, _members(gpu_fields.REMAPPED_ROWS)),
    "pcie": (PcieLink, _members(gpu_fields.PCIE_LINK, gpu_fields.PCIE_TRAFFIC)),
}
_REASON_BY_NAME = {
    flag.name.lower(): flag
    for flag in ClockEventReason
    if flag.name is not None and flag is not ClockEventReason.NONE
}
_REQUIRED = ("name", "uuid", "memory_total_bytes")
_KNOWN_GPU_KEYS = (
    set(_SCALARS)
    | set(_GROUPS)
    | {
        "name",
        "uuid",
        "processes",
        "compute_capability",
        "pci_bus_id",
        "mig_devices",
        "kernel_log",
        "series",
    }
)
_MIG_FIELDS = _members(gpu_fields.MIG_DEVICES)
_PCI_RE = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$")

_MISSING: Any = object()


SIMULATION_MAX_BYTES = 16 * 1024 * 1024
"""Largest simulation file read, bytes (the bundled ones are a few KiB)."""


def _finite(value: float) -> bool:
    """A number a reading can hold: finite, and an integer no larger than NVML's 64 bits."""
    if isinstance(value, int):
        return abs(value) <= 2**64
    return math.isfinite(value)


def load_simulation_json(path: str | Path) -> dict[str, Any]:
    """Read and parse a simulation file (at most 16 MiB, nesting at most 64 deep);
    errors name the file."""
    try:
        data = jsonfile.read_json(path, max_bytes=SIMULATION_MAX_BYTES)
    except FileNotFoundError:
        raise SimulationFileError(str(path), None, "no such file") from None
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
        raise SimulationFileError(str(path), None, problem) from None
    except ValueError as exc:
        raise SimulationFileError(str(path), None, jsonfile.describe(exc)) from None
    if not isinstance(data, dict):
        raise SimulationFileError(str(path), None, "expected a JSON object at the top level")
    return data


def apply_overrides(gpu: GpuSample, overrides: Mapping[str, Any]) -> GpuSample:
    """``gpu`` with a series entry's ``overrides`` applied (groups merged field by field)."""
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in _GROUPS:
            changes[key] = replace(getattr(gpu, key), **value)
        else:
            changes[key] = value
    return _lost_if_unreachable(replace(gpu, **changes))


def _lost_if_unreachable(gpu: GpuSample) -> GpuSample:
    """An unreachable GPU answers nothing: only the identities read before remain
    (as the NVML backend reports a GPU lost from the bus)."""
    if gpu.unreachable is None:
        return gpu
    return GpuSample(
        timestamp=gpu.timestamp,
        index=gpu.index,
        name=gpu.name,
        uuid=gpu.uuid,
        pci_bus_id=gpu.pci_bus_id,
        unreachable=gpu.unreachable,
    )


class _Parser:
    """Validates a simulation document, naming the file and field on error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str | None, problem: str) -> SimulationFileError:
        return SimulationFileError(self.source, field, problem)

    def driver(self, raw: Any) -> DriverInfo | None:
        if raw is _MISSING:
            raise self.fail("driver", "missing (use null for a machine without a driver)")
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise self.fail("driver", "expected an object or null")
        version = raw.get("version")
        if version is not None and not isinstance(version, str):
            raise self.fail("driver.version", 'expected a string such as "550.54.15"')
        cuda = raw.get("cuda_version")
        return DriverInfo(
            version=version, cuda_version=self.version_pair("driver.cuda_version", cuda)
        )

    def version_pair(self, field: str, raw: Any) -> tuple[int, int] | None:
        if raw is None:
            return None
        if isinstance(raw, str):
            parts = raw.split(".")
            if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]):
                return int(parts[0]), int(parts[1])
        if (
            isinstance(raw, list)
            and len(raw) == 2
            and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in raw)
        ):
            return int(raw[0]), int(raw[1])
        raise self.fail(field, f'expected "MAJOR.MINOR" or [major, minor], got {raw!r}')

    def gpu(self, i: int, raw: Any) -> tuple[GpuSample, list[tuple[float, Mapping[str, Any]]]]:
        where = f"gpus[{i}]"
        if not isinstance(raw, dict):
            raise self.fail(where, "expected an object")
        for key in _REQUIRED:
            if key not in raw or raw[key] is None:
                raise self.fail(f"{where}.{key}", "missing (required)")
        for key in ("name", "uuid"):
            if not isinstance(raw[key], str):
                raise self.fail(f"{where}.{key}", "expected a string")
        unknown = sorted(set(raw) - _KNOWN_GPU_KEYS)
        if unknown:
            raise self.fail(f"{where}.{unknown[0]}", "unknown field")
        fields = self.readings(
            where, {k: v for k, v in raw.items() if k not in ("series", "kernel_log")}
        )
        gpu = _lost_if_unreachable(GpuSample(timestamp=0.0, index=i, **fields))
        self.check_consistent(where, gpu)
        current = gpu
        steps: list[tuple[float, Mapping[str, Any]]] = []
        series = raw.get("series", [])
        if not isinstance(series, list):
            raise self.fail(f"{where}.series", 'expected a list of {"t": seconds, ...} entries')
        last_t = -1.0
        for j, entry in enumerate(series):
            at = f"{where}.series[{j}]"
            if not isinstance(entry, dict):
                raise self.fail(at, "expected an object")
            t = entry.get("t")
            if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0 or not _finite(t):
                raise self.fail(f"{at}.t", "expected seconds >= 0")
            if t < last_t:
                raise self.fail(f"{at}.t", "series entries must be in time order")
            last_t = float(t)
            rest = {k: v for k, v in entry.items() if k != "t"}
            bad = sorted(set(rest) - (_KNOWN_GPU_KEYS - {"name", "uuid", "series", "kernel_log"}))
            if bad:
                raise self.fail(f"{at}.{bad[0]}", "unknown or unchangeable field")
            overrides = self.readings(at, rest, partial_groups=True)
            current = apply_overrides(current, overrides)
            self.check_consistent(at, current)
            steps.append((float(t), overrides))
        return gpu, steps

    def readings(
        self, where: str, raw: Mapping[str, Any], partial_groups: bool = False
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in raw.items():
            at = f"{where}.{key}"
            if key in ("name", "uuid"):
                out[key] = value
            elif key == "clock_event_reasons":
                out[key] = self.reasons(at, value)
            elif key in _SCALARS:
                out[key] = self.scalar(at, value, _SCALARS[key])
            elif key in _GROUPS:
                cls, spec = _GROUPS[key]
                if not isinstance(value, dict):
                    raise self.fail(at, "expected an object")
                bad = sorted(set(value) - set(spec))
                if bad:
                    raise self.fail(f"{at}.{bad[0]}", "unknown field")
                parsed = {k: self.scalar(f"{at}.{k}", v, spec[k]) for k, v in value.items()}
                out[key] = parsed if partial_groups else cls(**parsed)
            elif key == "processes":
                out[key] = self.processes(at, value)
            elif key == "compute_capability":
                out[key] = self.version_pair(at, value)
            elif key == "pci_bus_id":
                out[key] = self.pci_bus_id(at, value)
            elif key == "mig_devices":
                out[key] = self.mig_devices(at, value)
        return out

    def kernel_log(self, at: str, value: Any) -> list[tuple[float, str]]:
        """Driver lines as ``"line"`` (logged before the start) or ``{"t": s, "line": ...}``."""
        if not isinstance(value, list):
            raise self.fail(at, 'expected a list of lines or {"t": seconds, "line": ...} entries')
        out: list[tuple[float, str]] = []
        for k, entry in enumerate(value):
            where = f"{at}[{k}]"
            line: Any
            if isinstance(entry, str):
                t, line = -1.0, entry  # logged before the backend started
            elif isinstance(entry, dict) and set(entry) <= {"t", "line"}:
                t, line = entry.get("t", 0.0), entry.get("line")
                if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
                    raise self.fail(f"{where}.t", "expected seconds >= 0")
            else:
                raise self.fail(where, 'expected a line or {"t": seconds, "line": ...}')
            if not isinstance(line, str) or (
                parse_xid_line(line) is None and GPU_AT_RE.search(line) is None
            ):
                raise self.fail(
                    where, 'expected an Xid line such as "NVRM: Xid (PCI:0000:3b:00): 79, ..."'
                )
            out.append((float(t), line))
        return out

    def pci_bus_id(self, at: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not _PCI_RE.match(value.strip()):
            raise self.fail(at, f'expected a PCI bus id such as "0000:3b:00.0", got {value!r}')
        return normalize_pci_bus_id(value)

    def mig_devices(self, at: str, value: Any) -> tuple[MigDevice, ...]:
        if not isinstance(value, list):
            raise self.fail(at, "expected a list of MIG instances")
        out = []
        for k, raw in enumerate(value):
            where = f"{at}[{k}]"
            if not isinstance(raw, dict):
                raise self.fail(where, "expected an object")
            bad = sorted(set(raw) - set(_MIG_FIELDS))
            if bad:
                raise self.fail(f"{where}.{bad[0]}", "unknown field")
            fields = {
                name: self.scalar(f"{where}.{name}", raw.get(name), kinds)
                for name, kinds in _MIG_FIELDS.items()
            }
            out.append(MigDevice(**fields))
        return tuple(out)

    def scalar(self, at: str, value: Any, kinds: tuple[type, ...]) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(at, f"expected {_kind_name(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(at, f"expected {_kind_name(kinds)}, got {type(value).__name__}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        if not _finite(value):
            raise self.fail(at, "must be a finite number (at most 2**64)")
        if value < 0:
            raise self.fail(at, "must not be negative")
        if at.endswith("_pct") and value > 100:
            raise self.fail(at, "a percentage must be within 0..100")
        return value

    def reasons(self, at: str, value: Any) -> int | None:
        """NVML's bitmask as an integer, or a list of reason names (``"hw_slowdown"``)."""
        if isinstance(value, list):
            mask = ClockEventReason.NONE
            for k, name in enumerate(value):
                flag = _REASON_BY_NAME.get(name) if isinstance(name, str) else None
                if flag is None:
                    known = ", ".join(sorted(_REASON_BY_NAME))
                    raise self.fail(f"{at}[{k}]", f"unknown reason {name!r} (known: {known})")
                mask |= flag
            return int(mask)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.fail(
                at, 'expected an integer bitmask or a list of names such as ["hw_slowdown"]'
            )
        result = self.scalar(at, value, (int,))
        return None if result is None else int(result)

    def check_consistent(self, at: str, gpu: GpuSample) -> None:
        """Readings that contradict each other, e.g. more memory used than exists."""
        total, used = gpu.memory_total_bytes, gpu.memory_used_bytes
        if total is not None and used is not None and used > total:
            raise self.fail(
                f"{at}.memory_used_bytes", f"{used} exceeds memory_total_bytes ({total})"
            )

    def processes(self, at: str, value: Any) -> tuple[GpuProcess, ...]:
        if not isinstance(value, list):
            raise self.fail(at, "expected a list of processes")
        out = []
        for k, p in enumerate(value):
            pat = f"{at}[{k}]"
            if not isinstance(p, dict):
                raise self.fail(pat, "expected an object")
            pid = p.get("pid")
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise self.fail(f"{pat}.pid", "expected a positive integer")
            used = self.scalar(f"{pat}.used_memory_bytes", p.get("used_memory_bytes"), (int,))
            user = p.get("user")
            name = p.get("name")
            if user is not None and not isinstance(user, str):
                raise self.fail(f"{pat}.user", "expected a string")
            if name is not None and not isinstance(name, str):
                raise self.fail(f"{pat}.name", "expected a string")
            out.append(GpuProcess(pid=pid, used_memory_bytes=used, user=user, name=name))
        return tuple(out)


def _kind_name(kinds: tuple[type, ...]) -> str:
    if kinds == _NUMBER:
        return "a number"
    if kinds == (int,):
        return "an integer"
    if kinds == (bool,):
        return "true or false"
    return " or ".join(k.__name__ for k in kinds)


def parse_document(
    data: Mapping[str, Any], source: str
) -> tuple[
    DriverInfo | None,
    list[GpuSample],
    list[list[tuple[float, Mapping[str, Any]]]],
    list[list[tuple[float, str]]],
]:
    """(driver, GPUs, each GPU's series, each GPU's kernel log) of a simulation document;
    :class:`~trainmedic.errors.SimulationFileError` names ``source`` and the field."""
    parser = _Parser(source)
    driver = parser.driver(data.get("driver", _MISSING))
    if "gpus" not in data:
        raise SimulationFileError(source, "gpus", "missing (use [] for a machine without GPUs)")
    gpus_raw = data["gpus"]
    if not isinstance(gpus_raw, list):
        raise SimulationFileError(source, "gpus", "expected a list of GPUs")
    if driver is None and gpus_raw:
        raise SimulationFileError(source, "driver", "GPUs are listed but the driver is null")
    gpus: list[GpuSample] = []
    series: list[list[tuple[float, Mapping[str, Any]]]] = []
    logs: list[list[tuple[float, str]]] = []
    for i, raw in enumerate(gpus_raw):
        gpu, steps = parser.gpu(i, raw)
        gpus.append(gpu)
        series.append(steps)
        logs.append(parser.kernel_log(f"gpus[{i}].kernel_log", raw.get("kernel_log", [])))
    return driver, gpus, series, logs
