"""Storage measurement: real reads of a tmp tree, fake mount tables and sysfs, fake clocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainmedic.errors import InputError
from trainmedic.host import mounts
from trainmedic.host.storage import MIB, measure_storage, validate_data_dir

SMALL_BYTES = 8 * 1024
LARGE_BYTES = 2 * MIB


def make_dataset(root: Path, n_small: int = 120, n_large: int = 3) -> Path:
    """An ImageFolder-like tree: class dirs of small files, a shard dir, a hidden cache."""
    data = root / "data"
    for i in range(n_small):
        cls = data / "train" / f"class{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        (cls / f"img{i}.jpg").write_bytes(os.urandom(SMALL_BYTES))
    shards = data / "shards"
    shards.mkdir(parents=True)
    for i in range(n_large):
        (shards / f"shard{i}.tar").write_bytes(os.urandom(LARGE_BYTES))
    # Loaders never read hidden entries; neither may the measurement.
    hidden = data / ".cache"
    hidden.mkdir()
    (hidden / "blob").write_bytes(os.urandom(LARGE_BYTES))
    return data


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root`` (and root itself): size, mtime, ctime in ns."""
    out: dict[str, tuple[int, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


class TickClock:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_measures_a_sample_of_real_files_and_writes_nothing(tmp_path: Path) -> None:
    data = make_dataset(tmp_path)
    before = snapshot(tmp_path)

    m = measure_storage(str(data), budget_s=10.0)

    assert snapshot(tmp_path) == before
    assert m.path == str(data)
    assert m.walk_complete and not m.budget_exhausted
    # 3 dirs at the top (train, shards, .cache), 4 class dirs, 120 images, 3 shards.
    assert m.entries_visited == 3 + 4 + 120 + 3
    assert (m.seq_files_read, m.seq_bytes_read) == (3, 3 * LARGE_BYTES)
    assert m.small_files_read == 120
    assert m.small_file_mean_bytes == SMALL_BYTES
    assert m.files_sampled == 123
    assert m.bytes_read == 3 * LARGE_BYTES + 120 * SMALL_BYTES
    assert m.seq_read_mib_per_s is not None and m.seq_read_mib_per_s > 0
    assert m.small_file_reads_per_s is not None and m.small_file_reads_per_s > 0
    assert 0 < m.duration_s < 10.0
    assert m.fs_type is not None and m.mount_point is not None


def test_reads_leave_file_access_times_alone(tmp_path: Path) -> None:
    # O_NOATIME: allowed on files we own, which the test's files are.
    data = make_dataset(tmp_path, n_small=10, n_large=1)
    files = [p for p in data.rglob("*") if p.is_file()]
    before = {p: p.stat().st_atime_ns for p in files}
    m = measure_storage(str(data))
    assert m.files_sampled == 11
    assert {p: p.stat().st_atime_ns for p in files} == before


def test_sample_caps_bound_the_reads(tmp_path: Path) -> None:
    data = make_dataset(tmp_path)
    m = measure_storage(str(data), max_seq_bytes=3 * MIB, max_small_files=25)
    # Largest first, each file read front to back until the byte cap.
    assert (m.seq_files_read, m.seq_bytes_read) == (2, 3 * MIB)
    assert m.small_files_read == 25
    assert not m.budget_exhausted


def test_entry_cap_stops_the_walk(tmp_path: Path) -> None:
    data = make_dataset(tmp_path)
    m = measure_storage(str(data), max_entries=10)
    assert m.entries_visited == 10
    assert not m.walk_complete
    assert m.note is not None and "cap of 10 entries" in m.note


def test_clock_budget_stops_the_walk(tmp_path: Path) -> None:
    data = make_dataset(tmp_path)
    # One simulated second per clock read: the walk's share (3 s of 10 s) runs
    # out after a couple of entries, long before the tree does.
    m = measure_storage(str(data), budget_s=10.0, clock=TickClock(1.0))
    assert m.budget_exhausted
    assert not m.walk_complete
    assert 0 < m.entries_visited < 5
    assert m.note is not None and "time budget" in m.note


def test_clock_budget_stops_a_long_sequential_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "big.bin").write_bytes(os.urandom(4 * MIB))
    m = measure_storage(str(data), budget_s=20.0, clock=TickClock(1.0), chunk_bytes=64 * 1024)
    assert m.walk_complete
    assert m.budget_exhausted
    assert m.seq_files_read == 1
    assert 0 < m.seq_bytes_read < 4 * MIB
    assert m.seq_bytes_read % (64 * 1024) == 0


def test_empty_directory_measures_nothing_and_says_why(tmp_path: Path) -> None:
    m = measure_storage(str(tmp_path))
    assert (m.files_sampled, m.bytes_read) == (0, 0)
    assert m.seq_read_mib_per_s is None and m.small_file_reads_per_s is None
    assert m.note is not None
    assert "sequential throughput not measured" in m.note
    assert "small-file rate not measured" in m.note


def test_validate_data_dir_rejects_missing_and_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InputError, match="does not exist") as err:
        validate_data_dir(str(missing))
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(InputError, match="is not a directory") as err:
        validate_data_dir(str(f))
    assert str(f) in str(err.value)
    with pytest.raises(InputError, match="does not exist"):
        measure_storage(str(missing))
    assert validate_data_dir(str(tmp_path)) == tmp_path.resolve()


