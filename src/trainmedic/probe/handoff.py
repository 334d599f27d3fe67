"""Following the training thread's wait to the threads and processes doing the work.

A loop without a DataLoader often hands the batch building to others: a
``ThreadPoolExecutor`` whose futures it waits on, a prefetch thread filling a
``queue.Queue``, producer processes behind a ``multiprocessing.Queue``, an
asyncio loop in a thread of its own. Its own stack then only shows the wait
(:func:`trainmedic.probe.host_states.waits_on_others`); what the wait costs
is decided by what the others do. While the training thread waits so, every
sample also looks at them (:class:`HelperSampler`):

* the other Python threads of the process: their stacks (:func:`classify_helper`)
  and, where a stack alone cannot tell computing in Python from a native call
  or an I/O call made from C, their kernel state
  (:mod:`trainmedic.host.threadstate`);
* the main thread of each child process: its kernel state only (the probe in
  a child does not sample its own stacks unless it is a DataLoader worker).

Each observation is one of :data:`HELPER_STATES`:

* ``socket`` / ``file`` - waiting on the network / on storage;
* ``python`` - running Python code: it holds the interpreter lock whenever it
  runs, so threads in this state add no cores;
* ``cpu`` - on a CPU in native code (the lock released), or a process computing;
* ``idle`` - waiting for work (a pool thread with nothing queued, a producer on
  a full queue);
* ``poll`` - an event loop waiting on its descriptors (its requests in flight);
* ``wait`` - blocked on something else (a lock, a pipe, a sleep).

Cost: nothing while the training thread is not waiting on others; then a few
µs per helper thread (its stack's classification is cached) and about 30 µs
for each kernel state read, at most :data:`MAX_THREADS` threads,
:data:`MAX_KERNEL_READS` thread kernel states and :data:`MAX_CHILDREN`
children per sample (docs/performance.md).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from trainmedic.host.threadstate import (
    POLL_CALLS,
    KernelState,
    child_pids,
    connection_count,
    kernel_class,
    read_kernel_state,
)
from trainmedic.probe.frames import FrameInfo
from trainmedic.probe.stacks import classify

HELPER_STATES = ("socket", "file", "python", "cpu", "idle", "poll", "wait")
WAITS = "waits"
"""Key of the count of training-thread samples that waited on others."""
IN_FLIGHT = "in_flight"
"""Key of the requests in flight summed over the observations waiting on I/O."""
IO_STATES = ("socket", "file")
THREAD_PREFIX = "thread:"
PROCESS_PREFIX = "process:"
MAX_THREADS = 16
"""Helper threads looked at per sample (the rest in later samples, in turn)."""
MAX_CHILDREN = 8
"""Child processes looked at per sample."""
MAX_KERNEL_READS = 4
"""Kernel states of helper threads read per sample: a thread whose stack needs one and
was read before keeps its last reading in the other samples (each read costs ~30 µs)."""
REFRESH_S = 1.0
"""Seconds between two listings of the threads' ids and of the child processes."""
OWN_THREADS = frozenset({"trainmedic-probe", "trainmedic-stacks"})

# Stack states a kernel reading refines: a C call made from Python (a native
# computation, or I/O the frames cannot name) and calls nothing recognises. Python
# code running bytecode is ``python`` from its stack alone: reading the kernel
# state lets go of the interpreter lock, so such a thread shows on a CPU then.
_AMBIGUOUS = frozenset({"native", "other"})
_POOL_RUN = "/concurrent/futures/thread.py"
_FROM_STACK = {"socket_wait": "socket", "file_read": "file", "idle": "idle", "transform": "python"}


def classify_helper(frames: Sequence[FrameInfo]) -> str:
    """The state of a helper thread's stack, innermost frame first: one of
    :data:`HELPER_STATES`, or - when only its kernel state can tell (:func:`refine`) -
    ``native`` (inside a call into C) or ``other``."""
    if not frames:
        return "wait"
    leaf = frames[0]
    if leaf.path.endswith("/selectors.py") and any("/asyncio/" in f.path for f in frames[1:4]):
        return "poll"  # an event loop waiting for its sockets (or timers) to be ready
    if leaf.callees and leaf.callees[-1] == "sleep":
        return "wait"
    if leaf.path.endswith(_POOL_RUN) and leaf.function == "run":
        return "native"  # a pool thread running a task that is a C function itself
    if leaf.path.endswith("/threading.py"):
        # Waiting on a condition: for work (a queue, a pool's work queue) or for another
        # thread; either way not working.
        return "idle" if classify(frames, "worker") == "idle" else "wait"
    state = classify(frames, "worker")
    if state == "transform" and leaf.callees:
        return "native"  # inside a call into C: computing there, or waiting
    return _FROM_STACK.get(state, "other")


def refine(stack_state: str, kernel: KernelState | None, sockets: bool = False) -> str:
    """One helper thread's state from its stack's and (when read) its kernel's;
    ``sockets``: the process holds network connections (a poll waits on them)."""
    if stack_state == "poll":
        return "socket" if sockets else "poll"
    if stack_state not in _AMBIGUOUS:
        return stack_state
    k = kernel_class(kernel) if kernel is not None else None
    if k == "running":
        return "cpu"  # native code on a CPU
    if k == "socket" or (k == "poll" and sockets):
        return "socket"
    if k in ("file", "disk"):
        return "file"
    if stack_state == "native":
        # Off a CPU in a call: waiting for the interpreter lock to come back (the
        # sampler holds it) counts as the Python work it is; other waits do not.
        return "python" if k in ("lock", None) else "wait"
    return "wait"


