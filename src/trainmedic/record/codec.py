"""JSON forms of the run record types, one compact object per line.

Long runs write hundreds of thousands of lines, so the append-only files use
short keys and leave out fields that are ``None`` or at their default; the key
tables below are the reference and docs/run-record.md explains every one with
its unit. ``meta.json``, loaders and events are small and keep full names.
GPU samples, delta-encoded, are in :mod:`trainmedic.record.gpu_codec`
(importable from here); the checked value readers in
:mod:`trainmedic.record.values`.

Every ``decode_*`` raises ``KeyError``, ``TypeError`` or ``ValueError`` on a
malformed object; the store turns those into a
:class:`~trainmedic.errors.RunDirectoryError` naming the file and line.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

# The GPU samples' codec is part of this one (its own module for its size).
from trainmedic.record.events import EventKind
from trainmedic.record.gpu_codec import GPU_KEYS as GPU_KEYS
from trainmedic.record.gpu_codec import GpuSampleDecoder as GpuSampleDecoder
from trainmedic.record.gpu_codec import GpuSampleEncoder as GpuSampleEncoder
from trainmedic.record.types import (
    HostSample,
    LoaderActivity,
    LoaderInfo,
    RunEvent,
    RunMeta,
    StepRecord,
    StepWindow,
)
from trainmedic.record.values import (
    PCT_DIGITS,
    TIME_DIGITS,
    int_value,
    mapping,
    opt_bool,
    opt_float,
    opt_int,
    rounded,
    str_value,
)

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
        out[key] = rounded(value, TIME_DIGITS) if name in _STEP_SECONDS else value
    return out


def _time(raw: Any, name: str) -> float:
    """A time span, seconds: a hand-edited record's negative one is malformed, not a
    step that took less than nothing."""
    value = float(raw)
    if not value >= 0.0:  # also NaN
        raise ValueError(f"{name} must be a time of 0 s or more, not {raw!r}")
    return value


def _opt_time(raw: Any, name: str) -> float | None:
    return None if raw is None else _time(raw, name)


def decode_step(obj: Mapping[str, Any]) -> StepRecord:
    k = STEP_KEYS
    return StepRecord(
        step=int_value(obj[k["step"]]),
        t=float(obj[k["t"]]),
        duration_s=_time(obj[k["duration_s"]], "duration_s"),
        data_wait_s=_time(obj.get(k["data_wait_s"], 0.0), "data_wait_s"),
        compute_s=_opt_time(obj.get(k["compute_s"]), "compute_s"),
        gpu_time_s=_opt_time(obj.get(k["gpu_time_s"]), "gpu_time_s"),
        samples=opt_int(obj.get(k["samples"])),
        source=str_value(obj.get(k["source"], "optimizer")),
        phase=str_value(obj.get(k["phase"], "train")),
        pid=int_value(obj.get(k["pid"], 0)),
        rank=opt_int(obj.get(k["rank"])),
        alloc_peak_bytes=opt_int(obj.get(k["alloc_peak_bytes"])),
        reserved_peak_bytes=opt_int(obj.get(k["reserved_peak_bytes"])),
        alloc_retries=opt_int(obj.get(k["alloc_retries"])),
        ooms=opt_int(obj.get(k["ooms"])),
        autocast=opt_bool(obj.get(k["autocast"])),
    )


_INT_COLUMNS = ("step", "samples", "alloc_peak_bytes", "reserved_peak_bytes", "alloc_retries",
                "ooms")  # fmt: skip
_STR_COLUMNS = ("source", "phase")
_REQUIRED_COLUMNS = ("step", "t", "duration_s")
_STEP_ORDER = tuple(f.name for f in fields(StepRecord))


def decode_step_rows(
    cols: Sequence[str],
    rows: Sequence[Any],
    pid: int,
    rank: int | None,
    t0: float | None = None,
    ns_columns: Collection[str] = (),
) -> list[StepRecord]:
    """Steps from columns and rows (the channel's batches), with the checks
    :func:`decode_step` gives each field.

    The supervisor reads every step of a job here, so a column is checked and
    converted at once (its values' types as a set, nanoseconds by one
    comprehension) instead of one reader call per value, which cost it more than
    the JSON parsing. ``ns_columns`` hold integer nanoseconds (``t`` counted from
    ``t0``); a ``None`` value is a field left at its default (``None`` in a
    required column is a missing field).

    Raises:
        ValueError, KeyError, TypeError: a row or value is malformed.
    """
    for name in _REQUIRED_COLUMNS:
        if name not in cols:
            raise KeyError(name)
    width = len(cols)
    if rows and (set(map(type, rows)) != {list} or set(map(len, rows)) != {width}):
        bad = next(r for r in rows if type(r) is not list or len(r) != width)
        if type(bad) is not list:
            raise TypeError(f"expected a list, got {bad!r}")
        raise ValueError(f"a step row has {len(bad)} values for {width} columns")
    n = len(rows)
    given = dict(zip(cols, zip(*rows, strict=True), strict=True)) if n else {}
    args: list[Iterable[Any]] = []
    for name in _STEP_ORDER:
        if name == "pid":
            args.append(itertools.repeat(pid, n))
        elif name == "rank":
            args.append(itertools.repeat(rank, n))
        elif name in given:
            args.append(_column(name, given[name], t0 if name in ns_columns else None))
        else:
            args.append(itertools.repeat(_STEP_DEFAULTS.get(name), n))  # n = 0 for required ones
    # Made without the dataclass's __init__: a frozen one sets each of the 16 fields
    # through object.__setattr__, 2 µs a step; the instance is the same.
    make = object.__new__
    steps = []
    for values in zip(*args, strict=True):
        step = make(StepRecord)
        step.__dict__.update(zip(_STEP_ORDER, values, strict=True))
        steps.append(step)
    return steps


def _column(name: str, values: Sequence[Any], t0: float | None) -> Sequence[Any]:
    """One column's values, checked as :func:`decode_step` checks each (``t0``: the
    column holds nanoseconds, and for ``t`` from ``t0``)."""
    types = set(map(type, values))
    default = _STEP_DEFAULTS.get(name)  # required fields have none, and no None
    if type(None) in types:
        if name in _REQUIRED_COLUMNS:
            raise KeyError(name)
        types.discard(type(None))
        fill = True
    else:
        fill = False
    if name in _INT_COLUMNS or t0 is not None:
        _only(types, int, values, "an integer")
    elif name in _STR_COLUMNS:
        _only(types, str, values, "a string")
    elif name == "autocast":
        _only(types, bool, values, "true/false")
    else:
        # Seconds as given: the per-value reader (float() as decode_step uses it).
        reader = _time_of(name) if name != "t" else float
        return [default if v is None else reader(v) for v in values]
    if t0 is not None:
        if name == "t":
            return [v / 1e9 + t0 for v in values]
        times = [default if v is None else v / 1e9 for v in values]
        if min((v for v in values if v is not None), default=0) < 0:
            bad = next(v for v in values if v is not None and v < 0)
            raise ValueError(f"{name} must be a time of 0 s or more, not {bad / 1e9!r}")
        return times
    return [default if v is None else v for v in values] if fill else values


def _only(types: set[type], kind: type, values: Sequence[Any], what: str) -> None:
    if types - {kind}:
        bad = next(v for v in values if v is not None and type(v) is not kind)
        raise TypeError(f"expected {what}, got {bad!r}")


def _time_of(name: str) -> Callable[[Any], float]:
    return lambda raw: _time(raw, name)


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
    "compute_count": "cn",
    "compute_duration_sum_s": "cds",
    "gpu_time_count": "gn",
    "gpu_time_duration_sum_s": "gds",
}


def encode_window(w: StepWindow) -> dict[str, Any]:
    k = WINDOW_KEYS
    out: dict[str, Any] = {
        k["t_start"]: rounded(w.t_start, TIME_DIGITS),
        k["t"]: rounded(w.t, TIME_DIGITS),
        k["count"]: w.count,
        k["first_step"]: w.first_step,
        k["last_step"]: w.last_step,
        k["duration_sum_s"]: rounded(w.duration_sum_s, TIME_DIGITS),
        k["duration_min_s"]: rounded(w.duration_min_s, TIME_DIGITS),
        k["duration_max_s"]: rounded(w.duration_max_s, TIME_DIGITS),
        k["data_wait_sum_s"]: rounded(w.data_wait_sum_s, TIME_DIGITS),
        k["pid"]: w.pid,
    }
    if w.compute_sum_s is not None:
        out[k["compute_sum_s"]] = rounded(w.compute_sum_s, TIME_DIGITS)
    if w.compute_count is not None and w.compute_duration_sum_s is not None:
        out[k["compute_count"]] = w.compute_count
        out[k["compute_duration_sum_s"]] = rounded(w.compute_duration_sum_s, TIME_DIGITS)
    if w.gpu_time_sum_s is not None:
        out[k["gpu_time_sum_s"]] = rounded(w.gpu_time_sum_s, TIME_DIGITS)
    if w.gpu_time_count is not None and w.gpu_time_duration_sum_s is not None:
        out[k["gpu_time_count"]] = w.gpu_time_count
        out[k["gpu_time_duration_sum_s"]] = rounded(w.gpu_time_duration_sum_s, TIME_DIGITS)
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
        count=int_value(obj[k["count"]]),
        first_step=int_value(obj[k["first_step"]]),
        last_step=int_value(obj[k["last_step"]]),
        duration_sum_s=float(obj[k["duration_sum_s"]]),
        duration_min_s=float(obj[k["duration_min_s"]]),
        duration_max_s=float(obj[k["duration_max_s"]]),
        data_wait_sum_s=float(obj[k["data_wait_sum_s"]]),
        compute_sum_s=opt_float(obj.get(k["compute_sum_s"])),
        gpu_time_sum_s=opt_float(obj.get(k["gpu_time_sum_s"])),
        samples_sum=opt_int(obj.get(k["samples_sum"])),
        pid=int_value(obj.get(k["pid"], 0)),
        phase=str_value(obj.get(k["phase"], "train")),
        compute_count=opt_int(obj.get(k["compute_count"])),
        compute_duration_sum_s=opt_float(obj.get(k["compute_duration_sum_s"])),
        gpu_time_count=opt_int(obj.get(k["gpu_time_count"])),
        gpu_time_duration_sum_s=opt_float(obj.get(k["gpu_time_duration_sum_s"])),
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
    "tool_cpu_pct": "xc",
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
            value = rounded(value, TIME_DIGITS)
        elif name in _HOST_RATES:
            value = rounded(value, 0)
        elif name in _HOST_CORES:
            value = rounded(value, _CORE_DIGITS)
        elif name not in _HOST_INTS and name not in _HOST_OPT_INTS:
            value = rounded(value, PCT_DIGITS)
        out[key] = value
    return out


def decode_host(obj: Mapping[str, Any]) -> HostSample:
    values: dict[str, Any] = {}
    for name, key in HOST_KEYS.items():
        if name in _HOST_REQUIRED:
            raw = obj[key]
            values[name] = int_value(raw) if name in _HOST_INTS else float(raw)
        elif name in _HOST_OPT_INTS:
            values[name] = opt_int(obj.get(key))
        else:
            values[name] = opt_float(obj.get(key))
    return HostSample(**values)


# --- loaders, loader activity, events --------------------------------------------------


def encode_loader(info: LoaderInfo) -> dict[str, Any]:
    return {f.name: getattr(info, f.name) for f in fields(LoaderInfo)}


def decode_loader(obj: Mapping[str, Any]) -> LoaderInfo:
    return LoaderInfo(
        t=float(obj["t"]),
        pid=int_value(obj["pid"]),
        loader_id=int_value(obj["loader_id"]),
        num_workers=int_value(obj["num_workers"]),
        batch_size=opt_int(obj.get("batch_size")),
        pin_memory=bool(opt_bool(obj["pin_memory"])),
        prefetch_factor=opt_int(obj.get("prefetch_factor")),
        persistent_workers=bool(opt_bool(obj["persistent_workers"])),
        dataset_type=None if obj.get("dataset_type") is None else str_value(obj["dataset_type"]),
        dataset_len=opt_int(obj.get("dataset_len")),
    )


def encode_loader_activity(a: LoaderActivity) -> dict[str, Any]:
    out: dict[str, Any] = {"t": rounded(a.t, TIME_DIGITS), "pid": a.pid, "counts": dict(a.counts)}
    if a.top_frames:
        out["top_frames"] = dict(a.top_frames)
    if a.handoff:
        out["handoff"] = dict(a.handoff)
    if a.helper_frames:
        out["helper_frames"] = dict(a.helper_frames)
    return out


def _counts(obj: Any) -> dict[str, int]:
    return {str_value(k): int_value(v) for k, v in mapping(obj or {}).items()}


def decode_loader_activity(obj: Mapping[str, Any]) -> LoaderActivity:
    return LoaderActivity(
        t=float(obj["t"]),
        pid=int_value(obj["pid"]),
        counts=_counts(obj["counts"]),
        top_frames=_counts(obj.get("top_frames")),
        handoff=_counts(obj.get("handoff")),
        helper_frames=_counts(obj.get("helper_frames")),
    )


def encode_event(e: RunEvent) -> dict[str, Any]:
    kind = str(e.kind)
    if e.kind is EventKind.UNKNOWN:
        kind = str(e.data.get("unknown_kind") or kind)  # as another version wrote it
    out: dict[str, Any] = {"t": rounded(e.t, TIME_DIGITS), "kind": kind, "message": e.message}
    if e.pid is not None:
        out["pid"] = e.pid
    if e.data:
        out["data"] = dict(e.data)
    return out


def decode_event(obj: Mapping[str, Any]) -> RunEvent:
    name = str_value(obj["kind"])
    data = dict(mapping(obj.get("data") or {}))
    kind = EventKind.parse(name)
    if kind is None:  # written by another version: kept, under its own name
        kind = EventKind.UNKNOWN
        data["unknown_kind"] = name
    return RunEvent(
        t=float(obj["t"]),
        kind=kind,
        message=str_value(obj["message"]),
        pid=opt_int(obj.get("pid")),
        data=data,
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
        run_id=str_value(obj["run_id"]),
        command=tuple(str_value(c) for c in command),
        cwd=str_value(obj["cwd"]),
        started_at=float(obj["started_at"]),
        ended_at=opt_float(obj.get("ended_at")),
        exit_code=opt_int(obj.get("exit_code")),
        trainmedic_version=str_value(obj.get("trainmedic_version", "")),
        gpu_backend=str_value(obj.get("gpu_backend", "none")),
        environment=dict(mapping(obj.get("environment") or {})),
    )
