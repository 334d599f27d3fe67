"""Resilient data: transient errors are retried, bad samples skipped up to a cap, all logged."""

from __future__ import annotations

import errno
import json
import logging
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from trainmedic.remedies.resilient import (
    ResilientDataset,
    SampleTimeout,
    TooManyBadSamples,
    is_transient,
)


class Flaky:
    """Sample ``flaky`` fails ``fails`` times with EIO, then reads; ``corrupt`` never decodes."""

    def __init__(
        self, n: int = 10, flaky: int = 3, fails: int = 2, corrupt: tuple[int, ...] = (5,)
    ):
        self.n = n
        self.flaky = flaky
        self.fails = fails
        self.corrupt = corrupt
        self.calls: dict[int, int] = {}
        self.samples = [(f"/data/{i:03d}.jpg", i % 2) for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.calls[i] = self.calls.get(i, 0) + 1
        if i in self.corrupt:
            raise ValueError(f"cannot identify image file {self.samples[i][0]!r}")
        if i == self.flaky and self.calls[i] <= self.fails:
            raise OSError(errno.EIO, "Input/output error")
        return torch.tensor([float(i)])


def recording() -> tuple[list[float], object]:
    sleeps: list[float] = []
    return sleeps, sleeps.append


def test_a_flaky_read_is_retried_with_growing_backoff_and_jitter() -> None:
    sleeps, sleep = recording()
    ds = ResilientDataset(Flaky(), retries=3, backoff_s=0.5, sleep=sleep)  # type: ignore[arg-type]
    assert float(ds[3]) == 3.0
    assert len(sleeps) == 2
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 1.5  # 0.5 * 2^k + jitter < 0.5
    assert ds.retried == 1 and ds.bad == {}


def test_a_corrupt_sample_is_skipped_logged_and_replaced_by_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ds = ResilientDataset(Flaky(), sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger="trainmedic.remedies"):
        assert float(ds[5]) == 6.0
        assert float(ds[5]) == 6.0  # known bad: not read again
    assert ds.dataset.calls[5] == 1  # a persistent error is not retried
    assert list(ds.bad) == [5] and "cannot identify image file" in ds.bad[5]
    assert "skipping index 5 (/data/005.jpg)" in caplog.text


def test_transient_errors_that_outlast_the_retries_skip_the_sample() -> None:
    sleeps, sleep = recording()
    ds = ResilientDataset(Flaky(fails=99), retries=2, sleep=sleep)  # type: ignore[arg-type]
    assert float(ds[3]) == 4.0
    assert ds.dataset.calls[3] == 3 and len(sleeps) == 2
    assert "OSError" in ds.bad[3]


def test_too_many_bad_samples_end_the_run_with_a_clear_message() -> None:
    ds = ResilientDataset(Flaky(corrupt=(1, 2, 3, 4)), max_skips=2, sleep=lambda s: None)
    with pytest.raises(TooManyBadSamples, match="3 samples failed to load, more than max_skips=2"):
        ds[1]


def test_a_read_slower_than_the_timeout_is_abandoned_and_retried() -> None:
    release = threading.Event()

    class Hangs:
        calls = 0

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            Hangs.calls += 1
            if Hangs.calls == 1:
                release.wait(30)  # hung storage; the abandoned thread ends with the test
            return i

    # Retries to spare: on a loaded machine even a good read's thread may start late.
    ds = ResilientDataset(Hangs(), timeout_s=0.3, retries=3, sleep=lambda s: None)
    try:
        assert ds[2] == 2
        assert Hangs.calls >= 2 and ds.retried == 1 and ds.bad == {}
    finally:
        release.set()


def test_which_errors_are_transient() -> None:
    assert is_transient(OSError(errno.EIO, "io"))
    assert is_transient(OSError(errno.ESTALE, "stale NFS handle"))
    assert is_transient(SampleTimeout("slow"))
    assert is_transient(ConnectionResetError())
    assert not is_transient(FileNotFoundError(errno.ENOENT, "gone"))
    assert not is_transient(ValueError("truncated"))


def test_inside_dataloader_workers_training_reaches_the_end_and_the_skip_log_counts_all(
    tmp_path: Path,
) -> None:
    log = tmp_path / "skipped.jsonl"
    ds = ResilientDataset(
        Flaky(n=64, flaky=3, corrupt=(5, 40)), backoff_s=0.001, skip_log=log, max_skips=5
    )
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    seen = torch.cat([b for b in loader]).flatten().tolist()
    assert len(seen) == 64  # batches keep their size
    assert 5.0 not in seen and 40.0 not in seen and 3.0 in seen
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(entry["index"] for entry in lines) == [5, 40]
    assert {entry["sample"] for entry in lines} == {
        "index 5 (/data/005.jpg)",
        "index 40 (/data/040.jpg)",
    }


def test_attributes_of_the_wrapped_dataset_stay_reachable() -> None:
    ds = ResilientDataset(Flaky())
    assert ds.samples[0] == ("/data/000.jpg", 0)
    assert len(ds) == 10
