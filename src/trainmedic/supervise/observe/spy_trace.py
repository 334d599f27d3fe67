"""What py-spy's samples of a training process say about its waits for data.

The supervisor samples each training process from outside
(:mod:`trainmedic.supervise.observe.outside_stacks`) with ``py-spy record
--nonblocking --idle --threads --format chrometrace``: every thread's stack at
a fixed rate, read from the process's memory without stopping it and without
any thread of the job waking. The trace holds, per thread, a ``B`` event for
each frame pushed and an ``E`` for each popped between two samples, stamped
in microseconds; identical samples in a row leave no event. So the trace is a
timeline of stacks, and all threads' stacks can be read at the same moment.

From it, this module counts what the in-process sampler
(:mod:`trainmedic.probe.sampling`) counts, the same way: at each moment the
training thread waits inside a DataLoader's ``__next__`` (the probe's
:data:`WAIT_FUNCTION` is on its stack), its
stack and the pin-memory threads' stacks are classified
(:func:`trainmedic.probe.stacks.classify_for_role`, roles ``main`` and
``pin``) into a :class:`~trainmedic.record.types.LoaderActivity`. A stretch
between two changes counts as many samples as the rate puts in it.

Only Python frames are in the trace, as in the probe; the call an innermost
frame is making (the probe reads it from the frame's instruction) is read here
from the source line: the last call on it (:func:`callees_on_line`).
"""

from __future__ import annotations

import dis
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType

from trainmedic.probe.frames import FrameInfo, callee_names
from trainmedic.probe.stacks import (
    FLUSH_S,
    MAX_FRAMES,
    ActivityAggregate,
    classify_for_role,
    frame_key,
)
from trainmedic.record.types import LoaderActivity

WRAPPER_FILE = "/trainmedic/probe/torch_hooks.py"
"""The file of the probe's DataLoader wrapper, as the end of a full path."""
WAIT_FUNCTION = "wait_for_batch"
"""The probe's function that calls the DataLoader's own ``__next__`` for the training
thread (:func:`trainmedic.probe.torch_hooks.wait_for_batch`): a stack with it waits for
a batch. Other threads go past the wrapper without it."""
_PIN_LOOP = "_pin_memory_loop"
_SOURCE_MAX_BYTES = 4 * 1024 * 1024
"""A source file larger than this is not read for callee names."""


@dataclass
class ThreadTimeline:
    """One thread's stacks over a window.

    Attributes:
        native_id: the kernel's thread id (from py-spy's thread name), 0 when unknown.
        name: the thread's Python name.
        changes: ``(microseconds, stack)``: from that moment the thread's stack,
            innermost first (empty: none seen).
    """

    native_id: int
    name: str
    changes: list[tuple[float, tuple[FrameInfo, ...]]] = field(default_factory=list)


def _function(name: str) -> str:
    """The code's own name from py-spy's qualified one (``Loader.__next__`` -> ``__next__``)."""
    return name.rsplit(".", 1)[-1] if "." in name and not name.endswith(">") else name


def _thread_name(name: str) -> tuple[int, str]:
    """``thread (4905): Thread-1`` -> ``(4905, "Thread-1")``."""
    head, _, rest = name.partition(")")
    number = head.partition("(")[2].strip()
    try:
        native = int(number, 16) if number.startswith("0x") else int(number)
    except ValueError:
        native = 0
    return native, rest.lstrip(":").strip()


def parse_chrometrace(events: object) -> dict[int, ThreadTimeline]:
    """The threads' timelines in py-spy's chrometrace output (a JSON list), by the
    trace's thread id; events that are not py-spy's frame pushes and pops are passed
    over, so a malformed trace yields what it holds that is well formed."""
    if not isinstance(events, list):
        return {}
    open_frames: dict[int, list[FrameInfo]] = {}
    threads: dict[int, ThreadTimeline] = {}
    last_ts: dict[int, float] = {}
    for ev in events:
        if not isinstance(ev, dict):
            continue
        ph, tid, ts, name = ev.get("ph"), ev.get("tid"), ev.get("ts"), ev.get("name")
        if ph not in ("B", "E") or not isinstance(tid, int) or not isinstance(name, str):
            continue
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            continue
        args = ev.get("args")
        if not isinstance(args, dict):
            args = {}
        raw_file, raw_line = args.get("filename"), args.get("line")
        filename = raw_file if isinstance(raw_file, str) else ""
        line = raw_line if isinstance(raw_line, int) and not isinstance(raw_line, bool) else 0
        stack = open_frames.setdefault(tid, [])
        thread = threads.get(tid)
        if thread is None:
            thread = threads[tid] = ThreadTimeline(0, "")
        if ph == "B":
            if not filename and name.startswith("thread ("):
                thread.native_id, thread.name = _thread_name(name)
                continue
            stack.append(FrameInfo(filename, line, _function(name)))
        elif stack:
            stack.pop()
        snapshot = tuple(reversed(stack))
        if last_ts.get(tid) == ts and thread.changes:
            thread.changes[-1] = (ts, snapshot)
        else:
            thread.changes.append((ts, snapshot))
        last_ts[tid] = ts
    return threads


def in_data_wait(stack: Sequence[FrameInfo]) -> bool:
    """Whether a stack (innermost first) waits inside the wrapped ``__next__``."""
    for i, frame in enumerate(stack):
        if frame.function == WAIT_FUNCTION and frame.path.endswith(WRAPPER_FILE):
            return i > 0
    return False


