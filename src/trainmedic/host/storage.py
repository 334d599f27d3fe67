"""Measured read speed of the user's data directory (read-only).

:func:`measure_storage` never writes in the user's directory: it lists a
bounded part of the tree (breadth first), then reads a sample of the user's
own files the way a data loader does — large files sequentially, small files
whole — within a time budget. Before each file is read it asks the kernel to
drop that file's cached pages (``posix_fadvise(POSIX_FADV_DONTNEED)``, a hint
that writes no data) so the numbers come from the storage, not from memory.
Files are opened with ``O_NOATIME`` where the kernel allows it, so not even
access times change.
"""

from __future__ import annotations

import io
import os
import random
import stat
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmedic.errors import InputError
from trainmedic.host import mounts

Clock = Callable[[], float]
"""Monotonic seconds; a seam so tests can run the budget on a fake clock."""

MIB = 1024 * 1024

SMALL_FILE_MAX_BYTES = 256 * 1024
"""Files up to this size are read whole for the small-file rate."""

LARGE_FILE_MIN_BYTES = 1 * MIB
"""Files from this size on are read for sequential throughput."""

WALK_SHARE = 0.3
"""Share of the budget the directory walk may use; reading needs the rest."""

CACHED_SEQ_MIB_PER_S = 5 * 1024.0
"""Sequential reads faster than this (5 GiB/s) on a disk-backed filesystem
almost surely came from the page cache: one reader on a PCIe 4 NVMe drive
reaches 2-4 GiB/s at most."""

CACHED_SMALL_READS_PER_S = 40_000.0
"""Small-file reads per second above this on a disk-backed filesystem are
page-cache speed: a cold read from NVMe costs ~80-100 µs (about 10,000/s)."""


@dataclass(frozen=True)
class StorageMeasurement:
    """What reading a bounded sample of the user's files showed.

    Attributes:
        path: the data directory measured.
        fs_type: filesystem type from the mount table (``ext4``, ``nfs4``, ``fuse.s3fs``).
        mount_point: where that filesystem is mounted.
        device: backing device (``/dev/nvme0n1p1``, ``server:/export``).
        is_network_fs: NFS, CIFS, Lustre, GPFS, CephFS, ... .
        is_fuse: a FUSE filesystem (s3fs, gcsfuse, sshfs, ...).
        rotational_flag: what the kernel claims for the block device (often
            wrong on virtual disks: trust the measurement).
        files_sampled: files opened for the measurement.
        bytes_read: bytes read in total.
        seq_read_mib_per_s: sequential read throughput of large files, MiB/s.
        small_file_reads_per_s: open+read+close of small files per second.
        duration_s: time the measurement took.
        budget_exhausted: the time budget ended the measurement early.
        note: anything that limited the measurement (page cache, too few files).
        entries_visited: directory entries listed by the walk.
        walk_complete: the walk saw the whole tree.
        seq_files_read / seq_bytes_read: files and bytes behind ``seq_read_mib_per_s``.
        small_files_read: files behind ``small_file_reads_per_s``.
        small_file_mean_bytes: mean size of those files, bytes.
        likely_cached: the numbers are too fast for the storage: they probably
            came from the page cache, so they say nothing about the disk.
    """

    path: str
    fs_type: str | None
    mount_point: str | None
    device: str | None
    is_network_fs: bool
    is_fuse: bool
    rotational_flag: bool | None
    files_sampled: int
    bytes_read: int
    seq_read_mib_per_s: float | None
    small_file_reads_per_s: float | None
    duration_s: float
    budget_exhausted: bool = False
    note: str | None = None
    entries_visited: int = 0
    walk_complete: bool = False
    seq_files_read: int = 0
    seq_bytes_read: int = 0
    small_files_read: int = 0
    small_file_mean_bytes: int | None = None
    likely_cached: bool = False


def _shown(path: str) -> str:
    """``path`` as it can appear on one line of an error message."""
    return path if path.isprintable() else repr(path)


def validate_data_dir(path: str) -> Path:
    """The resolved directory ``path`` names; :class:`InputError` when it is unusable.

    Unusable: missing, not a directory, or not listable by this user.
    """
    where = f"data directory {_shown(path)}"
    try:
        p = Path(path).expanduser()
    except RuntimeError:  # ~user of a user that does not exist
        raise InputError(f"{where}: does not exist (no such user's home)") from None
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{where}: does not exist") from None
    except PermissionError:
        raise InputError(f"{where}: is not accessible (permission denied)") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{where}: is not a directory")
    try:
        with os.scandir(p) as it:
            next(it, None)
    except PermissionError:
        raise InputError(f"{where}: is not readable (permission denied)") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot be read ({exc.strerror})") from None
    return p.resolve()


