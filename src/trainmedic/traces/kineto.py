"""A torch.profiler (Kineto) trace read into what the GPU did in each step.

A trace is a Chrome-trace JSON file (often gzipped) whose ``traceEvents``
hold, among others: ``ProfilerStep#N`` spans (``user_annotation``, older
traces ``cpu_op``), CUDA runtime calls on the host (``cuda_runtime``:
launches, copies, synchronisations, with their host duration), and the GPU's
own activity (``kernel``, ``gpu_memcpy`` such as ``Memcpy HtoD (Pageable ->
Device)``, ``gpu_memset``), each with ``args.device``; and at the top,
``deviceProperties`` and ``distributedInfo`` (rank, world size).

:func:`read_trace` streams the events (``ijson``'s C parser, one event at a
time: memory grows with the GPU intervals kept - 2 floats each - not with the
file) and returns a :class:`TraceSummary`. Per step, on the CPU window of its
``ProfilerStep`` span:

* GPU busy time: the union of kernel, copy and memset intervals on the main
  device (the one with the most GPU time), clipped to the window, over all
  streams - time when at least one stream worked;
* runtime calls started in the window: launches (:data:`LAUNCH_CALLS`) and
  host-device synchronisations (:data:`SYNC_CALLS`, and ``cuda_sync`` events)
  with the host time spent in them;
* copies: their time, and the pageable ones (host memory not pinned, so the
  copy is staged and synchronous);
* NCCL kernels' time.

A file that is not JSON, a truncated gzip, a JSON file without trace events,
or a trace of another tool (no Kineto event categories) raises
:class:`TraceError` with one line saying which.
"""

from __future__ import annotations

import bisect
import gzip
import io
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainmedic.errors import InputError

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
KINETO_CATEGORIES = frozenset(
    {"cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset",
     "user_annotation", "gpu_user_annotation", "cuda_sync", "python_function"}
)  # fmt: skip
STEP_PREFIX = "ProfilerStep#"
LAUNCH_CALLS = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
     "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch"}
)  # fmt: skip
SYNC_CALLS = frozenset(
    {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
     "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"}
)  # fmt: skip
"""Runtime calls that block the host until the GPU has caught up (``cudaMemcpy``: the
synchronous copy)."""
_READ_CHUNK = 1 << 20


class TraceError(InputError):
    """The file is not a torch.profiler trace, or cannot be read as one."""


@dataclass(frozen=True)
class TraceStep:
    """What one ``ProfilerStep`` span saw, times in microseconds.

    Attributes:
        number: N of ``ProfilerStep#N``.
        start_us / dur_us: its CPU window.
        gpu_busy_us: time at least one stream of the main device worked in the window.
        kernel_us / copy_us / memset_us / nccl_us: summed activity of each kind (clipped).
        exposed_nccl_us: time only NCCL kernels ran (communication nothing else overlapped).
        kernels: kernels that ran (a part of them) in the window.
        launches / launch_us: kernel launches started in the window, and the host's time in
            them.
        syncs / sync_us: host-device synchronisations started in it, and the host's time
            in them.
        pageable_copies / pageable_copy_us: copies from or to pageable host memory.
    """

    number: int
    start_us: float
    dur_us: float
    gpu_busy_us: float = 0.0
    kernel_us: float = 0.0
    copy_us: float = 0.0
    memset_us: float = 0.0
    nccl_us: float = 0.0
    exposed_nccl_us: float = 0.0
    kernels: int = 0
    launches: int = 0
    launch_us: float = 0.0
    syncs: int = 0
    sync_us: float = 0.0
    pageable_copies: int = 0
    pageable_copy_us: float = 0.0

    @property
    def gpu_busy_share(self) -> float:
        return self.gpu_busy_us / self.dur_us if self.dur_us > 0 else 0.0


@dataclass(frozen=True)
class Device:
    """``deviceProperties`` of the main device: its name, compute capability, memory."""

    index: int
    name: str | None = None
    compute_capability: str | None = None
    total_memory_bytes: int | None = None


@dataclass(frozen=True)
class TraceSummary:
    """A trace read by :func:`read_trace`.

    Attributes:
        events: trace events read.
        steps: the ``ProfilerStep`` spans in time order.
        device: the main device (``None``: no GPU activity).
        rank / world_size: from ``distributedInfo`` (``None``: not distributed).
        kernels / copies / launches / syncs: counts over the whole trace.
        categories: events by category.
    """

    path: str
    events: int
    steps: tuple[TraceStep, ...]
    device: Device | None
    rank: int | None = None
    world_size: int | None = None
    kernels: int = 0
    copies: int = 0
    launches: int = 0
    syncs: int = 0
    categories: dict[str, int] = field(default_factory=dict)

    @property
    def step_time_median_s(self) -> float | None:
        durs = [s.dur_us for s in self.steps]
        return statistics.median(durs) / 1e6 if durs else None

    @property
    def gpu_busy_share(self) -> float | None:
        """Median over steps of the share of the step the main device was busy, 0..1."""
        shares = [s.gpu_busy_share for s in self.steps]
        return statistics.median(shares) if shares else None


