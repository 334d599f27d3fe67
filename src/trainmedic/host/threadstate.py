"""What a thread is doing right now, as the kernel sees it: on a CPU, or blocked in what.

Three files of ``/proc/<pid>/task/<tid>/`` say it: ``stat`` (the state letter:
``R`` running or runnable, ``D`` uninterruptible - mostly waiting on a disk -,
``S`` sleeping), ``syscall`` (the system call it is blocked in and its
arguments; ``running`` when on a CPU) and, for a call on a descriptor, the
descriptor's target (``/proc/<pid>/fd/<n>``: ``socket:[...]``, ``pipe:[...]``,
a path). Readable for one's own processes and, under the usual ptrace rules,
by a parent for its children; each read costs a few microseconds.

:func:`parse_syscall` and :func:`kernel_class` are pure; :func:`read_kernel_state`
reads one thread. The system-call table is the one home of those numbers:
the supervisor's view of a silent job (:mod:`trainmedic.supervise.observe.procview`)
reads it too.
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass

PROC = "/proc"

# System calls a thread waits in, by number, for the architectures torch runs on.
SYSCALLS = {
    "x86_64": {
        0: "read", 1: "write", 3: "close", 7: "poll", 17: "pread64", 18: "pwrite64",
        19: "readv", 20: "writev", 23: "select", 34: "pause", 35: "nanosleep",
        42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg",
        47: "recvmsg", 61: "wait4", 74: "fsync", 75: "fdatasync", 202: "futex",
        230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 270: "pselect6",
        271: "ppoll", 277: "sync_file_range", 281: "epoll_pwait", 288: "accept4",
        441: "epoll_pwait2",
    },
    "aarch64": {
        22: "epoll_pwait", 57: "close", 63: "read", 64: "write", 65: "readv", 66: "writev",
        67: "pread64", 68: "pwrite64", 72: "pselect6", 73: "ppoll", 82: "fsync",
        83: "fdatasync", 84: "sync_file_range", 95: "waitid", 98: "futex", 101: "nanosleep",
        115: "clock_nanosleep", 202: "accept", 203: "connect", 206: "sendto",
        207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4", 260: "wait4",
        441: "epoll_pwait2",
    },
}  # fmt: skip
FD_SYSCALLS = frozenset(
    {
        "read", "write", "close", "pread64", "pwrite64", "readv", "writev", "connect",
        "accept", "accept4", "recvfrom", "recvmsg", "sendto", "sendmsg", "fsync", "fdatasync",
        "sync_file_range",
    }
)  # fmt: skip
_SOCKET_CALLS = frozenset(
    {"recvfrom", "recvmsg", "sendto", "sendmsg", "connect", "accept", "accept4"}
)
_IO_CALLS = frozenset(
    {"read", "write", "pread64", "pwrite64", "readv", "writev", "fsync", "fdatasync",
     "sync_file_range"}
)  # fmt: skip
POLL_CALLS = frozenset(
    {"poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "epoll_pwait2"}
)
_SLEEP_CALLS = frozenset({"nanosleep", "clock_nanosleep", "pause"})
_CHILD_CALLS = frozenset({"wait4", "waitid"})

KERNEL_CLASSES = ("running", "disk", "socket", "file", "pipe", "lock", "poll", "sleep", "child")
"""What :func:`kernel_class` names: on a CPU; in uninterruptible sleep (a disk, a
network filesystem); blocked on a socket, a regular file, a pipe; on a lock or a
condition (``futex``: the interpreter lock too); polling descriptors (an event
loop, a selector); sleeping; waiting for a child."""


@dataclass(frozen=True)
class KernelState:
    """One thread at one moment.

    Attributes:
        state: the state letter of ``stat`` (``R``, ``S``, ``D``, ...).
        syscall: the system call it is blocked in, ``running``, or ``None``.
        fd_kind: for a call on a descriptor: ``socket``, ``pipe``, ``file`` or ``other``.
        target: that descriptor's link target (``socket:[<inode>]``, a path), when read.
    """

    state: str | None
    syscall: str | None = None
    fd_kind: str | None = None
    target: str | None = None

    @property
    def socket_inode(self) -> str | None:
        """The inode of the socket the call waits on (:mod:`trainmedic.host.peers`)."""
        t = self.target
        return t[8:-1] if t is not None and t.startswith("socket:[") else None


def parse_syscall(text: str | None, machine: str | None = None) -> tuple[str | None, int | None]:
    """The system call name (``running`` when on a CPU) and its descriptor argument
    from ``/proc/<pid>/syscall``."""
    if not text:
        return None, None
    parts = text.split()
    if not parts:
        return None, None
    if parts[0] == "running":
        return "running", None
    try:
        number = int(parts[0])
    except ValueError:
        return None, None
    if number < 0:
        return "none", None  # blocked outside a system call (a page fault)
    table = SYSCALLS.get(machine or platform.machine(), {})
    name = table.get(number, f"syscall {number}")
    fd = None
    if name in FD_SYSCALLS and len(parts) > 1:
        with contextlib.suppress(ValueError):
            fd = int(parts[1], 16)
    return name, fd


def stat_state(text: str | None) -> str | None:
    """The state letter of a ``stat`` file's text."""
    if not text:
        return None
    rest = text[text.rfind(")") + 2 :]
    return rest[:1] or None