@dataclass(frozen=True)
class _FileRef:
    path: str
    size: int


@dataclass
class _Walk:
    files: list[_FileRef]
    entries_visited: int = 0
    complete: bool = False
    timed_out: bool = False


def _walk(root: Path, deadline: float, clock: Clock, max_entries: int) -> _Walk:
    """List regular files breadth first until the tree, the cap or the time ends.

    Hidden entries (``.git``, ``.cache``) are skipped: data loaders do not read
    them. Directory symlinks are not followed (loops); file symlinks are, as
    datasets are often links into a cache.
    """
    walk = _Walk(files=[])
    queue: deque[str] = deque([str(root)])
    while queue:
        directory = queue.popleft()
        try:
            it = os.scandir(directory)
        except OSError:
            continue
        with it:
            for entry in it:
                if walk.entries_visited >= max_entries:
                    return walk
                if clock() >= deadline:
                    walk.timed_out = True
                    return walk
                walk.entries_visited += 1
                if entry.name.startswith("."):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        queue.append(entry.path)
                    elif entry.is_file():
                        walk.files.append(_FileRef(entry.path, entry.stat().st_size))
                except OSError:
                    continue
    walk.complete = True
    return walk


def _open_read_only(path: str) -> int:
    """A read-only descriptor, without access-time updates where permitted."""
    noatime = getattr(os, "O_NOATIME", 0)
    if noatime:
        try:
            return os.open(path, os.O_RDONLY | noatime)
        except PermissionError:
            # O_NOATIME is only allowed on one's own files; others still open.
            pass
    return os.open(path, os.O_RDONLY)


def _drop_cache(fd: int) -> bool:
    """Ask the kernel to forget the file's cached pages; whether the hint was given."""
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is None:
        return False
    try:
        fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    return True


@dataclass
class _ReadStats:
    files: int = 0
    bytes: int = 0
    elapsed_s: float = 0.0
    timed_out: bool = False
    unreadable: int = 0
    cache_dropped: bool = True


def _read_sequential(
    files: list[_FileRef],
    deadline: float,
    clock: Clock,
    max_bytes: int,
    buffer: memoryview,
    drop_cache: bool,
) -> _ReadStats:
    """Read the files front to back, largest first, until ``max_bytes`` or the deadline."""
    stats = _ReadStats()
    start = clock()
    for ref in files:
        if stats.bytes >= max_bytes:
            break
        if clock() >= deadline:
            stats.timed_out = True
            break
        try:
            fd = _open_read_only(ref.path)
        except OSError:
            stats.unreadable += 1
            continue
        with io.FileIO(fd, "rb", closefd=True) as fh:
            if drop_cache:
                stats.cache_dropped &= _drop_cache(fd)
            stats.files += 1
            try:
                while stats.bytes < max_bytes:
                    n = fh.readinto(buffer[: min(len(buffer), max_bytes - stats.bytes)])
                    if not n:
                        break
                    stats.bytes += n
                    if clock() >= deadline:
                        stats.timed_out = True
                        break
            except OSError:
                stats.unreadable += 1
        if stats.timed_out:
            break
    stats.elapsed_s = clock() - start
    return stats


def _read_small(
    files: list[_FileRef], deadline: float, clock: Clock, buffer: memoryview, drop_cache: bool
) -> _ReadStats:
    """Open, read whole and close each file, as a map-style dataset's ``__getitem__`` does."""
    stats = _ReadStats()
    start = clock()
    for ref in files:
        if clock() >= deadline:
            stats.timed_out = True
            break
        try:
            fd = _open_read_only(ref.path)
            with io.FileIO(fd, "rb", closefd=True) as fh:
                if drop_cache:
                    stats.cache_dropped &= _drop_cache(fd)
                while n := fh.readinto(buffer):
                    stats.bytes += n
        except OSError:
            stats.unreadable += 1
            continue
        stats.files += 1
    stats.elapsed_s = clock() - start
    return stats


def _rate(amount: float, elapsed_s: float) -> float | None:
    return amount / elapsed_s if amount > 0 and elapsed_s > 0 else None


