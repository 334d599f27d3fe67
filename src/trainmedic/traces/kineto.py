"""A torch.profiler (Kineto) trace read into what the GPU did in each step.

A trace is a Chrome-trace JSON file (often gzipped) whose ``traceEvents``
hold, among others: ``ProfilerStep#N`` spans (``user_annotation``, older
traces ``cpu_op``), CUDA runtime calls on the host (``cuda_runtime``:
launches, copies, synchronisations, with their host duration), and the GPU's
own activity (``kernel``, ``gpu_memcpy`` such as ``Memcpy HtoD (Pageable ->
Device)``, ``gpu_memset``), each with ``args.device``; and at the top,
``deviceProperties`` and ``distributedInfo`` (rank, world size).

:func:`read_trace` streams the events (``ijson``'s C parser, one event at a
time) and returns a :class:`TraceSummary`. Memory grows with the GPU intervals
and the launch, synchronisation and allocation calls kept - 17 bytes each in
arrays, their names reduced to a kind - not with the file; a second pass reads
the Python frames and operators around the synchronisations inside steps, when
there are some. Per step, on the CPU window of its ``ProfilerStep`` span:

* GPU busy time: the union of kernel, copy and memset intervals on the main
  device (the one with the most GPU time), clipped to the window, over all
  streams - time when at least one stream worked;
* runtime calls started in the window: launches (:data:`LAUNCH_CALLS`),
  host-device synchronisations (:data:`SYNC_CALLS`) and the driver's memory
  calls (:data:`ALLOC_CALLS`, :data:`FREE_CALLS`), with the host time spent in
  them; after each synchronisation, the GPU's idle time until its next work;
* copies: their time, and the pageable ones (host memory not pinned, so the
  copy is staged and synchronous);
* NCCL kernels' time.

Over the trace: where the synchronisations inside steps were called from
(:class:`SyncSite`: the user's innermost Python frame and what it called, with
``with_stack=True``; else the operator), and the caching allocator's peaks
(``[memory]`` events, with ``profile_memory=True``).

A file that is not JSON, a truncated gzip, a JSON file without trace events,
or a trace of another tool (no Kineto event categories) raises
:class:`TraceError` with one line saying which.

Why one module of this length: one streaming pass over the events fills every
per-step table at once; split by table, each part would need the stream again (a
second pass costs as much as the first on a multi-GB trace).
"""

from __future__ import annotations

