"""A signal to one thread of another process (``tgkill``).

``os.kill`` sends a signal to a process, and the kernel hands it to whichever
of its threads does not block it: usually the main thread, but any thread
when the main one already has a signal pending. A signal whose handler reads
the interrupted thread's state (faulthandler writing a stack) must reach the
thread it is meant for. Python has no ``os.tgkill``; the system call is made
through the C library's ``syscall`` where its number is known, else the signal
goes to the process as ``os.kill`` sends it.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable

TGKILL = {"x86_64": 234, "aarch64": 131, "ppc64le": 250, "s390x": 241, "riscv64": 131}
"""The number of the ``tgkill`` system call on the architectures torch runs on."""


def signal_thread(pid: int, tid: int, signum: int) -> bool:
    """Send ``signum`` to thread ``tid`` of process ``pid``; ``True`` when it went to
    that thread, ``False`` when it went to the process instead (no ``tgkill`` here).

    Raises :class:`OSError` as ``os.kill`` does (``ProcessLookupError`` when the
    thread is gone, ``PermissionError``).
    """
    number = TGKILL.get(platform.machine())
    syscall = _libc_syscall() if number is not None else None
    if syscall is None or number is None:
        os.kill(pid, signum)
        return False
    import ctypes

    if syscall(number, pid, tid, signum) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return True


def _libc_syscall() -> Callable[..., int] | None:
    """The C library's ``syscall`` function, or ``None`` where it cannot be loaded."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError, ImportError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn
