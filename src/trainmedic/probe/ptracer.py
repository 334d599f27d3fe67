"""Let the supervisor's py-spy read this process where Yama would refuse it.

Under Yama's ``ptrace_scope = 1`` (Ubuntu's and many distributions' default) a
process may read another's memory only if it is an ancestor of it. The
supervisor's py-spy (:mod:`trainmedic.supervise.observe.outside_stacks`) is a
child of the supervisor, not an ancestor of the job, so it would be refused,
and the probe would go on sampling inside the job. ``prctl(PR_SET_PTRACER,
pid)`` names a process (and its descendants) that may: the probe names the
supervisor, the process at the other end of its Unix socket
(``SO_PEERCRED``). Nothing else is allowed, and nothing changes where Yama is
absent or set otherwise.
"""

from __future__ import annotations

import socket
import struct

PR_SET_PTRACER = 0x59616D61
"""``prctl`` option of Yama (``"Yama"`` in ASCII)."""
SCOPE_FILE = "/proc/sys/kernel/yama/ptrace_scope"


def yama_scope(path: str = SCOPE_FILE) -> int | None:
    """Yama's ptrace scope (0-3), or ``None`` without Yama."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def peer_pid(fd: int) -> int | None:
    """The pid of the process at the other end of the Unix socket ``fd``."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    sock = socket.socket(fileno=fd)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays the channel's
    pid = struct.unpack("3i", raw)[0]
    return pid if pid > 0 else None


def allow_supervisor(fd: int, scope: int | None = None) -> bool:
    """Name the supervisor behind the socket ``fd`` as a process that may read this
    one, where Yama's scope 1 needs it; ``True`` when it was named."""
    if (yama_scope() if scope is None else scope) != 1:
        return False
    pid = peer_pid(fd)
    if pid is None:
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
