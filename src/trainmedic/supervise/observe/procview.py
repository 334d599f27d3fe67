"""The kernel's view of the job's processes, read from ``/proc`` and ``/sys``.

Small, forgiving readers (a field that cannot be read is ``None``; a process
that is gone is ``None``) for what the silence classifier needs
(:mod:`trainmedic.resilience.silence`):

* :func:`read_process` — one process: CPU time of all its threads and of the
  probe's thread, bytes read and written (``rchar``/``wchar``) by the process
  and by the probe's thread, pages it dirtied (``write_bytes``: a large write
  shows there while the call is still running), the main thread's state, its
  run-queue wait (``schedstat``) and its current system call with the file
  descriptor it works on (``syscall``; readable by the supervisor, the job's
  parent, under the usual ptrace rules);
* :func:`fd_target` — what a descriptor is: a path, ``socket 10.0.0.5:9000``
  (the peer, from ``/proc/<pid>/net/tcp``), ``pipe``;
* :func:`written_files` — sizes of the regular files a process has open for
  writing (``/proc/<pid>/fd`` links carry the open mode);
* :func:`flushed_bytes` — bytes the block device under a file has written
  (``/sys/dev/block/M:m/stat``), else the machine's written-back pages
  (``/proc/vmstat`` ``nr_written``): storage working through an ``fsync``.

Every reader takes the ``/proc`` (and ``/sys``) root as a seam for tests. The
system-call numbers live in :mod:`trainmedic.host.threadstate`.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
from dataclasses import dataclass
from pathlib import Path

from trainmedic.host.threadstate import parse_syscall, read_text

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MAX_FDS = 512
"""At most this many descriptors of a process are looked at."""


@dataclass(frozen=True)
class ProcSnapshot:
    """One process at one moment (counters are cumulative).

    Attributes:
        cpu_s: CPU seconds of all its threads.
        probe_cpu_s: CPU seconds of the probe's threads (``None``: no probe thread known).
        io_chars: ``rchar + wchar`` of the process.
        probe_io_chars: the same for the probe's thread.
        dirtied_bytes: ``write_bytes``: page cache it dirtied.
        state: the main thread's state letter.
        run_wait_s: seconds the main thread waited on a run queue.
        wakeups: times the main thread was put on a CPU (``schedstat``): a thread
            parked in a read that keeps being woken is receiving data (socket
            bytes never show in ``rchar``).
        syscall: the main thread's system call name, ``running``, or ``None``.
        fd: the descriptor that call works on, when it takes one.
    """

    pid: int
    cpu_s: float | None = None
    probe_cpu_s: float | None = None
    io_chars: int | None = None
    probe_io_chars: int | None = None
    dirtied_bytes: int | None = None
    state: str | None = None
    run_wait_s: float | None = None
    wakeups: int | None = None
    syscall: str | None = None
    fd: int | None = None


def _stat_fields(text: str | None) -> tuple[str | None, float | None]:
    """State letter and utime+stime seconds from a ``stat`` file."""
    if not text:
        return None, None
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return rest[0], (int(rest[11]) + int(rest[12])) / CLK_TCK
    except (IndexError, ValueError):
        return (rest[0] if rest else None), None


def _io_fields(text: str | None) -> tuple[int | None, int | None]:
    """``rchar + wchar`` and ``write_bytes`` from an ``io`` file."""
    if not text:
        return None, None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError):
            values[key.strip()] = int(value)
    chars = None
    if "rchar" in values and "wchar" in values:
        chars = values["rchar"] + values["wchar"]
    return chars, values.get("write_bytes")


def read_process(
    pid: int, probe_tid: int | None = None, root: str = "/proc", sampler_tid: int | None = None
) -> ProcSnapshot | None:
    """The snapshot of ``pid``; ``None`` when it is gone. ``probe_tid`` / ``sampler_tid``:
    the probe's threads, whose CPU and I/O are summed apart (``probe_*``)."""
    base = f"{root}/{pid}"
    state, cpu = _stat_fields(read_text(f"{base}/stat"))
    if state is None:
        return None
    chars, dirtied = _io_fields(read_text(f"{base}/io"))
    probe_cpu = probe_chars = None
    for tid in (probe_tid, sampler_tid):
        if tid is None or tid == pid:
            continue
        _, tid_cpu = _stat_fields(read_text(f"{base}/task/{tid}/stat"))
        tid_chars, _ = _io_fields(read_text(f"{base}/task/{tid}/io"))
        if tid_cpu is not None:
            probe_cpu = (probe_cpu or 0.0) + tid_cpu
        if tid_chars is not None:
            probe_chars = (probe_chars or 0) + tid_chars
    run_wait = wakeups = None
    sched = read_text(f"{base}/schedstat")
    if sched:
        with contextlib.suppress(IndexError, ValueError):
            fields = sched.split()
            run_wait = int(fields[1]) / 1e9
            wakeups = int(fields[2])
    syscall, fd = parse_syscall(read_text(f"{base}/syscall"))
    return ProcSnapshot(
        pid=pid,
        cpu_s=cpu,
        probe_cpu_s=probe_cpu,
        io_chars=chars,
        probe_io_chars=probe_chars,
        dirtied_bytes=dirtied,
        state=state,
        run_wait_s=run_wait,
        wakeups=wakeups,
        syscall=syscall,
        fd=fd,
    )


