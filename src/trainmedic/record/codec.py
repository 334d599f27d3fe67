"""JSON forms of the run record types, one compact object per line.

Long runs write hundreds of thousands of lines, so the append-only files use
short keys and leave out fields that are ``None`` or at their default; the key
tables below are the reference and docs/run-record.md explains every one with
its unit. ``meta.json``, loaders and events are small and keep full names.

Every ``decode_*`` raises ``KeyError``, ``TypeError`` or ``ValueError`` on a
malformed object; the store turns those into a
:class:`~trainmedic.errors.RunDirectoryError` naming the file and line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from trainmedic.gpu.types import EccCounts, GpuProcess, GpuSample, MigDevice, RemappedRows
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunEvent,
    RunMeta,
    StepRecord,
    StepWindow,
)

# Times keep microseconds: finer than any step or sample period we record.
_TIME_DIGITS = 6
# Percentages and rates to a resolution far below their measurement noise.
_PCT_DIGITS = 1


def _round(value: float | None, digits: int) -> float | None:
    if value is None or isinstance(value, int) or not math.isfinite(value):
        return value
    rounded = round(value, digits)
    # ``1.0`` and ``1`` decode to the same float; the shorter form saves bytes.
    return int(rounded) if rounded.is_integer() and abs(rounded) < 2**53 else rounded


def _opt_float(raw: Any) -> float | None:
    return None if raw is None else float(raw)


def _opt_int(raw: Any) -> int | None:
    return None if raw is None else _int(raw)


def _int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"expected an integer, got {raw!r}")
    return raw


def _opt_bool(raw: Any) -> bool | None:
    if raw is None:
        return None
    if not isinstance(raw, bool):
        raise TypeError(f"expected true/false, got {raw!r}")
    return raw


def _str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"expected a string, got {raw!r}")
    return raw


def _mapping(raw: Any) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected an object, got {raw!r}")
    return raw


# --- steps ---------------------------------------------------------------------------

# StepRecord field -> key in steps.jsonl.
STEP_KEYS: dict[str, str] = {
    "step": "s",
    "t": "t",
    "duration_s": "d",
    "data_wait_s": "w",
    "compute_s": "c",
    "gpu_time_s": "g",
    "samples": "n",
    "source": "src",
    "phase": "ph",
    "pid": "p",
    "rank": "r",
    "alloc_peak_bytes": "ap",
    "reserved_peak_bytes": "rp",
    "alloc_retries": "ar",
    "ooms": "oo",
    "autocast": "ac",
}
_STEP_SECONDS = ("t", "duration_s", "data_wait_s", "compute_s", "gpu_time_s")
_STEP_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(StepRecord) if f.name not in ("step", "t", "duration_s")
}


def encode_step(step: StepRecord) -> dict[str, Any]:
    """Short-key object; fields at their default are left out (``pid`` always kept)."""
    out: dict[str, Any] = {}
    for name, key in STEP_KEYS.items():
        value = getattr(step, name)
        if name != "pid" and name in _STEP_DEFAULTS and value == _STEP_DEFAULTS[name]:
            continue
        out[key] = _round(value, _TIME_DIGITS) if name in _STEP_SECONDS else value
    return out


def decode_step(obj: Mapping[str, Any]) -> StepRecord:
    k = STEP_KEYS
    return StepRecord(
        step=_int(obj[k["step"]]),
        t=float(obj[k["t"]]),
        duration_s=float(obj[k["duration_s"]]),
        data_wait_s=float(obj.get(k["data_wait_s"], 0.0)),
        compute_s=_opt_float(obj.get(k["compute_s"])),
        gpu_time_s=_opt_float(obj.get(k["gpu_time_s"])),
        samples=_opt_int(obj.get(k["samples"])),
        source=_str(obj.get(k["source"], "optimizer")),
        phase=_str(obj.get(k["phase"], "train")),
        pid=_int(obj.get(k["pid"], 0)),
        rank=_opt_int(obj.get(k["rank"])),
        alloc_peak_bytes=_opt_int(obj.get(k["alloc_peak_bytes"])),
        reserved_peak_bytes=_opt_int(obj.get(k["reserved_peak_bytes"])),
        alloc_retries=_opt_int(obj.get(k["alloc_retries"])),
        ooms=_opt_int(obj.get(k["ooms"])),
        autocast=_opt_bool(obj.get(k["autocast"])),
    )


# --- windows -------------------------------------------------------------------------

WINDOW_KEYS: dict[str, str] = {
    "t_start": "t0",
    "t": "t",
    "count": "n",
    "first_step": "s0",
    "last_step": "s1",
    "duration_sum_s": "ds",
    "duration_min_s": "dmin",
    "duration_max_s": "dmax",
    "data_wait_sum_s": "ws",
    "compute_sum_s": "cs",
    "gpu_time_sum_s": "gs",
    "samples_sum": "ns",
    "pid": "p",
    "phase": "ph",
}


def encode_window(w: StepWindow) -> dict[str, Any]:
    k = WINDOW_KEYS
    out: dict[str, Any] = {
        k["t_start"]: _round(w.t_start, _TIME_DIGITS),
        k["t"]: _round(w.t, _TIME_DIGITS),
        k["count"]: w.count,
        k["first_step"]: w.first_step,
        k["last_step"]: w.last_step,
        k["duration_sum_s"]: _round(w.duration_sum_s, _TIME_DIGITS),
        k["duration_min_s"]: _round(w.duration_min_s, _TIME_DIGITS),
        k["duration_max_s"]: _round(w.duration_max_s, _TIME_DIGITS),
        k["data_wait_sum_s"]: _round(w.data_wait_sum_s, _TIME_DIGITS),
        k["pid"]: w.pid,
    }
    if w.compute_sum_s is not None:
        out[k["compute_sum_s"]] = _round(w.compute_sum_s, _TIME_DIGITS)
    if w.gpu_time_sum_s is not None:
        out[k["gpu_time_sum_s"]] = _round(w.gpu_time_sum_s, _TIME_DIGITS)
    if w.samples_sum is not None:
        out[k["samples_sum"]] = w.samples_sum
    if w.phase != "train":
        out[k["phase"]] = w.phase
    return out


def decode_window(obj: Mapping[str, Any]) -> StepWindow:
    k = WINDOW_KEYS
    return StepWindow(
        t_start=float(obj[k["t_start"]]),
        t=float(obj[k["t"]]),
        count=_int(obj[k["count"]]),
        first_step=_int(obj[k["first_step"]]),
        last_step=_int(obj[k["last_step"]]),
        duration_sum_s=float(obj[k["duration_sum_s"]]),
        duration_min_s=float(obj[k["duration_min_s"]]),
        duration_max_s=float(obj[k["duration_max_s"]]),
        data_wait_sum_s=float(obj[k["data_wait_sum_s"]]),
        compute_sum_s=_opt_float(obj.get(k["compute_sum_s"])),
        gpu_time_sum_s=_opt_float(obj.get(k["gpu_time_sum_s"])),
        samples_sum=_opt_int(obj.get(k["samples_sum"])),
        pid=_int(obj.get(k["pid"], 0)),
        phase=_str(obj.get(k["phase"], "train")),
    )


# --- host samples ----------------------------------------------------------------------

HOST_KEYS: dict[str, str] = {
    "t": "t",
    "job_cpu_pct": "jc",
    "job_rss_bytes": "jr",
    "job_processes": "jp",
    "system_cpu_pct": "sc",
    "usable_cores": "uc",
    "iowait_pct": "io",
    "disk_read_bytes_per_s": "dr",
    "disk_write_bytes_per_s": "dw",
    "net_recv_bytes_per_s": "nr",
    "net_sent_bytes_per_s": "ns",
    "mem_available_bytes": "ma",
    "swap_used_bytes": "su",
    "others_cpu_pct": "oc",
    "cgroup_throttled_s": "ct",
    "steal_pct": "sp",
    "train_threads": "tn",
    "train_cpu_cores": "tr",
    "train_wait_cores": "tw",
    "train_wait_max_share": "tm",
    "helper_cpu_cores": "hr",
    "helper_wait_cores": "hw",
    "loader_cpu_cores": "lr",
    "loader_wait_cores": "lw",
    "job_wait_cores": "jw",
    "job_threads": "jt",
}
_HOST_REQUIRED = (
    "t",
    "job_cpu_pct",
    "job_rss_bytes",
    "job_processes",
    "system_cpu_pct",
    "usable_cores",
    "mem_available_bytes",
    "swap_used_bytes",
)
_HOST_INTS = ("job_rss_bytes", "job_processes", "mem_available_bytes", "swap_used_bytes")
_HOST_OPT_INTS = ("train_threads", "job_threads")
# Cores and shares of the job's threads: a millicore is far below their noise.
_HOST_CORES = (
    "train_cpu_cores",
    "train_wait_cores",
    "train_wait_max_share",
    "helper_cpu_cores",
    "helper_wait_cores",
    "loader_cpu_cores",
    "loader_wait_cores",
    "job_wait_cores",
)
_CORE_DIGITS = 3
_HOST_RATES = (
    "disk_read_bytes_per_s",
    "disk_write_bytes_per_s",
    "net_recv_bytes_per_s",
    "net_sent_bytes_per_s",
)


def encode_host(h: HostSample) -> dict[str, Any]:
    """Short keys; percentages to 0.1, byte rates to whole bytes/s, ``None`` left out."""
    out: dict[str, Any] = {}
    for name, key in HOST_KEYS.items():
        value = getattr(h, name)
        if value is None:
            continue
        if name in ("t", "cgroup_throttled_s"):
            value = _round(value, _TIME_DIGITS)
        elif name in _HOST_RATES:
            value = _round(value, 0)
        elif name in _HOST_CORES:
            value = _round(value, _CORE_DIGITS)
        elif name not in _HOST_INTS and name not in _HOST_OPT_INTS:
            value = _round(value, _PCT_DIGITS)
        out[key] = value
    return out


def decode_host(obj: Mapping[str, Any]) -> HostSample:
    values: dict[str, Any] = {}
    for name, key in HOST_KEYS.items():
        if name in _HOST_REQUIRED:
            raw = obj[key]
            values[name] = _int(raw) if name in _HOST_INTS else float(raw)
        elif name in _HOST_OPT_INTS:
            values[name] = _opt_int(obj.get(key))
        else:
            values[name] = _opt_float(obj.get(key))
    return HostSample(**values)


# --- loaders, loader activity, events --------------------------------------------------


def encode_loader(info: LoaderInfo) -> dict[str, Any]:
    return {f.name: getattr(info, f.name) for f in fields(LoaderInfo)}


def decode_loader(obj: Mapping[str, Any]) -> LoaderInfo:
    return LoaderInfo(
        t=float(obj["t"]),
        pid=_int(obj["pid"]),
        loader_id=_int(obj["loader_id"]),
        num_workers=_int(obj["num_workers"]),
        batch_size=_opt_int(obj.get("batch_size")),
        pin_memory=bool(_opt_bool(obj["pin_memory"])),
        prefetch_factor=_opt_int(obj.get("prefetch_factor")),
        persistent_workers=bool(_opt_bool(obj["persistent_workers"])),
        dataset_type=None if obj.get("dataset_type") is None else _str(obj["dataset_type"]),
        dataset_len=_opt_int(obj.get("dataset_len")),
    )


def encode_loader_activity(a: LoaderActivity) -> dict[str, Any]:
    out: dict[str, Any] = {"t": _round(a.t, _TIME_DIGITS), "pid": a.pid, "counts": dict(a.counts)}
    if a.top_frames:
        out["top_frames"] = dict(a.top_frames)
    return out


def decode_loader_activity(obj: Mapping[str, Any]) -> LoaderActivity:
    counts = {_str(k): _int(v) for k, v in _mapping(obj["counts"]).items()}
    frames = {_str(k): _int(v) for k, v in _mapping(obj.get("top_frames") or {}).items()}
    return LoaderActivity(t=float(obj["t"]), pid=_int(obj["pid"]), counts=counts, top_frames=frames)


def encode_event(e: RunEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"t": _round(e.t, _TIME_DIGITS), "kind": e.kind, "message": e.message}
    if e.pid is not None:
        out["pid"] = e.pid
    if e.data:
        out["data"] = dict(e.data)
    return out


def decode_event(obj: Mapping[str, Any]) -> RunEvent:
    return RunEvent(
        t=float(obj["t"]),
        kind=_str(obj["kind"]),
        message=_str(obj["message"]),
        pid=_opt_int(obj.get("pid")),
        data=dict(_mapping(obj.get("data") or {})),
    )


# --- meta ------------------------------------------------------------------------------


def encode_meta(meta: RunMeta) -> dict[str, Any]:
    return {
        "run_id": meta.run_id,
        "command": list(meta.command),
        "cwd": meta.cwd,
        "started_at": meta.started_at,
        "ended_at": meta.ended_at,
        "exit_code": meta.exit_code,
        "trainmedic_version": meta.trainmedic_version,
        "gpu_backend": meta.gpu_backend,
        "environment": dict(meta.environment),
    }


def decode_meta(obj: Mapping[str, Any]) -> RunMeta:
    command = obj["command"]
    if not isinstance(command, list):
        raise TypeError(f"command: expected a list, got {command!r}")
    return RunMeta(
        run_id=_str(obj["run_id"]),
        command=tuple(_str(c) for c in command),
        cwd=_str(obj["cwd"]),
        started_at=float(obj["started_at"]),
        ended_at=_opt_float(obj.get("ended_at")),
        exit_code=_opt_int(obj.get("exit_code")),
        trainmedic_version=_str(obj.get("trainmedic_version", "")),
        gpu_backend=_str(obj.get("gpu_backend", "none")),
        environment=dict(_mapping(obj.get("environment") or {})),
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
_GPU_TEXTS = ("name", "uuid", "pci_bus_id", "processes_unreadable", "unreachable")
_GPU_SCALARS = (
    "name",
    "uuid",
    "pci_bus_id",
    "processes_unreadable",
    "unreachable",
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
        out[name] = _round(value, _PCT_DIGITS) if name in _GPU_ROUNDED else value
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
        out: dict[str, Any] = {"t": _round(s.timestamp, _TIME_DIGITS), "i": s.index}
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
        index = _int(obj[k["index"]])
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
                changes[name] = _str(raw)
            elif name in _GPU_TEXTS:
                changes[name] = None if raw is None else _str(raw)
            elif name in ("memory_total_bytes", "memory_used_bytes", "clock_event_reasons"):
                changes[name] = _opt_int(raw)
            elif name in ("retired_pages_pending", "persistence_mode", "mig_mode"):
                changes[name] = _opt_bool(raw)
            else:
                changes[name] = _opt_float(raw)
        if k["ecc"] in obj:
            changes["ecc"] = EccCounts(*_ints(obj[k["ecc"]], len(_ECC)))
        if k["remapped_rows"] in obj:
            c, u, p, f = _array(obj[k["remapped_rows"]], len(_ROWS))
            changes["remapped_rows"] = RemappedRows(
                _opt_int(c), _opt_int(u), _opt_bool(p), _opt_bool(f)
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
                changes["compute_capability"] = (_int(major), _int(minor))
        sample = replace(base, **changes)
        self._last[index] = sample
        return sample


def _array(raw: Any, length: int | None) -> list[Any]:
    if not isinstance(raw, list) or (length is not None and len(raw) != length):
        raise TypeError(f"expected an array of {length or 'any'} items, got {raw!r}")
    return raw


def _ints(raw: Any, length: int) -> list[int | None]:
    return [_opt_int(v) for v in _array(raw, length)]


def _mig(raw: Any) -> MigDevice:
    uuid, gi, ci, total, used = _array(raw, len(_MIG))
    return MigDevice(
        uuid=None if uuid is None else _str(uuid),
        gpu_instance_id=_opt_int(gi),
        compute_instance_id=_opt_int(ci),
        memory_total_bytes=_opt_int(total),
        memory_used_bytes=_opt_int(used),
    )


def _process(raw: Any) -> GpuProcess:
    pid, mem, user, name = _array(raw, len(_PROC))
    return GpuProcess(
        pid=_int(pid),
        used_memory_bytes=_opt_int(mem),
        user=None if user is None else _str(user),
        name=None if name is None else _str(name),
    )