import bisect
import gzip
import io
import re
import statistics
import sys
from array import array
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
DATA_PREFIX = "enumerate(DataLoader)"
"""The span torch.profiler records around each ``next()`` on a DataLoader iterator."""
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
ALLOC_CALLS = frozenset(
    {"cudaMalloc", "cudaMallocManaged", "cudaMallocHost", "cudaHostAlloc", "cuMemAlloc",
     "cuMemAlloc_v2", "cuMemCreate", "cuMemMap", "cudaMallocAsync"}
)  # fmt: skip
"""Runtime calls that get device (or pinned) memory from the driver: the caching
allocator's misses."""
FREE_CALLS = frozenset(
    {"cudaFree", "cudaFreeHost", "cuMemFree", "cuMemFree_v2", "cuMemRelease", "cuMemUnmap",
     "cudaFreeAsync"}
)  # fmt: skip
"""Runtime calls that give memory back (``cudaFree`` synchronises the whole device)."""
LIBRARY_PACKAGES = frozenset(
    {"torch", "torchvision", "torchaudio", "torchtext", "numpy", "lightning",
     "pytorch_lightning", "transformers", "accelerate", "deepspeed", "apex", "timm",
     "fairscale", "composer", "datasets", "triton", "functorch", "einops", "tqdm",
     "trainmedic"}
)  # fmt: skip
"""Top-level packages whose frames are library code around a user's call (trainmedic's
own: the probe's hooks are on the stack in a window it recorded)."""
MAX_SITES = 5
"""Synchronisation call sites kept, the costliest first."""
_FRAME = re.compile(r"^(.+?)\((\d+)\): (.+)$")
_BUILTIN = re.compile(r"^<built-in (?:method|function) (\w+)(?: of (\w+) object)?")
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
        gpu_idle_after_sync_us: the GPU's idle time from each synchronisation's return to
            its next work: the drained GPU waiting for the host.
        allocs / alloc_us, frees / free_us: calls to the driver for memory and to give it
            back (``cudaMalloc``, ``cudaFree``), and the host's time in them.
        pageable_copies / pageable_copy_us: copies from or to pageable host memory.
        data_us: the host's time in ``next()`` on a DataLoader (``enumerate(DataLoader)``
            spans) in the window: the wait for the next batch.
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
    gpu_idle_after_sync_us: float = 0.0
    allocs: int = 0
    alloc_us: float = 0.0
    frees: int = 0
    free_us: float = 0.0
    pageable_copies: int = 0
    pageable_copy_us: float = 0.0
    data_us: float = 0.0

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
class SyncSite:
    """Where synchronisations inside steps were called from, and what they cost.

    Attributes:
        where: the innermost frame of the user's code around them, as the trace names it
            (``train.py(42): train_step``: the file, the line where that function
            starts, its name; ``None``: the trace has no Python frames).
        call: what that code called (``Tensor.item``, ``torch.cuda.synchronize``), else
            the outermost operator around them (``aten::item``); ``None``: neither.
        runtime: the runtime call that blocked (``cudaStreamSynchronize``).
        count: synchronisations from there.
        host_us: the host's time blocked in them, microseconds.
        gpu_idle_us: the GPU's idle time after them until its next work, microseconds.
    """

    where: str | None
    call: str | None
    runtime: str
    count: int
    host_us: float
    gpu_idle_us: float


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
        sync_sites: where the synchronisations inside steps came from, costliest first.
        with_stack: the trace holds Python frames (recorded with ``with_stack=True``).
        peak_allocated_bytes / peak_reserved_bytes: the most the caching allocator had
            handed out and held on a CUDA device (``[memory]`` events, recorded with
            ``profile_memory=True``; ``None``: none).
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
    sync_sites: tuple[SyncSite, ...] = ()
    with_stack: bool = False
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None

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


class _Gpu:
    """One device's GPU intervals, compact: 17 bytes each, the name reduced to its kind."""

    __slots__ = ("busy_us", "codes", "ends", "starts")

    def __init__(self) -> None:
        self.starts = array("d")
        self.ends = array("d")
        self.codes = array("B")
        self.busy_us = 0.0

    def add(self, ts: float, dur: float, cat: str, name: str) -> None:
        code = _KIND_CODE[cat]
        if cat == "kernel" and "nccl" in name.lower():
            code |= _NCCL
        elif cat == "gpu_memcpy" and "Pageable" in name:
            code |= _PAGEABLE
        self.starts.append(ts)
        self.ends.append(ts + dur)
        self.codes.append(code)
        self.busy_us += dur

    def sorted(self) -> _Gpu:
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        out = _Gpu()
        out.starts = array("d", (self.starts[i] for i in order))
        out.ends = array("d", (self.ends[i] for i in order))
        out.codes = array("B", (self.codes[i] for i in order))
        out.busy_us = self.busy_us
        return out


_KIND_CODE = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}
_KIND_MASK = 3
_NCCL = 4
_PAGEABLE = 8
_LAUNCH, _SYNC, _ALLOC, _FREE = 0, 1, 2, 3


