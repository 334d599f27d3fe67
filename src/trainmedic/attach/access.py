"""Whether this process may read another's memory (py-spy's stack reader needs it), and
if not, exactly why and how to get it.

Linux allows it (``PTRACE_MODE_ATTACH``) to root or a holder of
``CAP_SYS_PTRACE``; otherwise only for a process of the same user, and then
Yama's ``kernel.yama.ptrace_scope`` decides: 0 allows it, 1 only for
descendants (a job started elsewhere is not one), 2 only with the capability,
3 never. Containers drop ``CAP_SYS_PTRACE`` unless started with
``--cap-add SYS_PTRACE``.
"""

from __future__ import annotations

import os

from trainmedic.host.threadstate import read_text

CAP_SYS_PTRACE = 19


def has_cap_sys_ptrace(proc: str = "/proc") -> bool:
    """Whether this process holds ``CAP_SYS_PTRACE`` in its effective set."""
    status = read_text(f"{proc}/self/status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
            except (IndexError, ValueError):
                return False
    return False


def ptrace_scope(proc: str = "/proc") -> int | None:
    """Yama's ``ptrace_scope`` (``None``: no Yama)."""
    text = read_text(f"{proc}/sys/kernel/yama/ptrace_scope")
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def owner(pid: int, proc: str = "/proc") -> int | None:
    """The real user id of ``pid`` (``None``: gone)."""
    status = read_text(f"{proc}/{pid}/status") or ""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def read_problem(pid: int, proc: str = "/proc", uid: int | None = None) -> str | None:
    """Why the memory of ``pid`` may not be read from here (one line with the way to get
    the right), or ``None`` when it may."""
    me = os.geteuid() if uid is None else uid
    if has_cap_sys_ptrace(proc):
        return None  # root normally; not root in a container started without it
    theirs = owner(pid, proc)
    if me == 0 and theirs is not None and theirs != me:
        # Root without the capability (a container started without it, a dropped bounding
        # set) reads only root's processes; "run as root" would change nothing.
        return (
            "attach runs as root but without CAP_SYS_PTRACE, which reading another "
            "process's memory needs: start the container with --cap-add SYS_PTRACE "
            "(Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]), or run attach "
            "on the host"
        )
    if theirs is not None and theirs != me:
        return (
            f"process {pid} belongs to user {theirs}, not to you ({me}): run attach as "
            "that user, or as root (sudo)"
        )
    scope = ptrace_scope(proc)
    if scope in (None, 0):
        return None
    if scope == 1:
        return (
            "kernel.yama.ptrace_scope is 1: only a process's ancestors may read it. Run "
            "attach with sudo, or allow it for your user's processes: "
            "sudo sysctl kernel.yama.ptrace_scope=0 (in a container: docker run "
            "--cap-add SYS_PTRACE)"
        )
    if scope == 2:
        return (
            "kernel.yama.ptrace_scope is 2: only holders of CAP_SYS_PTRACE may read other "
            "processes. Run attach with sudo (in a container: --cap-add SYS_PTRACE)"
        )
    return (
        "kernel.yama.ptrace_scope is 3: no process may read another's memory until "
        "reboot; only /proc and the GPUs' readings are available"
    )
