"""What the heartbeat says about the training thread: where it is parked, and
whether Python code is running.

The probe's thread calls :meth:`ThreadSamples.sample` a few times a second
(each pass of its loop) and the heartbeat takes the totals once a second. A
sample asks one question the frames alone cannot answer: is Python code
running? The probe's thread gives up the interpreter lock for an instant
(``time.sleep(0)``) and times how long it takes to get it back: a thread
executing bytecode holds it until the interpreter's switch interval (5 ms)
forces a hand-over, while a thread parked in a native call (a torch op, a
read, a lock) released it and lets it go at once. That tells a Python loop
spinning in place from a long native computation, whatever the Python
version's habits about where a running thread yields.

:func:`describe_frame` gives the innermost frames with their modules, what
the innermost frame is calling and the instruction it stands at: what the
supervisor's silence classifier needs (:mod:`trainmedic.resilience.places`).
Everything here runs on the probe's thread only.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType

HEARTBEAT_MIN_SAMPLES = 3
"""Every heartbeat rests on at least this many samples. The probe's thread samples
only in passes that saw no progress, so the first heartbeat of a silence would
otherwise carry none, and the supervisor could not tell a Python loop spinning at
``x += 1`` from a native op (``a @ b``) there: it counted that second as work and
declared the hang a second or two late. One sample alone misreads a loaded
machine (the spinning thread off its core at that instant); three rarely all do."""
GIL_BUSY_S = 0.002
"""Getting the interpreter lock back takes at least this long while another
thread runs Python code (the switch interval is 5 ms); a free lock takes
microseconds."""
_OPS: dict[CodeType, tuple[list[int], list[str]]] = {}
_OPS_MAX = 4096


class ThreadSamples:
    """Counts of samples of one thread between two heartbeats."""

    def __init__(self) -> None:
        self.samples = 0
        self.gil_busy = 0

    def sample(self) -> None:
        """One sample: does running Python code hold the interpreter lock?"""
        t0 = time.perf_counter()
        time.sleep(0)
        waited = time.perf_counter() - t0
        self.samples += 1
        if waited >= GIL_BUSY_S:
            self.gil_busy += 1

    def top_up(self, least: int) -> None:
        """Sample until at least ``least`` samples count towards the next heartbeat."""
        while self.samples < least:
            self.sample()

    def take(self) -> tuple[int, int]:
        """``(samples, gil_busy)`` since the last call, and start counting anew."""
        counts = (self.samples, self.gil_busy)
        self.samples = 0
        self.gil_busy = 0
        return counts


def describe_frame(
    frame: FrameType | None, limit: int, shorten: Callable[[str], str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], str]:
    """``(frames, modules, calls, op)`` of the stack from ``frame`` outwards:
    ``"file:line function"`` and the module of at most ``limit`` frames,
    innermost first; what the innermost frame calls; its instruction."""
    from trainmedic.probe.frames import callee_names

    frames: list[str] = []
    modules: list[str] = []
    calls: tuple[str, ...] = ()
    op = ""
    f = frame
    while f is not None and len(frames) < limit:
        code = f.f_code
        if not frames:
            offset = _instruction_at(code, f.f_lasti)
            op = _op_at(code, offset)
            calls = callee_names(code, offset)
        frames.append(f"{shorten(code.co_filename)}:{f.f_lineno} {code.co_name}")
        name = f.f_globals.get("__name__", "")
        modules.append(name if isinstance(name, str) else "")
        f = f.f_back
    del f
    return tuple(frames), tuple(modules), calls, op


def _table(code: CodeType) -> tuple[list[int], list[str]]:
    table = _OPS.get(code)
    if table is None:
        import dis

        if len(_OPS) >= _OPS_MAX:
            _OPS.clear()
        instructions = list(dis.get_instructions(code))
        table = _OPS[code] = ([i.offset for i in instructions], [i.opname for i in instructions])
    return table


def _instruction_at(code: CodeType, lasti: int) -> int:
    """The start of the instruction ``lasti`` falls in (3.11+ points a frame that
    calls Python code into its call's inline caches)."""
    import bisect

    offsets, _ = _table(code)
    i = bisect.bisect_right(offsets, lasti) - 1
    return offsets[i] if i >= 0 else lasti


def _op_at(code: CodeType, offset: int) -> str:
    import bisect

    offsets, names = _table(code)
    i = bisect.bisect_left(offsets, offset)
    return names[i] if i < len(offsets) and offsets[i] == offset else ""


def main_frame(ident: int | None) -> FrameType | None:
    """The current frame of thread ``ident``."""
    return sys._current_frames().get(ident) if ident is not None else None
