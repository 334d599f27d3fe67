"""Checks of the data directory's storage (``doctor --data-dir``), category ``io``.

The numbers come from one reader measuring a sample of the user's own files
(:func:`trainmedic.host.storage.measure_storage`). Measurements outrank flags:
a disk the kernel calls rotational that reads like an SSD is an SSD, and a
network filesystem that measured fast is reported as information only.
Thresholds and their reasoning: docs/doctor-checks.md, section "io".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.host.storage import StorageMeasurement

SEQ_WARN_MIB_PER_S = 200.0
"""One GPU training an image model consumes ~300 MB/s of JPEGs (an A100 runs
ResNet-50 at ~2,500-3,000 images/s × ~110 KB); below 200 MiB/s one reader
cannot keep even one such GPU fed."""

SEQ_ERROR_MIB_PER_S = 50.0
"""Below 50 MiB/s (a busy HDD, a throttled cloud volume) the disk is slower
than even a modest single-GPU job needs."""

SMALL_WARN_READS_PER_S = 1_000.0
"""ImageNet-style datasets are millions of ~110 KB files; the GPU above needs
~2,500-3,000 of them per second. A local SSD gives one reader 3,000-10,000/s;
under 1,000/s each file pays a network round trip or a disk seek."""

SMALL_ERROR_READS_PER_S = 200.0
"""Under 200 files/s an epoch of ImageNet (1.28 M files) takes more than 1.7
hours of reading for one reader: HDD seek or remote-metadata territory."""

MIN_SEQ_SAMPLE_BYTES = 8 * 1024 * 1024
"""A sequential rate from fewer bytes is too noisy to judge."""

MIN_SMALL_SAMPLE_FILES = 20
"""A small-file rate from fewer files is too noisy to judge."""

_FIX_SHARDS = (
    "pack small files into large shards (WebDataset tar, LMDB, TFRecord, Parquet) "
    "and read them sequentially"
)
_FIX_LOCAL = "copy the dataset to a local NVMe disk (or a local cache) before training"


def _judged_seq(m: StorageMeasurement) -> float | None:
    """The sequential rate when it is trustworthy enough to judge, else ``None``."""
    if m.likely_cached or m.seq_bytes_read < MIN_SEQ_SAMPLE_BYTES:
        return None
    return m.seq_read_mib_per_s


def _judged_small(m: StorageMeasurement) -> float | None:
    """The small-file rate when it is trustworthy enough to judge, else ``None``."""
    if m.likely_cached or m.small_files_read < MIN_SMALL_SAMPLE_FILES:
        return None
    return m.small_file_reads_per_s


def _seq_slow(m: StorageMeasurement) -> bool:
    rate = _judged_seq(m)
    return rate is not None and rate < SEQ_WARN_MIB_PER_S


def _small_slow(m: StorageMeasurement) -> bool:
    rate = _judged_small(m)
    return rate is not None and rate < SMALL_WARN_READS_PER_S


def _measured_fast(m: StorageMeasurement) -> bool:
    """At least one trustworthy number, and every trustworthy number healthy."""
    judged = _judged_seq(m) is not None or _judged_small(m) is not None
    return judged and not _seq_slow(m) and not _small_slow(m)


def _rates(m: StorageMeasurement) -> dict[str, Any]:
    return {
        "seq_read_mib_per_s": m.seq_read_mib_per_s,
        "small_file_reads_per_s": m.small_file_reads_per_s,
    }


def check_measured(facts: MachineFacts) -> Sequence[Finding]:
    """Always one info finding with the measured numbers."""
    m = facts.storage
    if m is None:
        return []
    seq = "n/a" if m.seq_read_mib_per_s is None else f"{m.seq_read_mib_per_s:,.0f} MiB/s"
    small = (
        "n/a" if m.small_file_reads_per_s is None else f"{m.small_file_reads_per_s:,.0f} files/s"
    )
    return [
        Finding(
            id="io.storage.measured",
            category=Category.IO,
            severity=Severity.INFO,
            title=(
                f"Data directory on {m.fs_type or 'an unknown filesystem'}: "
                f"sequential {seq}, small files {small} (one reader)"
            ),
            evidence={
                "path": m.path,
                "fs_type": m.fs_type,
                "mount_point": m.mount_point,
                "device": m.device,
                "rotational_flag": m.rotational_flag,
                **_rates(m),
                "small_file_mean_bytes": m.small_file_mean_bytes,
                "files_sampled": m.files_sampled,
                "bytes_read": m.bytes_read,
                "entries_visited": m.entries_visited,
                "duration_s": m.duration_s,
                "budget_exhausted": m.budget_exhausted,
                "likely_cached": m.likely_cached,
                "note": m.note,
            },
            subject=m.path,
        )
    ]


def check_remote_filesystem(facts: MachineFacts) -> Sequence[Finding]:
    """A network filesystem or FUSE: every read may cross the network or a daemon."""
    m = facts.storage
    if m is None or m.fs_type is None or not (m.is_network_fs or m.is_fuse):
        return []
    kind = "a network filesystem" if m.is_network_fs else "a FUSE filesystem"
    fast = _measured_fast(m)
    detail = (
        "It measured fast now, but shared storage slows down when other jobs load it "
        "and each file open costs a round trip."
        if fast
        else "Each read crosses the network (or a user-space daemon): latency per file "
        "and throughput are bounded by it, and other users share it."
    )
    return [
        Finding(
            id="io.network_filesystem" if m.is_network_fs else "io.fuse_filesystem",
            category=Category.IO,
            severity=Severity.INFO if fast else Severity.WARNING,
            title=f"The data directory is on {kind} ({m.fs_type})",
            evidence={
                "fs_type": m.fs_type,
                "mount_point": m.mount_point,
                "device": m.device,
                **_rates(m),
            },
            fix=f"{_FIX_LOCAL}; or {_FIX_SHARDS}",
            subject=m.path,
            detail=detail,
        )
    ]


def check_sequential_read(facts: MachineFacts) -> Sequence[Finding]:
    """Sequential throughput below what one GPU consumes."""
    m = facts.storage
    if m is None:
        return []
    rate = _judged_seq(m)
    if rate is None or rate >= SEQ_WARN_MIB_PER_S:
        return []
    severity = Severity.ERROR if rate < SEQ_ERROR_MIB_PER_S else Severity.WARNING
    return [
        Finding(
            id="io.slow_sequential_read",
            category=Category.IO,
            severity=severity,
            title=f"Sequential reads from the data directory reach only {rate:,.0f} MiB/s",
            evidence={
                "seq_read_mib_per_s": rate,
                "threshold_mib_per_s": (
                    SEQ_ERROR_MIB_PER_S if severity is Severity.ERROR else SEQ_WARN_MIB_PER_S
                ),
                "seq_bytes_read": m.seq_bytes_read,
                "seq_files_read": m.seq_files_read,
                "fs_type": m.fs_type,
            },
            fix=f"{_FIX_LOCAL}; cache decoded samples in RAM if they fit",
            subject=m.path,
            detail=(
                "A GPU training an image model at full speed consumes about 300 MB/s "
                "of compressed images."
            ),
        )
    ]


def check_small_files(facts: MachineFacts) -> Sequence[Finding]:
    """Opening and reading small files is slow: per-file latency dominates."""
    m = facts.storage
    if m is None:
        return []
    rate = _judged_small(m)
    if rate is None or rate >= SMALL_WARN_READS_PER_S:
        return []
    severity = Severity.ERROR if rate < SMALL_ERROR_READS_PER_S else Severity.WARNING
    latency_ms = 1000.0 / rate
    return [
        Finding(
            id="io.slow_small_files",
            category=Category.IO,
            severity=severity,
            title=(
                f"Small files read at only {rate:,.0f} files/s "
                f"({latency_ms:.1f} ms per file, one reader)"
            ),
            evidence={
                "small_file_reads_per_s": rate,
                "ms_per_file": latency_ms,
                "threshold_reads_per_s": (
                    SMALL_ERROR_READS_PER_S
                    if severity is Severity.ERROR
                    else SMALL_WARN_READS_PER_S
                ),
                "small_files_read": m.small_files_read,
                "small_file_mean_bytes": m.small_file_mean_bytes,
                "fs_type": m.fs_type,
            },
            fix=(
                f"{_FIX_SHARDS}; or {_FIX_LOCAL}; meanwhile raise DataLoader num_workers "
                "so more files are in flight at once"
            ),
            subject=m.path,
        )
    ]


def check_rotational(facts: MachineFacts) -> Sequence[Finding]:
    """Judge the kernel's rotational flag against the measurement."""
    m = facts.storage
    if m is None or m.rotational_flag is not True or m.is_network_fs:
        return []
    if _seq_slow(m) or _small_slow(m):
        return [
            Finding(
                id="io.rotational_disk",
                category=Category.IO,
                severity=Severity.WARNING,
                title="The data is on a spinning disk (HDD), and it reads slowly",
                evidence={"device": m.device, "rotational_flag": True, **_rates(m)},
                fix=(
                    f"move the dataset to an SSD or NVMe disk; if it must stay, {_FIX_SHARDS} "
                    "so the disk reads sequentially instead of seeking"
                ),
                subject=m.path,
            )
        ]
    if _measured_fast(m):
        return [
            Finding(
                id="io.rotational_flag_contradicted",
                category=Category.IO,
                severity=Severity.INFO,
                title=(
                    "The kernel calls the data disk rotational, but it reads like an SSD "
                    "(typical of virtual disks): going by the measurement"
                ),
                evidence={"device": m.device, "rotational_flag": True, **_rates(m)},
                subject=m.path,
            )
        ]
    return []


CHECKS = (
    check_measured,
    check_remote_filesystem,
    check_sequential_read,
    check_small_files,
    check_rotational,
)
