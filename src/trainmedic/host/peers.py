"""The process on this machine at the other end of a socket: a data server the job talks to.

A loop (or the threads it hands its fetching to) that waits on a socket waits
for whoever answers. When that is a process on this machine - a sample store,
a feature server, a cache, a data service on 127.0.0.1 or on a Unix socket -
its own state says what the wait is made of: its threads on a CPU (it
computes each answer, and more requests in flight only queue behind it), in
uninterruptible disk reads, or asleep (a latency it waits out: its own
upstream, a lock, a timer).

How the far end is found, from ``/proc`` and the kernel only (no signal, no
injected code, nothing the server has to allow beyond reading its ``/proc``):

* TCP: a connection whose far end is an endpoint of this network namespace has
  a mirror row in the same table (local and remote swapped); that row's inode
  is the peer's socket.
* Unix sockets: the kernel's socket diagnostics (``NETLINK_SOCK_DIAG`` with
  ``UDIAG_SHOW_PEER``, as ``ss -x`` asks) name each connected socket's peer inode.
* The owner of a peer inode: the process with a descriptor on it, from the
  ``/proc/<pid>/fd`` links of the processes one may read.

That owner scan costs milliseconds on a busy machine, so :class:`LocalPeers`
keeps what it found and scans again at most every :data:`SCAN_S` seconds
(sockets it has not seen wait for the next scan). Reading a process's state
(:func:`process_activity`) reads one ``stat`` file per thread, which anyone may
read: a few µs each.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from trainmedic.host.threadstate import (
    PROC,
    TcpRow,
    _read,
    socket_inodes,
    stat_state,
    tcp_rows,
)

SCAN_S = 10.0
"""Seconds between two scans for the owners of the sockets' far ends."""
MAX_PROCESSES = 4096
"""Processes whose descriptors one scan reads at most."""
MAX_FDS = 1024
"""Descriptors of one process a scan reads at most."""
MAX_SERVER_THREADS = 64
"""Threads of a server whose state :func:`process_activity` reads at most."""
NAME_CHARS = 60
"""Length of a peer's name (its command line) at most."""
ACTIVITIES = ("cpu", "file", "wait")
"""What :func:`process_activity` names: a thread on a CPU (or waiting for one), a thread
in uninterruptible sleep (a disk, a network filesystem) and none on a CPU, all asleep."""

# Netlink socket diagnostics (linux/sock_diag.h, linux/unix_diag.h, linux/netlink.h).
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_UDIAG_SHOW_PEER = 0x4
_UNIX_DIAG_PEER = 2
_NLMSG_HEADER = struct.Struct("=IHHII")
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")
_UNIX_DIAG_MSG_BYTES = 16
_MAX_MESSAGES = 200_000
"""Netlink messages one dump reads at most (a machine with that many Unix sockets)."""


@dataclass(frozen=True)
class Peer:
    """A process on this machine at the far end of one of the job's sockets.

    Attributes:
        pid: its process id.
        name: its command line, shortened (:data:`NAME_CHARS`).
    """

    pid: int
    name: str


def mirror_inodes(rows: Collection[TcpRow], ours: set[str]) -> dict[str, str]:
    """Our established TCP sockets whose far end is a socket of this namespace:
    ``{our inode: the far end's inode}`` (not ours: a connection within the process is no
    server)."""
    established = [r for r in rows if r.state == "01"]
    by_ends = {(r.local, r.remote): r.inode for r in established}
    out: dict[str, str] = {}
    for r in established:
        if r.inode not in ours:
            continue
        far = by_ends.get((r.remote, r.local))
        if far is not None and far not in ours and far != "0":
            out[r.inode] = far
    return out


def parse_unix_diag(data: bytes, wanted: Collection[str], out: dict[str, str]) -> bool:
    """Add ``{inode: peer inode}`` of the wanted sockets in one netlink read to ``out``;
    ``True`` when the dump is done (or malformed: nothing more to read)."""
    off = 0
    while off + _NLMSG_HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, off)
        if length < _NLMSG_HEADER.size or off + length > len(data):
            return True
        if kind in (_NLMSG_DONE, _NLMSG_ERROR):
            return True
        body = off + _NLMSG_HEADER.size
        end = off + length
        if body + _UNIX_DIAG_MSG_BYTES <= end:
            (inode,) = struct.unpack_from("=I", data, body + 4)
            attr = body + _UNIX_DIAG_MSG_BYTES
            while attr + 4 <= end:
                size, kind = struct.unpack_from("=HH", data, attr)
                if size < 4:
                    break
                if kind == _UNIX_DIAG_PEER and size >= 8 and str(inode) in wanted:
                    (peer,) = struct.unpack_from("=I", data, attr + 4)
                    if peer:
                        out[str(inode)] = str(peer)
                attr += (size + 3) & ~3
        off += (length + 3) & ~3
    return False