def measure_storage(
    path: str,
    budget_s: float = 10.0,
    clock: Clock = time.monotonic,
    *,
    mountinfo_text: str | None = None,
    sys_root: str = "/sys",
    max_entries: int = 50_000,
    max_seq_bytes: int = 512 * MIB,
    max_small_files: int = 2_000,
    chunk_bytes: int = 4 * MIB,
    seed: int = 0,
    drop_cache: bool = True,
) -> StorageMeasurement:
    """Measure how fast the data under ``path`` can be read, within ``budget_s`` seconds.

    Args:
        path: the data directory (validated: :class:`InputError` when unusable).
        budget_s: total time for walk and reads, seconds. The walk may use
            :data:`WALK_SHARE` of it; sequential and small-file reads share the rest.
        clock: monotonic seconds.
        mountinfo_text: mount table text; ``None`` reads ``/proc/self/mountinfo``.
        sys_root: where sysfs is mounted (for the rotational flag).
        max_entries: directory entries the walk may list.
        max_seq_bytes: bytes to read sequentially at most.
        max_small_files: small files to read at most.
        chunk_bytes: read size for sequential reads, bytes.
        seed: seed of the random pick of small files (reproducible samples).
        drop_cache: drop each file's cached pages before reading it.
    """
    root = validate_data_dir(path)
    start = clock()
    end = start + budget_s

    entries = (
        mounts.parse_mountinfo(mountinfo_text)
        if mountinfo_text is not None
        else mounts.read_mountinfo()
    )
    mount = mounts.find_mount(str(root), entries)
    rotational: bool | None = None
    if mount is not None:
        numbers = mounts.block_device_numbers(mount)
        if numbers is not None:
            rotational = mounts.rotational_flag(*numbers, sys_root=sys_root)
    fs_type = mount.fs_type if mount is not None else None

    walk = _walk(root, start + budget_s * WALK_SHARE, clock, max_entries)
    large = sorted((f for f in walk.files if f.size >= LARGE_FILE_MIN_BYTES), key=lambda f: -f.size)
    small_all = [f for f in walk.files if 0 < f.size <= SMALL_FILE_MAX_BYTES]
    # A random pick, as a shuffling loader reads them; not directory order,
    # which may be laid out contiguously on disk and flatter the numbers.
    small = random.Random(seed).sample(small_all, min(len(small_all), max_small_files))

    buffer = memoryview(bytearray(chunk_bytes))
    now = clock()
    seq_deadline = now + (end - now) * (0.5 if small else 1.0)
    seq = _read_sequential(large, seq_deadline, clock, max_seq_bytes, buffer, drop_cache)
    small_stats = _read_small(small, end, clock, buffer, drop_cache)

    seq_rate = _rate(seq.bytes / MIB, seq.elapsed_s)
    small_rate = _rate(small_stats.files, small_stats.elapsed_s)
    ram_fs = fs_type is not None and mounts.is_ram_fs(fs_type)
    likely_cached = not ram_fs and (
        (seq_rate is not None and seq_rate > CACHED_SEQ_MIB_PER_S)
        or (small_rate is not None and small_rate > CACHED_SMALL_READS_PER_S)
    )

    notes: list[str] = []
    if not walk.complete:
        reason = "time budget" if walk.timed_out else f"cap of {max_entries} entries"
        notes.append(f"listed {walk.entries_visited} entries before the {reason}")
    if not large:
        notes.append("no file of 1 MiB or more: sequential throughput not measured")
    if not small_all:
        notes.append("no file of 256 KiB or less: small-file rate not measured")
    unreadable = seq.unreadable + small_stats.unreadable
    if unreadable:
        notes.append(f"{unreadable} files could not be read")
    if ram_fs:
        notes.append(f"the data is in RAM ({fs_type}): these are memory speeds")
    elif drop_cache and not (seq.cache_dropped and small_stats.cache_dropped):
        notes.append("the page cache could not be dropped: numbers may come from memory")
    if likely_cached:
        notes.append("reads were faster than storage allows: likely served from the page cache")

    return StorageMeasurement(
        path=str(root),
        fs_type=fs_type,
        mount_point=mount.mount_point if mount is not None else None,
        device=mount.source if mount is not None else None,
        is_network_fs=fs_type is not None and mounts.is_network_fs(fs_type),
        is_fuse=fs_type is not None and mounts.is_fuse(fs_type),
        rotational_flag=rotational,
        files_sampled=seq.files + small_stats.files,
        bytes_read=seq.bytes + small_stats.bytes,
        seq_read_mib_per_s=seq_rate,
        small_file_reads_per_s=small_rate,
        duration_s=clock() - start,
        budget_exhausted=walk.timed_out or seq.timed_out or small_stats.timed_out,
        note="; ".join(notes) or None,
        entries_visited=walk.entries_visited,
        walk_complete=walk.complete,
        seq_files_read=seq.files,
        seq_bytes_read=seq.bytes,
        small_files_read=small_stats.files,
        small_file_mean_bytes=(
            small_stats.bytes // small_stats.files if small_stats.files else None
        ),
        likely_cached=likely_cached,
    )
