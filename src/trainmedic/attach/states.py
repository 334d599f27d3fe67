"""What each sampled stack was doing, named by the probe's own classifiers.

py-spy gives frames and lines, the probe's classifiers
(:mod:`trainmedic.probe.stacks`, :mod:`trainmedic.probe.host_states`,
:mod:`trainmedic.probe.handoff`) read frames with the call the innermost one
is making; this module turns the one into the other (the call is read from
the source line, :func:`calls`) so a stack seen from outside gets the state a
``trainmedic run`` would have given it from inside:

* DataLoader work (the training thread fetching with ``num_workers=0``, a
  worker's main thread): ``transform``, ``file_read``, ``socket_wait``,
  ``idle``, ``other``;
* the training thread outside the step in a loop without a DataLoader:
  ``sleep``, ``log``, ``sync``, ``file_write``, ``python``, ``other``, or a
  data state (``transform``, ``file_read``, ``socket_wait``, ``ipc_wait``);
* a thread or process that works for it (``ipc_wait``): ``socket``, ``file``,
  ``python``, ``native``, ``idle``, ``poll``, ``wait``.
"""

from __future__ import annotations

import ast
import linecache
from collections import Counter
from collections.abc import Callable, Iterable
from functools import lru_cache

from trainmedic.attach.spy import Frame, Stack
from trainmedic.probe.frames import FrameInfo
from trainmedic.probe.handoff import classify_helper
from trainmedic.probe.host_states import classify_outside
from trainmedic.probe.stacks import classify


@lru_cache(maxsize=4096)
def _line_calls(file: str, line: int) -> tuple[str, ...]:
    text = linecache.getline(file, line).strip()
    if not text:
        return ()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        try:  # the head of a block (``with open(p) as f:``), or the first line of several
            tree = ast.parse(text + "\n    pass" if text.endswith(":") else text + ")")
        except SyntaxError:
            return ()
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if not found:
        return ()
    # The innermost call of the line is the one a parked thread is in: ``np.frombuffer(
    # f.read())`` waits in ``read``. ast.walk goes outside in, so the last one found.
    func = found[-1].func
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return tuple(reversed(parts))


def calls(frame: Frame) -> tuple[str, ...]:
    """The dotted name the frame's line calls (``("lock", "acquire")``), read from the
    source: py-spy gives the line, not the call, and a thread parked in a C call shows
    the line that made it. Empty when the source cannot be read."""
    if not frame.line or not frame.file:
        return ()
    return _line_calls(frame.file, frame.line)


def frame_infos(stack: Stack) -> list[FrameInfo]:
    """``stack`` (innermost first) as the probe's classifiers read frames."""
    infos = [FrameInfo(f.file, f.line or 0, f.function) for f in stack]
    if infos:
        infos[0] = FrameInfo(stack[0].file, stack[0].line or 0, stack[0].function, calls(stack[0]))
    return infos


def loader_state(stack: Stack) -> str:
    """A DataLoader stack's state (the probe's ``worker`` role: waiting for work is ``idle``)."""
    return classify(frame_infos(stack), "worker")


def outside_state(stack: Stack) -> str:
    """The training thread's state outside the step, in a loop without a DataLoader."""
    return classify_outside(frame_infos(stack))


def helper_state(stack: Stack) -> str:
    """A thread's or process's state while the training thread waits on it."""
    return classify_helper(frame_infos(stack))


def tally(stacks: Iterable[tuple[Stack, int]], state_of: Callable[[Stack], str]) -> Counter[str]:
    """Samples by state: ``state_of`` names each stack, counts are its samples."""
    out: Counter[str] = Counter()
    for stack, n in stacks:
        out[state_of(stack)] += n
    return out