def fd_kind(link: str | None) -> str | None:
    """``socket``, ``pipe``, ``file`` or ``other`` for a ``/proc/<pid>/fd/<n>`` link target."""
    if not link:
        return None
    if link.startswith("socket:"):
        return "socket"
    if link.startswith("pipe:"):
        return "pipe"
    if link.startswith("/"):
        return "file"
    return "other"


def kernel_class(k: KernelState) -> str | None:
    """What the thread is doing, one of :data:`KERNEL_CLASSES`; ``None`` when unknown."""
    call = k.syscall
    if call == "running" or (call is None and k.state == "R"):
        return "running"
    if k.state == "D":
        return "disk"
    if call is None or call == "none":
        return "running" if k.state == "R" else None
    if call in _SOCKET_CALLS or (call in _IO_CALLS and k.fd_kind == "socket"):
        return "socket"
    if call in _IO_CALLS:
        if k.fd_kind == "pipe":
            return "pipe"
        return "file" if k.fd_kind in ("file", None) else None
    if call == "futex":
        return "lock"
    if call in POLL_CALLS:
        return "poll"
    if call in _SLEEP_CALLS:
        return "sleep"
    if call in _CHILD_CALLS:
        return "child"
    return None


def read_text(path: str) -> str | None:
    """A whole ``/proc`` or ``/sys`` file as text (bytes outside ASCII replaced);
    ``None`` when it is gone or cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _read(path: str, size: int) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_kernel_state(pid: int | str, tid: int, proc: str = PROC) -> KernelState | None:
    """Thread ``tid`` of ``pid`` now; ``None`` when it is gone or cannot be read."""
    base = f"{proc}/{pid}/task/{tid}"
    state = stat_state(_read(f"{base}/stat", 512))
    if state is None:
        return None
    syscall, fd = parse_syscall(_read(f"{base}/syscall", 256))
    kind = target = None
    if fd is not None and syscall in FD_SYSCALLS:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            target = None
        kind = fd_kind(target)
    return KernelState(state, syscall, kind, target)


def child_pids(pid: int | str = "self", proc: str = PROC, limit: int = 64) -> list[int]:
    """The children of every thread of ``pid`` (``task/<tid>/children``; empty where the
    kernel lacks it), at most ``limit``."""
    base = f"{proc}/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        text = _read(f"{base}/{tid}/children", 4096)
        for word in (text or "").split():
            if word.isdigit() and int(word) not in out:
                out.append(int(word))
                if len(out) >= limit:
                    return out
    return out


def socket_inodes(pid: int | str = "self", proc: str = PROC, limit: int = 512) -> set[str]:
    """The inodes of the sockets ``pid`` holds (of its first ``limit`` descriptors)."""
    try:
        names = os.listdir(f"{proc}/{pid}/fd")[:limit]
    except OSError:
        return set()
    inodes = set()
    for name in names:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


@dataclass(frozen=True)
class TcpRow:
    """One row of ``/proc/<pid>/net/tcp`` or ``tcp6``: endpoints as the kernel writes them
    (hex address:port), the state (``01``: established) and the socket's inode."""

    local: str
    remote: str
    state: str
    inode: str


def tcp_rows(pid: int | str = "self", proc: str = PROC) -> list[TcpRow]:
    """The TCP sockets (IPv4 and IPv6) of ``pid``'s network namespace."""
    rows: list[TcpRow] = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/{pid}/net/{table}", encoding="ascii", errors="replace") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9:
                        rows.append(TcpRow(fields[1], fields[2], fields[3], fields[9]))
        except OSError:
            continue
    return rows


def connection_count(pid: int | str = "self", proc: str = PROC, limit: int = 512) -> int:
    """Established TCP connections (IPv4 and IPv6) ``pid`` holds: a thread of it polling
    descriptors may be waiting on them. Reads its descriptors (at most ``limit``) and
    its network namespace's TCP tables."""
    inodes = socket_inodes(pid, proc, limit)
    if not inodes:
        return 0
    # State 01 is ESTABLISHED: a connection, not a listening socket.
    return sum(1 for r in tcp_rows(pid, proc) if r.state == "01" and r.inode in inodes)
