"""The channel's messages and their one-line JSON form.

Every line is a JSON object whose ``k`` names the kind. Records of the run
(steps, loaders, loader activity, events) use the run record's JSON forms
(:mod:`trainmedic.record.codec`) plus ``k``; the messages only the channel
knows (hello, torch, heartbeat, bye) are defined here. The first line of a
connection must be a hello carrying the run's token.

Only the standard library and the record types are imported: the probe runs
this inside every process of the job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from trainmedic import jsonfile
from trainmedic.record import codec
from trainmedic.record.types import LoaderActivity, LoaderInfo, RunEvent, StepRecord


@dataclass(frozen=True)
class Hello:
    """A process of the job introduces itself (first line of each connection).

    Attributes:
        role: ``process`` (started by exec), ``forked`` (a fork of a probed
            process) or ``worker`` (a DataLoader worker).
        rank / local_rank: distributed ranks from the environment, when set.
        t: Unix time the probe started in this process, seconds.
        node: the host's name (``uname -n``), where the process runs.
        node_rank / world_size: torchrun's ``GROUP_RANK`` and ``WORLD_SIZE``, when set.
        ring: the hello came with the descriptor of a shared-memory step ring
            (:mod:`trainmedic.channel.ring`): the process's steps come through it once
            the supervisor answers :data:`RING_TAKEN`.
    """

    pid: int
    ppid: int
    role: str
    argv: tuple[str, ...]
    rank: int | None
    local_rank: int | None
    python: str
    executable: str
    t: float
    node: str | None = None
    node_rank: int | None = None
    world_size: int | None = None
    ring: bool = False


RING_TAKEN = b"R"
"""The supervisor's answer to a hello with a ring: it reads the ring from now on."""
RING_REFUSED = b"N"
"""The supervisor's answer to a hello with a ring it cannot read: send steps as lines."""
WAKE = b"!"
"""The supervisor asks the probe's thread to look again: the ring stopped moving."""
STACKS_OUTSIDE = b"S"
"""The supervisor samples the process's stacks from outside (it read a first window):
the probe's own stack sampler rests while the training thread reads a DataLoader."""
STACKS_INSIDE = b"s"
"""The supervisor stopped sampling from outside: the probe's sampler takes over again."""


@dataclass(frozen=True)
class TorchInfo:
    """The torch the process imported, sent once torch is loaded (and again
    when CUDA becomes initialised).

    Attributes:
        cuda_version: CUDA toolkit of the build (``"12.4"``) or ``None``.
        cudnn_version: cuDNN as an integer, when the process loaded it.
        cuda_initialized: whether the job initialised CUDA (the probe never does).
        devices: names of the CUDA devices, read only once CUDA is initialised.
        arch_list: GPU architectures compiled in, read only once CUDA is initialised.
    """

    pid: int
    t: float
    version: str
    cuda_version: str | None
    cudnn_version: int | None
    cuda_initialized: bool
    devices: tuple[str, ...] = ()
    arch_list: tuple[str, ...] = ()


@dataclass(frozen=True)
class Heartbeat:
    """Sign of life, about once a second, with what the main thread is doing.

    Attributes:
        steps: train steps marked so far in this process.
        activity: where the training thread is: ``data`` (blocked on a loader),
            ``forward``, ``backward``, ``optimizer`` or ``other``.
        stack: innermost frames of the main thread, ``"file:line function"``,
            innermost first.
        cpu_s: CPU time of the process so far, seconds.
        work: outermost forward/backward/optimizer calls and DataLoader batches
            so far: a job running an unmarked evaluation keeps increasing it.
        modules: each frame's module (``__name__``), parallel to ``stack``.
        calls: what the innermost frame is calling (``("time", "sleep")``).
        op: the innermost frame's instruction (``CALL``, ``JUMP_BACKWARD``).
        samples: samples of the thread the probe took since the last heartbeat.
        gil_busy: of those, how many waited for running Python code to let go
            of the interpreter lock.
        probe_tid: the probe thread's kernel thread id (its own CPU and I/O are
            not the job's).
        sampler_tid: the stack sampler thread's (the same: its reads of ``/proc`` and
            its CPU while it follows a wait are the probe's, not the job's).
    """

    pid: int
    t: float
    steps: int
    phase: str
    activity: str
    stack: tuple[str, ...]
    cpu_s: float
    work: int = 0
    modules: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    op: str = ""
    samples: int = 0
    gil_busy: int = 0
    probe_tid: int | None = None
    sampler_tid: int | None = None


@dataclass(frozen=True)
class Goodbye:
    """The process is exiting normally (sent from ``atexit``); ``exit_code`` when known.

    Attributes:
        probe_cpu_s: CPU time of the probe's own threads (sending, heartbeats,
            stack sampling) in this process, seconds, when it could be read.
        probe_wall_s: seconds the probe ran in this process.
        stack_samples: stacks the probe's sampler read in this process.
    """

    pid: int
    t: float
    exit_code: int | None = None
    probe_cpu_s: float | None = None
    probe_wall_s: float | None = None
    stack_samples: int | None = None