class _Counting(io.RawIOBase):
    """A file that reports how many bytes were read (for a progress bar)."""

    def __init__(self, raw: IO[bytes], on_read: Callable[[int], None] | None) -> None:
        self._raw = raw
        self._on_read = on_read
        self.done = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._raw.read(len(b))
        n = len(data)
        b[:n] = data
        self.done += n
        if self._on_read is not None:
            self._on_read(self.done)
        return n


def _open(path: Path, on_read: Callable[[int], None] | None) -> IO[bytes]:
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller through the wrapper
    magic = raw.read(2)
    raw.seek(0)
    counted = io.BufferedReader(_Counting(raw, on_read), _READ_CHUNK)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=counted, mode="rb")  # type: ignore[return-value]
    return counted


def _events(path: Path, on_read: Callable[[int], None] | None) -> Iterator[dict[str, Any]]:
    """The trace events, one at a time; the header's metadata first, as ``{"": ...}``."""
    import ijson

    with _open(path, on_read) as f:
        header: dict[str, Any] = {}
        prefix = "traceEvents.item"
        parser = ijson.parse(f, use_float=True)
        # The metadata Kineto writes before the events: read it token by token, then
        # let the C parser build the events themselves.
        key: str | None = None
        builder: Any = None
        for pfx, event, value in parser:
            if pfx == "" and event == "start_array":
                prefix = "item"  # the Chrome trace's array form: events only
                break
            if pfx == "" and event == "map_key":
                if builder is not None and key is not None:
                    header[key] = builder.value
                builder = None
                key = value
                if value == "traceEvents":
                    break
                if value in ("deviceProperties", "distributedInfo", "schemaVersion"):
                    builder = ijson.ObjectBuilder()
                continue
            if builder is not None and pfx != "":  # (the value's own events)
                builder.event(event, value)
        else:
            raise TraceError(f"{path}: no traceEvents: not a torch.profiler trace")
        yield {"": header}
    with _open(path, on_read) as f:
        for item in ijson.items(f, prefix, use_float=True):
            if isinstance(item, dict):
                yield item


def _number(step_name: str) -> int | None:
    rest = step_name[len(STEP_PREFIX) :]
    return int(rest) if rest.isdigit() else None


def _union(
    intervals: list[tuple[float, float]],
    lo: float,
    hi: float,
    starts: list[float],
    longest: float,
) -> float:
    """Time covered by the ``intervals`` (sorted, their ``starts``, the ``longest`` one's
    length) within [lo, hi)."""
    i = bisect.bisect_left(starts, lo - longest)
    covered = 0.0
    cur_s = cur_e = None
    for s, e in intervals[i:]:
        if s >= hi:
            break
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                covered += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        covered += cur_e - cur_s
    return covered


@dataclass
class _Gpu:
    intervals: list[tuple[float, float, str, str]] = field(default_factory=list)
    busy_us: float = 0.0