def test_validate_data_dir_rejects_unreadable(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        with pytest.raises(InputError, match="permission denied") as err:
            validate_data_dir(str(locked))
    finally:
        locked.chmod(0o700)
    assert str(locked) in str(err.value)


MOUNTINFO = "\n".join(
    [
        r"22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
        r"30 22 0:52 / /mnt/my\040data rw,relatime shared:7 master:2 - nfs4 srv:/export rw",
        r"31 22 0:60 / /mnt/s3 rw,nosuid - fuse.s3fs s3fs rw,user_id=0",
        r"32 22 0:61 / /mnt/stack rw - tmpfs tmpfs rw",
        r"33 22 259:2 / /mnt/stack rw - xfs /dev/nvme0n1p2 rw",
        "garbage line",
    ]
)


def test_parse_mountinfo_decodes_escapes_and_skips_garbage() -> None:
    entries = mounts.parse_mountinfo(MOUNTINFO)
    assert [e.mount_point for e in entries] == [
        "/",
        "/mnt/my data",
        "/mnt/s3",
        "/mnt/stack",
        "/mnt/stack",
    ]
    nfs = entries[1]
    assert (nfs.fs_type, nfs.source, nfs.major, nfs.minor) == ("nfs4", "srv:/export", 0, 52)


@pytest.mark.parametrize(
    ("path", "mount_point", "fs_type"),
    [
        ("/mnt/my data/train", "/mnt/my data", "nfs4"),
        ("/mnt/my data", "/mnt/my data", "nfs4"),
        ("/mnt/my", "/", "ext4"),  # a prefix of a mount point is not inside it
        ("/mnt/s3/bucket/x", "/mnt/s3", "fuse.s3fs"),
        ("/mnt/stack/a", "/mnt/stack", "xfs"),  # mounted on top of the tmpfs
        ("/home/u", "/", "ext4"),
    ],
)
def test_find_mount_takes_the_longest_match(path: str, mount_point: str, fs_type: str) -> None:
    entry = mounts.find_mount(path, mounts.parse_mountinfo(MOUNTINFO))
    assert entry is not None
    assert (entry.mount_point, entry.fs_type) == (mount_point, fs_type)


@pytest.mark.parametrize(
    ("fs_type", "network", "fuse"),
    [
        ("nfs", True, False),
        ("nfs4", True, False),
        ("cifs", True, False),
        ("lustre", True, False),
        ("gpfs", True, False),
        ("ceph", True, False),
        ("beegfs", True, False),
        ("9p", True, False),
        ("fuse.s3fs", True, True),
        ("fuse.gcsfuse", True, True),
        ("fuse.sshfs", True, True),
        ("fuse.rclone", True, True),
        ("fuse.juicefs", True, True),
        ("fuseblk", False, True),
        ("fuse.lxcfs", False, True),
        ("ext4", False, False),
        ("xfs", False, False),
        ("virtiofs", False, False),
        ("tmpfs", False, False),
    ],
)
def test_filesystem_classification(fs_type: str, network: bool, fuse: bool) -> None:
    assert mounts.is_network_fs(fs_type) is network
    assert mounts.is_fuse(fs_type) is fuse


def make_sysfs(root: Path) -> Path:
    """A fake /sys: sda (HDD) with partition sda1, nvme0n1 (SSD) with nvme0n1p1."""
    sys_root = root / "sys"
    disks = {"sda": ("sda1", "1", "8:0", "8:1"), "nvme0n1": ("nvme0n1p1", "0", "259:0", "259:1")}
    (sys_root / "dev" / "block").mkdir(parents=True)
    for disk, (part, flag, disk_nr, part_nr) in disks.items():
        disk_dir = sys_root / "devices" / "pci0" / "block" / disk
        (disk_dir / "queue").mkdir(parents=True)
        (disk_dir / "queue" / "rotational").write_text(flag + "\n")
        (disk_dir / part).mkdir()
        (disk_dir / part / "partition").write_text("1\n")
        (sys_root / "dev" / "block" / disk_nr).symlink_to(disk_dir)
        (sys_root / "dev" / "block" / part_nr).symlink_to(disk_dir / part)
    return sys_root


@pytest.mark.parametrize(
    ("major", "minor", "flag"),
    [(8, 0, True), (8, 1, True), (259, 0, False), (259, 1, False), (7, 9, None), (0, 52, None)],
)
def test_rotational_flag_maps_partitions_to_their_disk(
    tmp_path: Path, major: int, minor: int, flag: bool | None
) -> None:
    assert mounts.rotational_flag(major, minor, sys_root=str(make_sysfs(tmp_path))) is flag


def test_measurement_reports_mount_and_rotational_flag_from_seams(tmp_path: Path) -> None:
    data = make_dataset(tmp_path, n_small=8, n_large=1)
    table = f"40 1 8:1 / {data} rw - ext4 /dev/sda1 rw\n"
    m = measure_storage(str(data), mountinfo_text=table, sys_root=str(make_sysfs(tmp_path)))
    assert (m.fs_type, m.mount_point, m.device) == ("ext4", str(data), "/dev/sda1")
    assert m.rotational_flag is True
    assert not m.is_network_fs and not m.is_fuse


def test_measurement_classifies_network_and_ram_filesystems(tmp_path: Path) -> None:
    data = make_dataset(tmp_path, n_small=8, n_large=1)
    escaped = str(data).replace(" ", "\\040")
    nfs = measure_storage(
        str(data), mountinfo_text=f"40 1 0:52 / {escaped} rw - nfs4 srv:/export rw\n"
    )
    assert nfs.is_network_fs and not nfs.is_fuse
    assert (nfs.device, nfs.rotational_flag) == ("srv:/export", None)
    ram = measure_storage(str(data), mountinfo_text=f"40 1 0:53 / {escaped} rw - tmpfs t rw\n")
    assert ram.note is not None and "in RAM (tmpfs)" in ram.note
    assert not ram.likely_cached