def _runtime_kind(name: str) -> int | None:
    if name in LAUNCH_CALLS:
        return _LAUNCH
    if name in SYNC_CALLS:
        return _SYNC
    if name in ALLOC_CALLS:
        return _ALLOC
    if name in FREE_CALLS:
        return _FREE
    return None


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
    loading: list[tuple[float, float]] = []
    gpus: dict[int, _Gpu] = {}
    run_ts, run_dur, run_kind = array("d"), array("d"), array("B")
    sync_calls: list[tuple[float, float, int, str]] = []
    syncs_gpu = 0
    peak_allocated = peak_reserved = None
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
        elif cat in ("user_annotation", "cpu_op") and name.startswith(DATA_PREFIX):
            loading.append((float(ts), float(ts) + dur))
        elif cat in GPU_CATEGORIES:
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            device = args.get("device", 0) if isinstance(args, dict) else 0
            gpu = gpus.setdefault(int(device) if isinstance(device, (int, float)) else 0, _Gpu())
            gpu.add(float(ts), dur, cat, name)
        elif cat in ("cuda_runtime", "cuda_driver"):
            kind = _runtime_kind(name)
            if kind is not None:
                run_ts.append(float(ts))
                run_dur.append(dur)
                run_kind.append(kind)
                if kind == _SYNC:
                    sync_calls.append((float(ts), dur, _tid(e), name))
        elif cat == "cuda_sync":
            syncs_gpu += 1
        elif name == "[memory]":
            allocated, reserved = _cuda_memory(e)
            if allocated is not None:
                peak_allocated = max(peak_allocated or 0, allocated)
            if reserved is not None:
                peak_reserved = max(peak_reserved or 0, reserved)
    if not any(c in KINETO_CATEGORIES for c in categories):
        raise TraceError(
            f"{path}: a trace of another tool: no torch.profiler events (cpu_op, kernel, "
            "cuda_runtime)"
        )
    main = max(gpus, key=lambda d: gpus[d].busy_us) if gpus else None
    gpu = gpus[main].sorted() if main is not None else _Gpu()
    gpus.clear()
    starts, ends, codes = gpu.starts, gpu.ends, gpu.codes
    spans = _Spans(starts, ends)
    loading.sort()
    data = _Spans(array("d", (a for a, _ in loading)), array("d", (b for _, b in loading)))
    # Everything but NCCL: the busy time it leaves uncovered is communication exposed.
    keep = [i for i in range(len(starts)) if not codes[i] & _NCCL]
    others = _Spans(array("d", (starts[i] for i in keep)), array("d", (ends[i] for i in keep)))
    del keep
    order = sorted(range(len(run_ts)), key=run_ts.__getitem__)
    run_ts = array("d", (run_ts[i] for i in order))
    run_dur = array("d", (run_dur[i] for i in order))
    run_kind = array("B", (run_kind[i] for i in order))
    del order
    steps.sort(key=lambda s: s[1])
    sync_calls.sort()
    windows = _Windows(steps)
    # Each synchronisation inside a step, with (its step, the GPU's idle time after it).
    in_steps, idles = [], []
    for c in sync_calls:
        got = windows.idle_after(c[0], c[1], spans)
        if got is not None:
            in_steps.append(c)
            idles.append(got)
    sync_idle: dict[int, float] = {}
    for number, idle in idles:
        sync_idle[number] = sync_idle.get(number, 0.0) + idle
    sites: tuple[SyncSite, ...] = ()
    stacks = bool(categories.get("python_function"))
    if in_steps and (stacks or categories.get("cpu_op")):
        sites = _sync_sites(path, in_steps, [idle for _, idle in idles])
    out = []
    for number, start, dur in steps:
        end = start + dur
        kinds = [0.0, 0.0, 0.0]
        nccl = pageable_us = 0.0
        pageable = kernels = 0
        # (an interval that began up to the longest's length before may reach into it)
        for i in range(bisect.bisect_left(starts, start - spans.longest), len(starts)):
            a, b, code = starts[i], ends[i], codes[i]
            if a >= end:
                break
            part = min(b, end) - max(a, start)
            if part <= 0:
                continue
            kind = code & _KIND_MASK
            kinds[kind] += part
            kernels += kind == 0
            if code & _NCCL:
                nccl += part
            if code & _PAGEABLE:
                pageable += 1
                pageable_us += part
        counts = [0, 0, 0, 0]
        times = [0.0, 0.0, 0.0, 0.0]
        for i in range(bisect.bisect_left(run_ts, start), len(run_ts)):
            if run_ts[i] >= end:
                break
            counts[run_kind[i]] += 1
            times[run_kind[i]] += run_dur[i]
        busy = spans.union(start, end)
        exposed = busy - others.union(start, end) if nccl else 0.0
        out.append(TraceStep(
            number=number, start_us=start, dur_us=dur, gpu_busy_us=busy,
            kernel_us=kinds[0], copy_us=kinds[1], memset_us=kinds[2],
            nccl_us=nccl, exposed_nccl_us=max(0.0, exposed), kernels=kernels,
            launches=counts[_LAUNCH], launch_us=times[_LAUNCH],
            syncs=counts[_SYNC], sync_us=times[_SYNC],
            gpu_idle_after_sync_us=sync_idle.get(number, 0.0),
            allocs=counts[_ALLOC], alloc_us=times[_ALLOC],
            frees=counts[_FREE], free_us=times[_FREE],
            pageable_copies=pageable, pageable_copy_us=pageable_us,
            data_us=data.union(start, end),
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
        launches=run_kind.count(_LAUNCH),
        syncs=run_kind.count(_SYNC) + syncs_gpu,
        categories=categories,
        sync_sites=sites,
        with_stack=stacks,
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
    )


class _Spans:
    """Sorted intervals (``starts``, ``ends``), for the time they cover in a window."""

    def __init__(self, starts: array[float], ends: array[float]) -> None:
        self.starts = starts
        self.ends = ends
        self.longest = max((b - a for a, b in zip(starts, ends, strict=True)), default=0.0)

    def union(self, lo: float, hi: float) -> float:
        """Time covered by the intervals within [lo, hi), microseconds."""
        covered = 0.0
        cur_s = cur_e = None
        starts, ends = self.starts, self.ends
        for i in range(bisect.bisect_left(starts, lo - self.longest), len(starts)):
            s, e = starts[i], ends[i]
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

    def next_start(self, t: float) -> float | None:
        """The first interval start at or after ``t`` (``None``: none)."""
        i = bisect.bisect_left(self.starts, t)
        return self.starts[i] if i < len(self.starts) else None


class _Windows:
    """The steps' CPU windows, sorted by start, for the step holding a moment."""

    def __init__(self, steps: list[tuple[int, float, float]]) -> None:
        self.numbers = [n for n, _, _ in steps]
        self.starts = [s for _, s, _ in steps]
        self.ends = [s + d for _, s, d in steps]

    def at(self, t: float) -> int | None:
        """The index of the step whose window holds time ``t``."""
        i = bisect.bisect_right(self.starts, t) - 1
        return i if i >= 0 and t < self.ends[i] else None

    def idle_after(self, ts: float, dur: float, spans: _Spans) -> tuple[int, float] | None:
        """(the step, the GPU's idle time from a synchronisation's return to its next
        work within the step, microseconds); ``None``: not inside a step."""
        i = self.at(ts)
        if i is None:
            return None
        back = ts + dur
        nxt = spans.next_start(back)
        hi = self.ends[i] if nxt is None else min(nxt, self.ends[i])
        idle = (hi - back) - spans.union(back, hi) if hi > back else 0.0
        return self.numbers[i], idle


def _sync_sites(
    path: Path,
    syncs: list[tuple[float, float, int, str]],
    idles: list[float],
) -> tuple[SyncSite, ...]:
    """The call sites of the synchronisations inside steps (with the GPU's idle time
    after each, ``idles``), from a second pass over the events: the Python frames
    (``with_stack=True``) and operators around each."""
    by_tid: dict[int, list[int]] = {}
    for i, (_, _, tid, _) in enumerate(syncs):
        by_tid.setdefault(tid, []).append(i)
    starts = {tid: [syncs[i][0] for i in idx] for tid, idx in by_tid.items()}
    frames: list[list[tuple[float, str, str]]] = [[] for _ in syncs]
    for e in _events(path, None):
        cat = e.get("cat")
        if cat not in ("python_function", "cpu_op"):
            continue
        idx = by_tid.get(_tid(e))
        ts, dur, name = e.get("ts"), e.get("dur"), e.get("name")
        if idx is None or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        if not isinstance(name, str) or name.startswith(STEP_PREFIX):
            continue
        end = ts + dur
        tid_starts = starts[_tid(e)]
        for j in range(bisect.bisect_left(tid_starts, ts), len(tid_starts)):
            k = idx[j]
            s_ts, s_dur = syncs[k][0], syncs[k][1]
            if s_ts > end:
                break
            if s_ts + s_dur <= end:
                frames[k].append((float(dur), cat, name))
    sites: dict[tuple[str | None, str | None, str], list[float]] = {}
    for (_, dur, _, call), around, idle in zip(syncs, frames, idles, strict=True):
        where, what = _call_site(around)
        agg = sites.setdefault((where, what, call), [0, 0.0, 0.0])
        agg[0] += 1
        agg[1] += dur
        agg[2] += idle
    ranked = sorted(sites.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
    return tuple(
        SyncSite(where=w, call=c, runtime=r, count=int(a[0]), host_us=a[1], gpu_idle_us=a[2])
        for (w, c, r), a in ranked[:MAX_SITES]
    )


def _call_site(around: list[tuple[float, str, str]]) -> tuple[str | None, str | None]:
    """(the innermost frame of the user's code, what it called) from the frames and
    operators that enclose one synchronisation (their durations, categories, names)."""
    python = sorted((f for f in around if f[1] == "python_function"), key=lambda f: -f[0])
    user = [i for i, f in enumerate(python) if not _is_library(f[2])]
    where = python[user[-1]][2] if user else None
    what = None
    if user and user[-1] + 1 < len(python):
        what = _callee(python[user[-1] + 1][2])
    if what is None:
        ops = sorted((f for f in around if f[1] == "cpu_op"), key=lambda f: -f[0])
        what = ops[0][2] if ops else None
    return where, what


def _callee(frame: str) -> str:
    """A frame's name as the user called it: ``<built-in method item of Tensor object at
    0x..>`` -> ``Tensor.item``; ``torch/cuda/__init__.py(954): synchronize`` ->
    ``torch.cuda.synchronize``."""
    m = _BUILTIN.match(frame)
    if m:
        return f"{m.group(2)}.{m.group(1)}" if m.group(2) else m.group(1)
    m = _FRAME.match(frame)
    if m:
        module = m.group(1).removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        return f"{module}.{m.group(3)}"
    return frame


def _is_library(frame: str) -> bool:
    """Whether a ``python_function`` frame is library code, not the user's: a built-in, a
    module of the standard library, or a package that trains (torch and its ecosystem)."""
    if frame.startswith("<"):
        return True
    m = _FRAME.match(frame)
    if not m:
        return True
    path = m.group(1)
    if "site-packages/" in path or "dist-packages/" in path:
        return True
    top = path.split("/", 1)[0].removesuffix(".py")
    return top in sys.stdlib_module_names or top in LIBRARY_PACKAGES


def _tid(e: dict[str, Any]) -> int:
    tid = e.get("tid")
    return int(tid) if isinstance(tid, (int, float)) else hash(str(tid))


def _cuda_memory(e: dict[str, Any]) -> tuple[int | None, int | None]:
    """(allocated, reserved) bytes of a ``[memory]`` event on a CUDA device (type 1)."""
    args = e.get("args")
    if not isinstance(args, dict) or args.get("Device Type") != 1:
        return None, None
    return _int(args.get("Total Allocated")), _int(args.get("Total Reserved"))


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