@dataclass(frozen=True)
class StepBatch:
    """Steps of one process sent as one line (``k: "steps"``): the probe's form.

    The line holds the column names and one array per step, so encoding a
    step costs one list, not one JSON object. The server hands the steps on
    one by one; consumers never see a batch.
    """

    steps: tuple[StepRecord, ...]


ProbeMessage = (
    Hello | TorchInfo | Heartbeat | Goodbye | StepRecord | LoaderInfo | LoaderActivity | RunEvent
)

STEP_COLUMNS = (
    "step",
    "t",
    "duration_s",
    "data_wait_s",
    "compute_s",
    "gpu_time_s",
    "samples",
    "source",
    "phase",
    "alloc_peak_bytes",
    "reserved_peak_bytes",
    "alloc_retries",
    "ooms",
    "autocast",
)
"""The columns of a ``steps`` line as the probe writes them (``StepRecord`` fields)."""
HOST_STEP_COLUMNS = (
    "step",
    "t",
    "duration_s",
    "data_wait_s",
    "compute_s",
    "samples",
    "source",
    "phase",
    "autocast",
)
"""The columns of a step with no GPU timing and no allocator reading (a CPU job)."""
STEP_TIME_COLUMNS = frozenset(("t", "duration_s", "data_wait_s", "compute_s", "gpu_time_s"))
"""Columns that hold integer nanoseconds in a ``steps`` line with a ``t0``."""
_STEP_FIELDS = frozenset(f.name for f in fields(StepRecord)) - {"pid", "rank"}


def encode_steps(
    pid: int,
    rank: int | None,
    rows: list[list[Any]],
    cols: tuple[str, ...] = STEP_COLUMNS,
    t0: float | None = None,
) -> bytes:
    """One ``steps`` line: ``rows`` hold the ``cols`` of each step, in order.

    With ``t0`` (Unix seconds), the :data:`STEP_TIME_COLUMNS` hold integer
    nanoseconds, ``t`` counted from ``t0``: JSON writes an integer several times
    faster than a float, and the probe's thread writes every step of the job.
    Without it they hold seconds.
    """
    obj: dict[str, Any] = {"k": "steps", "pid": pid, "rank": rank, "cols": cols}
    if t0 is not None:
        obj["t0"] = t0
    obj["rows"] = rows
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def _steps(obj: Mapping[str, Any]) -> StepBatch:
    pid = _int(obj["pid"])
    rank = _opt_int(obj.get("rank"))
    cols = tuple(_str(c) for c in _list(obj["cols"]))
    unknown = set(cols) - _STEP_FIELDS
    if unknown or len(set(cols)) != len(cols) or not {"step", "t", "duration_s"} <= set(cols):
        raise ValueError(f"bad step columns {cols!r}")
    t0 = _opt_float(obj.get("t0"))
    in_ns = () if t0 is None else STEP_TIME_COLUMNS
    rows = _list(obj["rows"])
    return StepBatch(tuple(codec.decode_step_rows(cols, rows, pid, rank, t0, in_ns)))


def encode_message(message: ProbeMessage, token: str = "") -> bytes:
    """One line (``\\n``-terminated UTF-8 JSON) for ``message``.

    ``token`` is written into hello lines only.
    """
    obj: dict[str, Any]
    if isinstance(message, StepRecord):
        obj = codec.encode_step(message)
        obj["k"] = "step"
    elif isinstance(message, LoaderInfo):
        obj = codec.encode_loader(message)
        obj["k"] = "loader"
    elif isinstance(message, LoaderActivity):
        obj = codec.encode_loader_activity(message)
        obj["k"] = "activity"
    elif isinstance(message, RunEvent):
        obj = codec.encode_event(message)
        obj["k"] = "event"
    elif isinstance(message, Heartbeat):
        obj = {
            "k": "hb",
            "pid": message.pid,
            "t": message.t,
            "steps": message.steps,
            "phase": message.phase,
            "activity": message.activity,
            "stack": list(message.stack),
            "cpu_s": message.cpu_s,
            "work": message.work,
            "mods": list(message.modules),
            "calls": list(message.calls),
            "op": message.op,
            "n": message.samples,
            "gil": message.gil_busy,
            "tid": message.probe_tid,
            "stid": message.sampler_tid,
        }
    elif isinstance(message, Hello):
        obj = {
            "k": "hello",
            "token": token,
            "pid": message.pid,
            "ppid": message.ppid,
            "role": message.role,
            "argv": list(message.argv),
            "rank": message.rank,
            "local_rank": message.local_rank,
            "python": message.python,
            "executable": message.executable,
            "t": message.t,
            "node": message.node,
            "node_rank": message.node_rank,
            "world_size": message.world_size,
        }
        if message.ring:
            obj["ring"] = True
    elif isinstance(message, TorchInfo):
        obj = {
            "k": "torch",
            "pid": message.pid,
            "t": message.t,
            "version": message.version,
            "cuda_version": message.cuda_version,
            "cudnn_version": message.cudnn_version,
            "cuda_initialized": message.cuda_initialized,
            "devices": list(message.devices),
            "arch_list": list(message.arch_list),
        }
    elif isinstance(message, Goodbye):
        obj = {"k": "bye", "pid": message.pid, "t": message.t, "exit_code": message.exit_code}
        for key in ("probe_cpu_s", "probe_wall_s", "stack_samples"):
            if getattr(message, key) is not None:
                obj[key] = getattr(message, key)
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"not a channel message: {type(message).__name__}")
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=repr)
    return text.encode("utf-8") + b"\n"