def read_trace(path: Path, on_read: Callable[[int], None] | None = None) -> TraceSummary:
    """Read the torch.profiler trace at ``path`` (JSON, gzipped or not); ``on_read`` gets
    the bytes read so far. Raises :class:`TraceError` when it is not one."""
    import ijson

    try:
        return _read(path, on_read)
    except (ijson.JSONError, ValueError) as exc:
        if isinstance(exc, TraceError):
            raise
        said = exc.args[0] if exc.args else ""
        text = said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)
        first = (text.strip().splitlines() or ["no content"])[0]
        raise TraceError(f"{path}: not valid JSON ({first})") from None
    except (EOFError, gzip.BadGzipFile, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise TraceError(f"{path}: no such file") from None
        if isinstance(exc, (EOFError, gzip.BadGzipFile)):
            raise TraceError(f"{path}: the gzip stream is truncated or corrupt") from None
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _read(path: Path, on_read: Callable[[int], None] | None) -> TraceSummary:
    header: dict[str, Any] = {}
    categories: dict[str, int] = {}
    steps: list[tuple[int, float, float]] = []
    gpus: dict[int, _Gpu] = {}
    runtime: list[tuple[float, float, str]] = []
    syncs_gpu: list[tuple[float, float]] = []
    events = 0
    for e in _events(path, on_read):
        if "" in e:
            header = e[""] if isinstance(e[""], dict) else {}
            continue
        events += 1
        cat = e.get("cat")
        if not isinstance(cat, str):
            continue
        categories[cat] = categories.get(cat, 0) + 1
        name = e.get("name")
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(name, str) or not isinstance(ts, (int, float)):
            continue
        dur = float(dur) if isinstance(dur, (int, float)) and dur > 0 else 0.0
        if cat in ("user_annotation", "cpu_op") and name.startswith(STEP_PREFIX):
            number = _number(name)
            if number is not None:
                steps.append((number, float(ts), dur))
        elif cat in GPU_CATEGORIES:
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            device = args.get("device", 0) if isinstance(args, dict) else 0
            gpu = gpus.setdefault(int(device) if isinstance(device, (int, float)) else 0, _Gpu())
            gpu.intervals.append((float(ts), float(ts) + dur, cat, name))
            gpu.busy_us += dur
        elif cat in ("cuda_runtime", "cuda_driver"):
            runtime.append((float(ts), dur, name))
        elif cat == "cuda_sync":
            syncs_gpu.append((float(ts), dur))
    if not any(c in KINETO_CATEGORIES for c in categories):
        raise TraceError(
            f"{path}: a trace of another tool: no torch.profiler events (cpu_op, kernel, "
            "cuda_runtime)"
        )
    main = max(gpus, key=lambda d: gpus[d].busy_us) if gpus else None
    intervals = sorted(gpus[main].intervals) if main is not None else []
    spans = [(s, e) for s, e, _, _ in intervals]
    starts = [s for s, _ in spans]
    longest = max((e - s for s, e in spans), default=0.0)
    # Everything but NCCL: the busy time it leaves uncovered is communication exposed.
    others = [(s, e) for s, e, cat, name in intervals if not _is_nccl(cat, name)]
    others_starts = [s for s, _ in others]
    runtime.sort()
    run_starts = [t for t, _, _ in runtime]
    steps.sort(key=lambda s: s[1])
    out = []
    for number, start, dur in steps:
        end = start + dur
        kinds: dict[str, float] = {"kernel": 0.0, "gpu_memcpy": 0.0, "gpu_memset": 0.0}
        nccl = pageable_us = 0.0
        pageable = kernels = 0
        # (an interval that began up to the longest's length before may reach into it)
        i = bisect.bisect_left(starts, start - longest)
        for a, b, cat, name in intervals[i:]:
            if a >= end:
                break
            part = min(b, end) - max(a, start)
            if part <= 0:
                continue
            kinds[cat] += part
            kernels += cat == "kernel"
            if _is_nccl(cat, name):
                nccl += part
            if cat == "gpu_memcpy" and "Pageable" in name:
                pageable += 1
                pageable_us += part
        launches = syncs = 0
        sync_us = launch_us = 0.0
        for t, d, name in runtime[bisect.bisect_left(run_starts, start) :]:
            if t >= end:
                break
            if name in LAUNCH_CALLS:
                launches += 1
                launch_us += d
            elif name in SYNC_CALLS:
                syncs += 1
                sync_us += d
        busy = _union(spans, start, end, starts, longest)
        exposed = busy - _union(others, start, end, others_starts, longest) if nccl else 0.0
        out.append(TraceStep(
            number=number, start_us=start, dur_us=dur, gpu_busy_us=busy,
            kernel_us=kinds["kernel"], copy_us=kinds["gpu_memcpy"], memset_us=kinds["gpu_memset"],
            nccl_us=nccl, exposed_nccl_us=max(0.0, exposed), kernels=kernels,
            launches=launches, launch_us=launch_us, syncs=syncs, sync_us=sync_us,
            pageable_copies=pageable, pageable_copy_us=pageable_us,
        ))  # fmt: skip
    dist = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    return TraceSummary(
        path=str(path),
        events=events,
        steps=tuple(out),
        device=_device(header, main),
        rank=_int(dist.get("rank")) if dist else None,
        world_size=_int(dist.get("world_size")) if dist else None,
        kernels=categories.get("kernel", 0),
        copies=categories.get("gpu_memcpy", 0),
        launches=sum(1 for _, _, n in runtime if n in LAUNCH_CALLS),
        syncs=sum(1 for _, _, n in runtime if n in SYNC_CALLS) + len(syncs_gpu),
        categories=categories,
    )


def _is_nccl(cat: str, name: str) -> bool:
    return cat == "kernel" and "nccl" in name.lower()


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _device(header: dict[str, Any], main: int | None) -> Device | None:
    if main is None:
        return None
    props = header.get("deviceProperties")
    for p in props if isinstance(props, list) else []:
        if isinstance(p, dict) and _int(p.get("id")) == main:
            major, minor = p.get("computeMajor"), p.get("computeMinor")
            cc = f"{major}.{minor}" if major is not None and minor is not None else None
            name = p.get("name")
            return Device(main, name if isinstance(name, str) else None, cc,
                          _int(p.get("totalGlobalMem")))  # fmt: skip
    return Device(main)