def _is_pin(stack: Sequence[FrameInfo]) -> bool:
    return any(f.function == _PIN_LOOP for f in stack)


@dataclass
class WaitCounts:
    """What one window's samples held: the aggregate of the whole window and of each
    slice of it (``slices``: by the slice's number from the trace's start, every
    ``slice_s`` of :func:`count_waits`), and how many samples the training thread
    spent in a data wait and in all (``samples``)."""

    aggregate: ActivityAggregate
    wait_samples: int = 0
    samples: int = 0
    states: dict[str, int] = field(default_factory=dict)
    slices: dict[int, ActivityAggregate] = field(default_factory=dict)


def count_waits(
    threads: Mapping[int, ThreadTimeline],
    rate: float,
    training_native_id: int | None = None,
    slice_s: float = FLUSH_S,
) -> WaitCounts:
    """Classify the moments the training thread waited for data.

    Args:
        rate: py-spy's samples a second: a stretch of ``d`` seconds between two
            changes counts ``round(d * rate)`` samples, at least one.
        training_native_id: the training thread; ``None``: every thread seen
            waiting in :data:`WAIT_FUNCTION` (only the training thread calls it).
        slice_s: seconds of trace each slice's aggregate covers: as often as the probe's
            sampler sends its counts, so that the diagnosis can still tell the samples of
            a stall from those of the waits around it.
    """
    out = WaitCounts(ActivityAggregate())
    moments = sorted({ts for t in threads.values() for ts, _ in t.changes})
    if not moments:
        return out
    step_us = 1e6 / rate
    cursor = {tid: -1 for tid in threads}
    current: dict[int, tuple[FrameInfo, ...]] = {}
    for k, ts in enumerate(moments):
        for tid, thread in threads.items():
            i = cursor[tid]
            changes = thread.changes
            while i + 1 < len(changes) and changes[i + 1][0] <= ts:
                i += 1
            cursor[tid] = i
            if i >= 0:
                current[tid] = changes[i][1]
        span = (moments[k + 1] - ts) if k + 1 < len(moments) else step_us
        n = max(1, round(span / step_us))
        main: list[tuple[FrameInfo, ...]] = []
        pins: list[tuple[FrameInfo, ...]] = []
        for tid, stack in current.items():
            if not stack:
                continue
            thread = threads[tid]
            if training_native_id is not None and thread.native_id != training_native_id:
                if _is_pin(stack):
                    pins.append(stack)
                continue
            if in_data_wait(stack):
                main.append(stack)
            elif _is_pin(stack):
                pins.append(stack)
        out.samples += n
        if not main:
            continue
        out.wait_samples += n
        piece = out.slices.setdefault(int(ts / (slice_s * 1e6)), ActivityAggregate())
        for stack, role in [*((s, "main") for s in main), *((s, "pin") for s in pins)]:
            frames = _with_callee(stack[:MAX_FRAMES])
            state = classify_for_role(frames, role)
            key = frame_key(frames) if state != "idle" else None
            for agg in (out.aggregate, piece):
                agg.counts[state] += n
                if key is not None:
                    agg.frames[key] += n
            if role == "main":
                out.states[state] = out.states.get(state, 0) + n
    return out


def activities(
    counts: WaitCounts, started: float, ended: float, pid: int, slice_s: float = FLUSH_S
) -> list[LoaderActivity]:
    """The window's counts as the record's loader activity, a record per slice that saw
    a data wait, each stamped with its slice's end (Unix seconds: the window ran from
    ``started`` to ``ended``; the trace's clock starts with the window)."""
    out = []
    for number in sorted(counts.slices):
        t = min(ended, started + (number + 1) * slice_s)
        record = counts.slices[number].take(t, pid)
        if record is not None:
            out.append(record)
    return out


# --- the call an innermost frame makes, from its source ----------------------------------


def _with_callee(stack: Sequence[FrameInfo]) -> list[FrameInfo]:
    frames = list(stack)
    if frames and not frames[0].callees:
        leaf = frames[0]
        callees = callees_on_line(leaf.filename, leaf.lineno)
        if callees:
            frames[0] = FrameInfo(leaf.filename, leaf.lineno, leaf.function, callees)
    return frames


@functools.lru_cache(maxsize=4096)
def callees_on_line(filename: str, lineno: int) -> tuple[str, ...]:
    """The dotted name the last call on ``filename``'s line ``lineno`` calls
    (``("np", "load")``), or empty: what an innermost frame blocked in a C call is
    calling, as far as its source tells."""
    code = _compiled(filename)
    if code is None or lineno <= 0:
        return ()
    best: tuple[CodeType, int] | None = None
    for one in _codes(code):
        at: int | None = None
        for ins in dis.get_instructions(one):
            pos = getattr(ins, "positions", None)
            if pos is not None:
                at = pos.lineno
            elif ins.starts_line is not None:  # Python 3.10: lines only
                at = ins.starts_line
            if at == lineno and ins.opname.startswith("CALL"):
                best = (one, ins.offset)
        if best is not None:
            break
    return callee_names(*best) if best is not None else ()


@functools.lru_cache(maxsize=256)
def _compiled(filename: str) -> CodeType | None:
    try:
        if os.path.getsize(filename) > _SOURCE_MAX_BYTES:
            return None
        with open(filename, "rb") as f:
            source = f.read()
        return compile(source, filename, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
        return None


def _codes(code: CodeType) -> Iterable[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)