def decode_line(line: bytes) -> tuple[ProbeMessage | StepBatch, str | None]:
    """The message on ``line`` and, for a hello, the token it carries.

    Raises:
        ValueError, KeyError, TypeError: the line is not a valid message.
    """
    obj = jsonfile.loads(line)  # bounded nesting: a job cannot crash the channel thread
    if not isinstance(obj, dict):
        raise TypeError("expected a JSON object")
    kind = obj.pop("k")
    if kind == "steps":
        return _steps(obj), None
    if kind == "step":
        return codec.decode_step(obj), None
    if kind == "loader":
        return codec.decode_loader(obj), None
    if kind == "activity":
        return codec.decode_loader_activity(obj), None
    if kind == "event":
        return codec.decode_event(obj), None
    if kind == "hb":
        return _heartbeat(obj), None
    if kind == "hello":
        return _hello(obj), _str(obj.get("token", ""))
    if kind == "torch":
        return _torch(obj), None
    if kind == "bye":
        return Goodbye(
            pid=_int(obj["pid"]),
            t=float(obj["t"]),
            exit_code=_opt_int(obj.get("exit_code")),
            probe_cpu_s=_opt_float(obj.get("probe_cpu_s")),
            probe_wall_s=_opt_float(obj.get("probe_wall_s")),
            stack_samples=_opt_int(obj.get("stack_samples")),
        ), None
    raise ValueError(f"unknown message kind {kind!r}")


def _heartbeat(obj: Mapping[str, Any]) -> Heartbeat:
    return Heartbeat(
        pid=_int(obj["pid"]),
        t=float(obj["t"]),
        steps=_int(obj.get("steps", 0)),
        phase=_str(obj.get("phase", "train")),
        activity=_str(obj.get("activity", "other")),
        stack=tuple(_str(s) for s in _list(obj.get("stack", []))),
        cpu_s=float(obj.get("cpu_s", 0.0)),
        work=_int(obj.get("work", 0)),
        modules=tuple(_str(s) for s in _list(obj.get("mods", []))),
        calls=tuple(_str(s) for s in _list(obj.get("calls", []))),
        op=_str(obj.get("op", "")),
        samples=_int(obj.get("n", 0)),
        gil_busy=_int(obj.get("gil", 0)),
        probe_tid=_opt_int(obj.get("tid")),
        sampler_tid=_opt_int(obj.get("stid")),
    )


def _hello(obj: Mapping[str, Any]) -> Hello:
    return Hello(
        pid=_int(obj["pid"]),
        ppid=_int(obj["ppid"]),
        role=_str(obj["role"]),
        argv=tuple(_str(a) for a in _list(obj.get("argv", []))),
        rank=_opt_int(obj.get("rank")),
        local_rank=_opt_int(obj.get("local_rank")),
        python=_str(obj.get("python", "")),
        executable=_str(obj.get("executable", "")),
        t=float(obj["t"]),
        node=None if obj.get("node") is None else _str(obj["node"]),
        node_rank=_opt_int(obj.get("node_rank")),
        world_size=_opt_int(obj.get("world_size")),
        ring=obj.get("ring") is True,
    )


def _torch(obj: Mapping[str, Any]) -> TorchInfo:
    cuda = obj.get("cuda_version")
    return TorchInfo(
        pid=_int(obj["pid"]),
        t=float(obj["t"]),
        version=_str(obj["version"]),
        cuda_version=None if cuda is None else _str(cuda),
        cudnn_version=_opt_int(obj.get("cudnn_version")),
        cuda_initialized=bool(obj.get("cuda_initialized", False)),
        devices=tuple(_str(d) for d in _list(obj.get("devices", []))),
        arch_list=tuple(_str(a) for a in _list(obj.get("arch_list", []))),
    )


def _int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError(f"expected an integer, got {raw!r}")
    return raw


def _opt_int(raw: Any) -> int | None:
    return None if raw is None else _int(raw)


def _opt_float(raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise TypeError(f"expected a number, got {raw!r}")
    return float(raw)


def _str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeError(f"expected a string, got {raw!r}")
    return raw


def _list(raw: Any) -> list[Any]:
    if not isinstance(raw, list):
        raise TypeError(f"expected a list, got {raw!r}")
    return raw
