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
  a child does not sample its own stacks unless it is a DataLoader worker);
* a process on this machine at the far end of the socket a helper waits on (a
  sample store, a feature server, a cache on 127.0.0.1 or a Unix socket;
  :mod:`trainmedic.host.peers`): whether its threads compute, read a disk or
  sleep, counted as ``server:<activity>`` with the threads it has on a CPU
  (:data:`SERVER_RUNNING`) and who it is (``peer:<pid> <command line>``). A
  server computing each answer is a CPU to add there, not requests in flight.
  A sampled thread that waits on a socket itself (the loop, a DataLoader
  worker) gets the same looks (:meth:`HelperSampler.own_server`).

Each observation is one of :data:`HELPER_STATES`:

* ``socket`` / ``file`` - waiting on the network / on storage;
* ``python`` - running Python code: it holds the interpreter lock whenever it
  runs, so threads in this state add no cores;
* ``cpu`` - on a CPU in native code (the lock released), or a process computing;
* ``idle`` - waiting for work (a pool thread with nothing queued, a producer on
  a full queue);
* ``poll`` - an event loop waiting on its descriptors (its requests in flight);
* ``wait`` - blocked on something else (a lock, a pipe, a sleep).

An event loop's thread is read from its selector: the descriptors registered
on it other than the loop's own wake-up socket are its requests in flight; a
loop with none registered waits on timers (``wait``), not the network - a job
holding TCP connections elsewhere (DDP's store) included. Its kernel state is
read too: a loop whose selector has returned still shows the selector on its
stack until it gets a CPU and the interpreter lock back (the sampler holds
the lock while it samples); it has callbacks to run, so it counts as
``python``.

Cost: nothing while the training thread is not waiting on others; then a few
µs per helper thread (its stack's classification is cached) and about 30 µs
for each kernel state read, at most :data:`MAX_THREADS` threads,
:data:`MAX_KERNEL_READS` thread kernel states and :data:`MAX_CHILDREN`
children per sample; a server's state costs a few µs a thread, and finding
who holds the far end of a socket a few ms, at most every
:data:`trainmedic.host.peers.SCAN_S` seconds (docs/performance.md).
"""

from __future__ import annotations

import os
import socket as _socket
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Protocol

from trainmedic.host.peers import LocalPeers, Peer, process_activity
from trainmedic.host.threadstate import (
    POLL_CALLS,
    KernelState,
    child_pids,
    connection_count,
    kernel_class,
    read_kernel_state,
)
from trainmedic.probe.frames import FrameInfo, threading_blocks
from trainmedic.probe.stacks import classify
from trainmedic.record.sample_states import (
    IN_FLIGHT,
    PEER_PREFIX,
    PROCESS_PREFIX,
    SERVER_PREFIX,
    SERVER_RUNNING,
    THREAD_PREFIX,
)

IO_STATES = ("socket", "file")
MAX_SERVERS = 2
"""Servers looked at per sample."""
MAX_LOOP_FDS = 16
"""Descriptors of an event loop's selector whose targets are read per sample."""
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
    if threading_blocks(frames):
        # Waiting on a condition: for work (a queue, a pool's work queue) or for another
        # thread; either way not working.
        return "idle" if classify(frames, "worker") == "idle" else "wait"
    state = classify(frames, "worker")
    if state == "transform" and leaf.callees:
        return "native"  # inside a call into C: computing there, or waiting
    return _FROM_STACK.get(state, "other")


def loop_descriptors(frame: FrameType | None) -> list[int] | None:
    """The descriptors registered on the selector an event loop's thread waits in, less
    the loop's own wake-up socket; ``None`` when the frames do not show one (``frame``:
    the thread's innermost frame, in ``selectors.py``)."""
    if frame is None or not frame.f_code.co_filename.endswith("/selectors.py"):
        return None
    selector = frame.f_locals.get("self")
    registered = getattr(selector, "_fd_to_key", None)
    if not isinstance(registered, dict):
        return None
    fds = list(registered)  # one call: the loop's thread may change it meanwhile
    outer = frame.f_back
    loop = outer.f_locals.get("self") if outer is not None else None
    wake = getattr(loop, "_ssock", None)
    try:
        own = wake.fileno() if wake is not None else -1
    except (OSError, AttributeError):
        own = -1
    return [fd for fd in fds if isinstance(fd, int) and fd != own]


def frame_socket(frame: FrameType | None, depth: int = 4) -> int | None:
    """The descriptor of the socket a thread's innermost frames work on: a local that is a
    ``socket.socket`` (SSL sockets too), or an attribute of a local - ``SocketIO._sock``
    under ``makefile`` readers and HTTP clients, a client object's ``sock`` - read from
    instance dictionaries only, so that no property or ``__getattr__`` of the job's runs."""
    f = frame
    for _ in range(depth):
        if f is None:
            return None
        for value in list(f.f_locals.values()):
            sock = _as_socket(value)
            if sock is None:
                try:
                    attrs = object.__getattribute__(value, "__dict__")
                except (AttributeError, TypeError):
                    continue
                if not isinstance(attrs, dict):
                    continue
                sock = next((s for s in map(_as_socket, list(attrs.values())) if s), None)
            if sock is not None:
                fd = sock.fileno()
                if fd >= 0:
                    return fd
        f = f.f_back
    return None


def _as_socket(value: object) -> _socket.socket | None:
    return value if isinstance(value, _socket.socket) else None


def refine(stack_state: str, kernel: KernelState | None, sockets: bool = False) -> str:
    """One helper thread's state from its stack's and (when read) its kernel's;
    ``sockets``: the process holds network connections (a poll waits on them)."""
    if stack_state == "poll":
        if _woken(kernel):
            return "python"
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


def _woken(kernel: KernelState | None) -> bool:
    """Whether an event loop's thread, its stack still in the selector, has left the
    system call: the selector returned and the thread waits for a CPU or for the
    interpreter lock (held by the sampler at this moment, or by another thread) to run
    the callbacks that are ready - Python work about to run, not a wait on timers or
    sockets."""
    return kernel is not None and kernel_class(kernel) in ("lock", "running")


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
        connections: a process's established TCP connections (:func:`connection_count`).
        threads: the live ``threading.Thread`` objects (:func:`threading.enumerate`).
        monotonic: the clock that paces the listings.
        pid: the process sampled (default: this one).
        peers: pid -> (socket inode -> the process at its far end), one
            :class:`~trainmedic.host.peers.LocalPeers` per process by default.
        activity: pid -> what a server does (:func:`~trainmedic.host.peers.process_activity`).
        fd_target: descriptor -> its link target in this process (an event loop's sockets).
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
        peers: Callable[[int | str], PeerFinder] | None = None,
        activity: Callable[[int], tuple[str, int] | None] = process_activity,
        fd_target: Callable[[int], str | None] | None = None,
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
        self._sockets: dict[int, str | None] = {}
        self._own: set[int] = set()
        self._listed_at = -1e9
        self._children: list[int] = []
        self._children_at = -1e9
        self._turn = 0
        self.kernel_reads = 0
        self._peer_finders: dict[int | str, PeerFinder] = {}
        self._make_peers = peers or self._local_peers
        self._activity = activity
        self._fd_target = fd_target or _fd_target

    def _local_peers(self, pid: int | str) -> PeerFinder:
        return LocalPeers(pid, monotonic=self._monotonic)

    def _finder(self, pid: int | str) -> PeerFinder:
        finder = self._peer_finders.get(pid)
        if finder is None:
            if len(self._peer_finders) > MAX_CHILDREN:
                self._peer_finders.clear()
            finder = self._peer_finders[pid] = self._make_peers(pid)
        return finder

    def _peer(self, pid: int | str, inode: str | None) -> Peer | None:
        return self._finder(pid).peer(inode) if inode is not None else None

    def _refresh_threads(self) -> None:
        self._listed_at = self._monotonic()
        self._native.clear()
        self._kernels.clear()
        self._sockets.clear()
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
        servers: dict[int, Peer] = {}
        for ident in idents:
            frame = frames.get(ident)
            if frame is None:
                continue
            stack_state, key = self._classify(frame, "helper")
            kernel = None
            native = self._native.get(ident)
            known = self._kernels.get(ident)
            if stack_state in _AMBIGUOUS or stack_state == "poll":
                if native is not None and (reads < MAX_KERNEL_READS or known is None):
                    kernel = self._kernels[ident] = self._read_kernel(self._pid, native)
                    self.kernel_reads += 1
                    reads += 1
                else:
                    kernel = known
            loop_fds = loop_descriptors(frame) if stack_state == "poll" else None
            if stack_state in ("socket", *_AMBIGUOUS) and ident not in self._sockets:
                # The socket a thread waits on, kept until the next listing (a fetch
                # thread keeps its connection): from its frames, else its system call.
                fd = frame_socket(frame)
                reading = kernel or known
                inode = self._fd_inode(fd) if fd is not None else None
                self._sockets[ident] = inode or (reading.socket_inode if reading else None)
            del frame
            if loop_fds is not None:
                # An event loop: its registered sockets are its requests, none is timers.
                inodes = self._loop_sockets(loop_fds)
                connections = len(inodes)
                state = "python" if _woken(kernel) else "socket" if inodes else "wait"
                for socket_inode in inodes[:MAX_SERVERS]:
                    self._note_server(servers, self._peer(self._pid, socket_inode))
            else:
                polls = stack_state == "poll" or (
                    kernel is not None and kernel.syscall in POLL_CALLS
                )
                connections = self._connections_of(self._pid, now) if polls else 0
                state = refine(stack_state, kernel, connections > 0)
                if state == "socket" and not polls:
                    # Who answers on the socket it waits on, if a process of this machine.
                    self._note_server(servers, self._peer(self._pid, self._socket_of(ident)))
            out[THREAD_PREFIX + state] += 1
            if state in IO_STATES:
                # One request in flight per thread blocked in I/O; an event loop polling
                # its connections may have one on each.
                out[IN_FLIGHT] += connections if loop_fds is not None or polls else 1
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
            child_state = process_state(kernel, connections > 0)
            if child_state is not None:
                out[PROCESS_PREFIX + child_state] += 1
                if child_state in IO_STATES:
                    out[IN_FLIGHT] += 1
                if child_state == "socket" and kernel is not None:
                    # Blocked on one socket: its far end; polling (Python waits for a socket
                    # with a timeout in poll): the one server it talks to, if just one.
                    inode = kernel.socket_inode
                    peer = self._peer(child, inode) if inode else self._finder(child).sole()
                    self._note_server(servers, peer)
        self._observe_servers(servers, out)
        return out, keys

    def _socket_of(self, ident: int) -> str | None:
        return self._sockets.get(ident)

    def own_server(self, ident: int, frame: FrameType) -> Counter[str]:
        """The server observations of one moment for a sampled thread that itself waits on
        a socket (a loop or a DataLoader worker reading from a data server): the process at
        the socket's far end, when one of this machine (empty otherwise)."""
        now = self._monotonic()
        if now - self._listed_at >= REFRESH_S:
            self._refresh_threads()
        if ident not in self._sockets:
            fd = frame_socket(frame)
            inode = self._fd_inode(fd) if fd is not None else None
            native = self._native.get(ident)
            if inode is None and native is not None:
                reading = self._read_kernel(self._pid, native)
                self.kernel_reads += 1
                inode = reading.socket_inode if reading is not None else None
            self._sockets[ident] = inode
        out: Counter[str] = Counter()
        servers: dict[int, Peer] = {}
        self._note_server(servers, self._peer(self._pid, self._sockets[ident]))
        self._observe_servers(servers, out)
        return out

    def _fd_inode(self, fd: int) -> str | None:
        target = self._fd_target(fd)
        return target[8:-1] if target is not None and target.startswith("socket:[") else None

    def _loop_sockets(self, fds: list[int]) -> list[str]:
        """The socket inodes among an event loop's registered descriptors."""
        inodes = []
        for fd in fds[:MAX_LOOP_FDS]:
            target = self._fd_target(fd)
            if target is not None and target.startswith("socket:["):
                inodes.append(target[8:-1])
        return inodes

    @staticmethod
    def _note_server(servers: dict[int, Peer], peer: Peer | None) -> None:
        if peer is not None and len(servers) < MAX_SERVERS:
            servers.setdefault(peer.pid, peer)

    def _observe_servers(self, servers: dict[int, Peer], out: Counter[str]) -> None:
        """One observation of each server a helper waited on at this moment."""
        for peer in servers.values():
            seen = self._activity(peer.pid)
            if seen is None:
                continue
            activity, running = seen
            out[SERVER_PREFIX + activity] += 1
            out[SERVER_RUNNING] += running
            out[f"{PEER_PREFIX}{peer.pid} {peer.name}"] += 1


class PeerFinder(Protocol):
    """Who is at the far end of one process's sockets
    (:class:`~trainmedic.host.peers.LocalPeers`)."""

    def peer(self, inode: str) -> Peer | None: ...

    def sole(self) -> Peer | None: ...


def _fd_target(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
