"""Which filesystem holds a path, what kind it is, and what disk is under it.

Reads the mount table from ``/proc/self/mountinfo`` and the block devices'
flags from sysfs. Both are seams (text and root directory) so tests feed
hand-written tables and fake sysfs trees. Everything here is read-only.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO_PATH = "/proc/self/mountinfo"

# Filesystems whose reads cross a network (or a SAN shared with other hosts).
NETWORK_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "coda",
        "lustre",
        "gpfs",
        "ceph",
        "glusterfs",
        "beegfs",
        "orangefs",
        "pvfs2",
        "wekafs",
        "panfs",
        "gfs2",
        "ocfs2",
        # 9p carries every read over a virtio or vsock channel to another
        # machine's filesystem (WSL2's /mnt/c, QEMU virtfs) and is
        # notoriously slow on metadata.
        "9p",
        "davfs",
    }
)

# FUSE subtypes that fetch from a remote store. Local FUSE filesystems
# (fuseblk/ntfs-3g, lxcfs, squashfuse) are FUSE but not network.
NETWORK_FUSE_SUBTYPES = frozenset(
    {
        "s3fs",
        "gcsfuse",
        "sshfs",
        "rclone",
        "juicefs",
        "glusterfs",
        "ceph-fuse",
        "cephfs",
        "goofys",
        "geesefs",
        "mountpoint-s3",
        "blobfuse",
        "blobfuse2",
        "alluxio-fuse",
        "davfs2",
        "seaweedfs",
        "cvmfs2",
        "lizardfs",
        "moosefs",
        "mfs",
    }
)

# Filesystems that live in RAM: read speed there is memory speed.
RAM_FS_TYPES = frozenset({"tmpfs", "ramfs"})

# virtiofs shares a directory of the VM host through shared memory and the
# host's page cache; it is local storage as far as a training job is
# concerned, so it is deliberately absent above. The measurement judges it.

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/self/mountinfo``.

    Attributes:
        mount_point: where the filesystem is mounted (escapes decoded).
        fs_type: ``ext4``, ``nfs4``, ``fuse.s3fs``, ...
        source: what is mounted (``/dev/nvme0n1p1``, ``server:/export``).
        major / minor: the device number the kernel gives the filesystem.
        super_options: filesystem-specific options (``upperdir=...`` etc.).
    """

    mount_point: str
    fs_type: str
    source: str
    major: int
    minor: int
    super_options: str = ""
    root: str = "/"
    """The path inside the filesystem that is mounted (a cgroup's own path)."""


def _unescape(field: str) -> str:
    """Decode the kernel's octal escapes (``\\040`` is a space)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse mountinfo text; malformed lines are skipped (the table is best effort)."""
    entries: list[MountEntry] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            major_s, minor_s = fields[2].split(":")
            entries.append(
                MountEntry(
                    mount_point=_unescape(fields[4]),
                    fs_type=_unescape(fields[sep + 1]),
                    source=_unescape(fields[sep + 2]),
                    major=int(major_s),
                    minor=int(minor_s),
                    super_options=fields[sep + 3] if len(fields) > sep + 3 else "",
                    root=_unescape(fields[3]),
                )
            )
        except (ValueError, IndexError):
            continue
    return entries


def read_mountinfo(path: str = MOUNTINFO_PATH) -> list[MountEntry]:
    """The mount table of this process, or ``[]`` where there is none (not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []


def find_mount(path: str, entries: list[MountEntry]) -> MountEntry | None:
    """The mount holding absolute ``path``: the longest matching mount point.

    Among equal mount points the later line wins: it was mounted on top.
    """
    best: MountEntry | None = None
    for entry in entries:
        mp = entry.mount_point
        inside = mp == "/" or path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = entry
    return best


def is_fuse(fs_type: str) -> bool:
    """FUSE: every read goes through a user-space daemon."""
    return fs_type in ("fuse", "fuseblk") or fs_type.startswith("fuse.")


def is_network_fs(fs_type: str) -> bool:
    """Whether reads of ``fs_type`` cross a network."""
    if fs_type in NETWORK_FS_TYPES:
        return True
    return fs_type.startswith("fuse.") and fs_type[len("fuse.") :] in NETWORK_FUSE_SUBTYPES


def is_ram_fs(fs_type: str) -> bool:
    """Whether ``fs_type`` keeps its files in RAM."""
    return fs_type in RAM_FS_TYPES


def _read_flag(path: Path) -> bool | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return {"0": False, "1": True}.get(text)


def rotational_flag(major: int, minor: int, sys_root: str = "/sys") -> bool | None:
    """The kernel's ``queue/rotational`` flag of a block device, or ``None``.

    A partition has no queue of its own; its disk (the parent directory in
    sysfs) does. dm and md devices have their own queue, which the kernel
    derives from the devices below them.
    """
    if major == 0:
        # Anonymous device numbers (NFS, tmpfs, overlay, btrfs) name no disk.
        return None
    dev_dir = Path(sys_root, "dev", "block", f"{major}:{minor}")
    try:
        real = dev_dir.resolve(strict=True)
    except OSError:
        return None
    flag = _read_flag(real / "queue" / "rotational")
    if flag is None and (real / "partition").exists():
        flag = _read_flag(real.parent / "queue" / "rotational")
    return flag


def block_device_numbers(entry: MountEntry) -> tuple[int, int] | None:
    """The disk's device numbers for a mount, or ``None`` when it has no disk.

    btrfs reports an anonymous device number in the mount table; its source
    (``/dev/...``) still names the real device.
    """
    if entry.major != 0:
        return entry.major, entry.minor
    if entry.source.startswith("/dev/"):
        try:
            st = os.stat(entry.source)
        except OSError:
            return None
        if stat.S_ISBLK(st.st_mode):
            return os.major(st.st_rdev), os.minor(st.st_rdev)
    return None
