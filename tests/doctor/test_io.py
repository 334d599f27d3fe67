"""io checks: data directory storage judged from hand-built measurements."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from support.facts import finding_keys, make_facts
from trainmedic.doctor.checks.io import (
    CHECKS,
    check_measured,
    check_remote_filesystem,
    check_rotational,
    check_sequential_read,
    check_small_files,
)
from trainmedic.findings.model import Category, Finding
from trainmedic.host.storage import MIB, StorageMeasurement

DATA = "/data/imagenet"


def make_storage(**overrides: Any) -> StorageMeasurement:
    """A healthy local NVMe: 2 GiB/s sequential, 8,000 small files/s, enough samples."""
    m = StorageMeasurement(
        path=DATA,
        fs_type="ext4",
        mount_point="/data",
        device="/dev/nvme0n1p1",
        is_network_fs=False,
        is_fuse=False,
        rotational_flag=False,
        files_sampled=2003,
        bytes_read=512 * MIB + 2000 * 110_000,
        seq_read_mib_per_s=2048.0,
        small_file_reads_per_s=8000.0,
        duration_s=1.2,
        entries_visited=50_000,
        walk_complete=False,
        seq_files_read=3,
        seq_bytes_read=512 * MIB,
        small_files_read=2000,
        small_file_mean_bytes=110_000,
    )
    return replace(m, **overrides)


def run_all(storage: StorageMeasurement | None) -> list[Finding]:
    facts = make_facts(storage=storage)
    return [f for check in CHECKS for f in check(facts)]


NFS = {"fs_type": "nfs4", "device": "srv:/export", "is_network_fs": True, "rotational_flag": None}


def test_no_data_dir_gives_no_io_finding() -> None:
    assert run_all(None) == []


def test_healthy_local_disk_gives_only_the_numbers() -> None:
    findings = run_all(make_storage())
    assert finding_keys(findings) == {("io.storage.measured", "info", DATA)}
    (info,) = findings
    assert info.category is Category.IO
    assert info.evidence["seq_read_mib_per_s"] == 2048.0
    assert info.evidence["small_file_reads_per_s"] == 8000.0
    assert "2,048 MiB/s" in info.title and "8,000 files/s" in info.title


def test_measured_info_shows_missing_numbers_as_na() -> None:
    m = make_storage(seq_read_mib_per_s=None, seq_bytes_read=0, note="no file of 1 MiB or more")
    (info,) = check_measured(make_facts(storage=m))
    assert "sequential n/a" in info.title
    assert info.evidence["note"] == "no file of 1 MiB or more"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, set()),
        (
            {**NFS, "small_file_reads_per_s": 400.0},
            {("io.network_filesystem", "warning", DATA)},
        ),
        # Fast now: information, not a warning (measurements outrank the flag).
        (NFS, {("io.network_filesystem", "info", DATA)}),
        # Fast only because the page cache answered: still a warning.
        ({**NFS, "likely_cached": True}, {("io.network_filesystem", "warning", DATA)}),
        (
            {"fs_type": "fuse.s3fs", "is_network_fs": True, "is_fuse": True,
             "seq_read_mib_per_s": 90.0},
            {("io.network_filesystem", "warning", DATA)},
        ),
        (
            {"fs_type": "fuseblk", "is_fuse": True, "small_file_reads_per_s": 600.0},
            {("io.fuse_filesystem", "warning", DATA)},
        ),
    ],
)  # fmt: skip
def test_remote_filesystem(overrides: dict[str, Any], expected: set[Any]) -> None:
    findings = check_remote_filesystem(make_facts(storage=make_storage(**overrides)))
    assert finding_keys(findings) == expected


def test_network_filesystem_finding_names_the_fix() -> None:
    (finding,) = check_remote_filesystem(
        make_facts(storage=make_storage(**NFS, seq_read_mib_per_s=100.0))
    )
    assert "nfs4" in finding.title
    assert "local NVMe" in finding.fix and "WebDataset" in finding.fix
    assert finding.evidence["device"] == "srv:/export"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"seq_read_mib_per_s": 200.0}, set()),
        ({"seq_read_mib_per_s": 199.0}, {("io.slow_sequential_read", "warning", DATA)}),
        ({"seq_read_mib_per_s": 50.0}, {("io.slow_sequential_read", "warning", DATA)}),
        ({"seq_read_mib_per_s": 49.0}, {("io.slow_sequential_read", "error", DATA)}),
        # Too few bytes to judge, or served from the page cache: no verdict.
        ({"seq_read_mib_per_s": 30.0, "seq_bytes_read": 4 * MIB}, set()),
        ({"seq_read_mib_per_s": 30.0, "likely_cached": True}, set()),
        ({"seq_read_mib_per_s": None, "seq_bytes_read": 0}, set()),
    ],
)
def test_sequential_read_thresholds(overrides: dict[str, Any], expected: set[Any]) -> None:
    findings = check_sequential_read(make_facts(storage=make_storage(**overrides)))
    assert finding_keys(findings) == expected
    for f in findings:
        assert f.evidence["seq_read_mib_per_s"] == overrides["seq_read_mib_per_s"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"small_file_reads_per_s": 1000.0}, set()),
        ({"small_file_reads_per_s": 999.0}, {("io.slow_small_files", "warning", DATA)}),
        ({"small_file_reads_per_s": 200.0}, {("io.slow_small_files", "warning", DATA)}),
        ({"small_file_reads_per_s": 120.0}, {("io.slow_small_files", "error", DATA)}),
        ({"small_file_reads_per_s": 120.0, "small_files_read": 10}, set()),
        ({"small_file_reads_per_s": 120.0, "likely_cached": True}, set()),
    ],
)
def test_small_file_thresholds(overrides: dict[str, Any], expected: set[Any]) -> None:
    findings = check_small_files(make_facts(storage=make_storage(**overrides)))
    assert finding_keys(findings) == expected


def test_small_file_finding_gives_the_per_file_latency() -> None:
    (f,) = check_small_files(make_facts(storage=make_storage(small_file_reads_per_s=400.0)))
    assert f.evidence["ms_per_file"] == pytest.approx(2.5)
    assert "2.5 ms per file" in f.title
    assert "num_workers" in f.fix


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # The kernel says rotational and the disk reads slowly: an HDD.
        (
            {"rotational_flag": True, "small_file_reads_per_s": 90.0},
            {("io.rotational_disk", "warning", DATA)},
        ),
        (
            {"rotational_flag": True, "seq_read_mib_per_s": 150.0},
            {("io.rotational_disk", "warning", DATA)},
        ),
        # The flag says rotational, the measurement says SSD (virtual disks).
        ({"rotational_flag": True}, {("io.rotational_flag_contradicted", "info", DATA)}),
        # Cached numbers neither confirm nor contradict the flag.
        ({"rotational_flag": True, "likely_cached": True}, set()),
        ({"rotational_flag": False, "small_file_reads_per_s": 90.0}, set()),
        ({"rotational_flag": None, "small_file_reads_per_s": 90.0}, set()),
    ],
)
def test_rotational_flag_is_judged_by_the_measurement(
    overrides: dict[str, Any], expected: set[Any]
) -> None:
    findings = check_rotational(make_facts(storage=make_storage(**overrides)))
    assert finding_keys(findings) == expected


def test_slow_hdd_reports_cause_and_symptoms_once_each() -> None:
    hdd = make_storage(
        rotational_flag=True, device="/dev/sda1", seq_read_mib_per_s=120.0,
        small_file_reads_per_s=95.0,
    )  # fmt: skip
    assert finding_keys(run_all(hdd)) == {
        ("io.storage.measured", "info", DATA),
        ("io.slow_sequential_read", "warning", DATA),
        ("io.slow_small_files", "error", DATA),
        ("io.rotational_disk", "warning", DATA),
    }