def fd_target(pid: int, fd: int, root: str = "/proc") -> tuple[str | None, int | None]:
    """What descriptor ``fd`` of ``pid`` is (a path, ``socket <peer>``, ``pipe``) and,
    for a file, the device it lives on (``st_dev``)."""
    link = f"{root}/{pid}/fd/{fd}"
    try:
        target = os.readlink(link)
    except OSError:
        return None, None
    if target.startswith("socket:["):
        peer = _socket_peer(pid, target[8:-1], root)
        return ("socket " + peer if peer else "socket"), None
    if target.startswith("pipe:"):
        return "pipe", None
    if target.startswith("anon_inode:"):
        return target, None
    try:
        dev = os.stat(link).st_dev
    except OSError:
        dev = None
    return target, dev


def socket_peers(pid: int, root: str = "/proc", limit: int = 3) -> list[str]:
    """``host:port`` of the remote ends of the TCP connections ``pid`` holds (for a
    thread waiting in ``poll`` on sockets, whose call names no descriptor)."""
    directory = f"{root}/{pid}/fd"
    try:
        names = os.listdir(directory)[:MAX_FDS]
    except OSError:
        return []
    inodes = set()
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"{directory}/{name}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    peers: list[str] = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        text = read_text(f"{root}/{pid}/net/{table}") if inodes else None
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            # State 01 is ESTABLISHED: a connection, not a listening socket.
            if len(fields) > 9 and fields[9] in inodes and fields[3] == "01":
                peer = _address(fields[2], v6)
                if peer and peer not in peers:
                    peers.append(peer)
    return peers[:limit]


def _socket_peer(pid: int, inode: str, root: str) -> str | None:
    """``host:port`` of the remote end of the TCP socket ``inode``."""
    for name, v6 in (("tcp", False), ("tcp6", True)):
        text = read_text(f"{root}/{pid}/net/{name}")
        if not text:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[9] == inode:
                return _address(fields[2], v6)
    return None


def _address(hexed: str, v6: bool) -> str | None:
    host, _, port = hexed.partition(":")
    try:
        raw = bytes.fromhex(host)
        number = int(port, 16)
    except ValueError:
        return None
    if not v6 and len(raw) == 4:
        return f"{'.'.join(str(b) for b in reversed(raw))}:{number}"
    if len(raw) == 16:
        import ipaddress

        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        address = ipaddress.IPv6Address(words)
        mapped = address.ipv4_mapped
        return f"{mapped or address}:{number}" if mapped else f"[{address}]:{number}"
    return None


def written_files(pid: int, root: str = "/proc") -> dict[tuple[int, int], int]:
    """``(st_dev, st_ino) -> size`` of the regular files ``pid`` has open for writing."""
    directory = f"{root}/{pid}/fd"
    try:
        names = os.listdir(directory)[:MAX_FDS]
    except OSError:
        return {}
    sizes: dict[tuple[int, int], int] = {}
    for name in names:
        link = f"{directory}/{name}"
        try:
            if not os.lstat(link).st_mode & stat_mod.S_IWUSR:
                continue  # the link's mode is the descriptor's open mode
            st = os.stat(link)
        except OSError:
            continue
        if stat_mod.S_ISREG(st.st_mode):
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sizes


def flushed_bytes(dev: int | None, proc: str = "/proc", sys: str = "/sys") -> int | None:
    """Bytes written so far by the block device ``dev`` (a file's ``st_dev``), or by
    the whole machine's writeback when the device has no statistics (overlay,
    network and memory filesystems)."""
    if dev is not None and os.major(dev) != 0:
        text = read_text(f"{sys}/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
        if text:
            with contextlib.suppress(IndexError, ValueError):
                return int(text.split()[6]) * 512
    text = read_text(f"{proc}/vmstat")
    if text:
        for line in text.splitlines():
            if line.startswith("nr_written "):
                with contextlib.suppress(ValueError):
                    return int(line.split()[1]) * PAGE
    return None


def exists(root: str = "/proc") -> bool:
    return Path(root, "self", "stat").exists()