def process_state(kernel: KernelState | None, sockets: bool = False) -> str | None:
    """A child process's main thread, from its kernel state alone; ``sockets``: the
    process holds network connections (Python waits for a socket with a timeout in
    ``poll``)."""
    k = kernel_class(kernel) if kernel is not None else None
    if k is None:
        return None
    if k == "poll" and sockets:
        return "socket"
    return {
        "running": "cpu",
        "disk": "file",
        "file": "file",
        "socket": "socket",
        "poll": "poll",
        "lock": "idle",  # a producer on a full queue, a worker waiting for a task
        "child": "idle",
    }.get(k, "wait")


class HelperSampler:
    """Looks at the threads and child processes doing the training thread's work.

    Args:
        classify_stack: (frame, role) -> (state, frame key), the sampler's cache.
        read_kernel: (pid, tid) -> kernel state (:func:`read_kernel_state`; tests pass a fake).
        list_children: the child processes (:func:`child_pids`).
        threads: the live ``threading.Thread`` objects (:func:`threading.enumerate`).
        monotonic: the clock that paces the listings.
    """

    def __init__(
        self,
        classify_stack: Callable[[FrameType, str], tuple[str, str]],
        read_kernel: Callable[[int | str, int], KernelState | None] = read_kernel_state,
        list_children: Callable[[], list[int]] = child_pids,
        connections: Callable[[int | str], int] = connection_count,
        threads: Callable[[], list[threading.Thread]] = threading.enumerate,
        monotonic: Callable[[], float] | None = None,
        pid: int | None = None,
    ) -> None:
        import time

        self._classify = classify_stack
        self._read_kernel = read_kernel
        self._list_children = list_children
        self._count_connections = connections
        self._connections: dict[int | str, tuple[float, int]] = {}
        self._threads = threads
        self._monotonic = monotonic or time.monotonic
        self._pid: int | str = pid if pid is not None else "self"  # right after a fork too
        self._native: dict[int, int | None] = {}
        self._kernels: dict[int, KernelState | None] = {}
        self._own: set[int] = set()
        self._listed_at = -1e9
        self._children: list[int] = []
        self._children_at = -1e9
        self._turn = 0
        self.kernel_reads = 0

    def _refresh_threads(self) -> None:
        self._listed_at = self._monotonic()
        self._native.clear()
        self._kernels.clear()
        self._own.clear()
        for t in self._threads():
            if t.ident is None:
                continue
            self._native[t.ident] = t.native_id
            if t.name in OWN_THREADS:
                self._own.add(t.ident)

    def _connections_of(self, pid: int | str, now: float) -> int:
        known = self._connections.get(pid)
        if known is None or now - known[0] >= REFRESH_S:
            if len(self._connections) > 4 * MAX_CHILDREN:
                self._connections.clear()
            known = self._connections[pid] = (now, self._count_connections(pid))
        return known[1]

    def sample(
        self, frames: Mapping[int, FrameType], skip: frozenset[int] | set[int]
    ) -> tuple[Counter[str], Counter[str]]:
        """(observations by ``thread:<state>`` / ``process:<state>``, helper frame keys)
        of one moment: ``frames`` from ``sys._current_frames()``, ``skip`` the training
        and pin-memory threads."""
        now = self._monotonic()
        out: Counter[str] = Counter()
        keys: Counter[str] = Counter()
        reads = 0
        me = threading.get_ident()  # the sampler's own thread
        idents = [i for i in frames if i not in skip and i != me]
        if any(i not in self._native for i in idents) and now - self._listed_at >= REFRESH_S:
            self._refresh_threads()
        idents = [i for i in idents if i not in self._own]
        if len(idents) > MAX_THREADS:
            start = self._turn % len(idents)
            self._turn += MAX_THREADS
            idents = (idents[start:] + idents[:start])[:MAX_THREADS]
        for ident in idents:
            frame = frames.get(ident)
            if frame is None:
                continue
            stack_state, key = self._classify(frame, "helper")
            kernel = None
            if stack_state in _AMBIGUOUS:
                native = self._native.get(ident)
                known = self._kernels.get(ident)
                if native is not None and (reads < MAX_KERNEL_READS or known is None):
                    kernel = self._kernels[ident] = self._read_kernel(self._pid, native)
                    self.kernel_reads += 1
                    reads += 1
                else:
                    kernel = known
            polls = stack_state == "poll" or (kernel is not None and kernel.syscall in POLL_CALLS)
            connections = self._connections_of(self._pid, now) if polls else 0
            state = refine(stack_state, kernel, connections > 0)
            out[THREAD_PREFIX + state] += 1
            if state in IO_STATES:
                # One request in flight per thread blocked in I/O; an event loop polling
                # its connections may have one on each.
                out[IN_FLIGHT] += connections if polls else 1
            if state not in ("idle", "wait") and key:
                keys[key] += 1
        if now - self._children_at >= REFRESH_S:
            self._children_at = now
            self._children = self._list_children()[:MAX_CHILDREN]
        for child in self._children:
            kernel = self._read_kernel(child, child)
            self.kernel_reads += 1
            polls = kernel is not None and kernel.syscall in POLL_CALLS
            connections = self._connections_of(child, now) if polls else 0
            seen = process_state(kernel, connections > 0)
            if seen is not None:
                out[PROCESS_PREFIX + seen] += 1
                if seen in IO_STATES:
                    out[IN_FLIGHT] += 1
        return out, keys