def unix_peers(wanted: Collection[str]) -> dict[str, str]:
    """``{inode: peer inode}`` of the wanted connected Unix sockets, from the kernel's
    socket diagnostics; empty where they cannot be asked (not Linux, no netlink)."""
    if not wanted:
        return {}
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return {}
    out: dict[str, str] = {}
    with sock:
        try:
            sock.settimeout(1.0)
            request = _UNIX_DIAG_REQ.pack(
                socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_PEER, 0xFFFFFFFF, 0xFFFFFFFF
            )
            header = _NLMSG_HEADER.pack(
                _NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0,
            )  # fmt: skip
            sock.send(header + request)
            for _ in range(_MAX_MESSAGES // 16):
                data = sock.recv(1 << 16)
                if not data or parse_unix_diag(data, wanted, out):
                    break
        except OSError:
            pass
    return out


def owners(
    inodes: Collection[str], proc: str = PROC, skip: Collection[int] = ()
) -> dict[str, int]:
    """``{inode: pid}`` of the processes holding the wanted sockets, among those whose
    descriptors may be read (``skip``: pids not to look at)."""
    want = set(inodes)
    found: dict[str, int] = {}
    if not want:
        return found
    try:
        names = [n for n in os.listdir(proc) if n.isdigit()][:MAX_PROCESSES]
    except OSError:
        return found
    for name in names:
        pid = int(name)
        if pid in skip:
            continue
        try:
            fds = os.listdir(f"{proc}/{name}/fd")[:MAX_FDS]
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(f"{proc}/{name}/fd/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else None
            if inode is not None and inode in want:
                found[inode] = pid
                want.discard(inode)
        if not want:
            break
    return found


def process_name(pid: int, proc: str = PROC) -> str:
    """A process's command line, with the base names of the paths in it, printable and
    short (:data:`NAME_CHARS`)."""
    text = _read(f"{proc}/{pid}/cmdline", 4096) or ""
    words = [w for w in text.split("\0") if w]
    if not words:
        return (_read(f"{proc}/{pid}/comm", 64) or "").strip() or str(pid)
    # Programs and scripts by their base names: the name says what runs, not where.
    words = [os.path.basename(w) if w.startswith(("/", "./")) else w for w in words]
    words[0] = os.path.basename(words[0])
    name = " ".join(words)
    name = " ".join("".join(c if c.isprintable() or c.isspace() else "?" for c in name).split())
    return name[:NAME_CHARS] or str(pid)


def process_activity(pid: int, proc: str = PROC) -> tuple[str, int] | None:
    """(what the process does now - one of :data:`ACTIVITIES` -, its threads on a CPU);
    ``None`` when it is gone or cannot be read."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")[:MAX_SERVER_THREADS]
    except OSError:
        return None
    running = disk = seen = 0
    for tid in tids:
        state = stat_state(_read(f"{proc}/{pid}/task/{tid}/stat", 512))
        if state is None:
            continue
        seen += 1
        if state == "R":
            running += 1
        elif state == "D":
            disk += 1
    if not seen:
        return None
    if running:
        return "cpu", running
    return ("file", 0) if disk else ("wait", 0)


class LocalPeers:
    """The processes on this machine at the far end of one process's sockets.

    Args:
        pid: the process (``"self"``: the caller's, right after a fork too).
        proc: the proc filesystem.
        monotonic: the clock that paces the scans.
        unix: ``{inode: peer inode}`` of Unix sockets (:func:`unix_peers`; tests pass a fake).
        scan_s: seconds between two scans.
    """

    def __init__(
        self,
        pid: int | str = "self",
        proc: str = PROC,
        monotonic: Callable[[], float] = time.monotonic,
        unix: Callable[[Collection[str]], dict[str, str]] = unix_peers,
        scan_s: float = SCAN_S,
    ) -> None:
        self._pid = pid
        self._proc = proc
        self._monotonic = monotonic
        self._unix = unix
        self._scan_s = scan_s
        self._known: dict[str, Peer | None] = {}
        self._scanned_at: float | None = None
        self.scans = 0

    def peer(self, inode: str) -> Peer | None:
        """The process at the far end of socket ``inode``; ``None`` when it is not a
        process of this machine one may see (or not known until the next scan)."""
        if inode in self._known:
            return self._known[inode]
        now = self._monotonic()
        if self._scanned_at is not None and now - self._scanned_at < self._scan_s:
            return None
        self._scan(now)
        return self._known.get(inode)

    def sole(self) -> Peer | None:
        """The one process of this machine at the far end of this process's sockets, when
        there is exactly one (a producer with its one store connection); ``None`` when there
        is none or several (ranks of a job, a store and a logger) - no guessing between them."""
        now = self._monotonic()
        if self._scanned_at is None or now - self._scanned_at >= self._scan_s:
            self._scan(now)
        found = {p.pid: p for p in self._known.values() if p is not None}
        return next(iter(found.values())) if len(found) == 1 else None

    def _scan(self, now: float) -> None:
        self._scanned_at = now
        self.scans += 1
        pid = self._pid
        me = os.getpid() if pid == "self" else int(pid)
        ours = socket_inodes(pid, self._proc, MAX_FDS)
        rows = tcp_rows(pid, self._proc)
        far = mirror_inodes(rows, ours)
        tcp = {r.inode for r in rows}
        unix = self._unix(ours - tcp)
        far.update({i: p for i, p in unix.items() if p not in ours})
        held = owners(set(far.values()), self._proc, skip=(me,))
        names: dict[int, str] = {}
        known: dict[str, Peer | None] = dict.fromkeys(ours)
        for inode, other in far.items():
            owner = held.get(other)
            if owner is None:
                continue
            if owner not in names:
                names[owner] = process_name(owner, self._proc)
            known[inode] = Peer(owner, names[owner])
        self._known = known
