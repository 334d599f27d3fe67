"""Measuring loader settings, alone or beside a training step."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from trainmedic.remedies.loader_measure import (
    DatasetProfile,
    IndexStream,
    LoaderBench,
    LoaderSettings,
)

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from loader_data import Stream, Waiting


def test_a_training_step_beside_the_loader_shows_what_overlapping_gains() -> None:
    # 20 ms to load a batch, 20 ms to train on it: in the training process the two
    # add up; one worker overlaps them, which the loader alone would never show.
    # Few, long waits: a loaded machine oversleeps each one by a millisecond or two.
    bench = LoaderBench(Waiting(n=512, wait_s=0.01), batch_size=2, step_s=0.02)
    # The step as a wait, not a spin: the verdict must not depend on a free core.
    bench._train_step = lambda: time.sleep(0.02)  # type: ignore[method-assign]
    serial = bench.measure(LoaderSettings(), window_s=0.5, segments=2)
    overlapped = bench.measure(LoaderSettings(num_workers=1), window_s=0.5, segments=2)
    assert serial.error is None and overlapped.error is None
    assert overlapped.rate > 1.4 * serial.rate
    assert overlapped.rate < 2 / 0.02 * 1.05  # never faster than the step allows


def test_a_trial_records_its_start_up_and_the_memory_of_its_workers() -> None:
    bench = LoaderBench(Waiting(n=256, wait_s=0.0005), batch_size=8)
    trial = bench.measure(LoaderSettings(num_workers=2), window_s=0.1, segments=2)
    assert trial.startup_s is not None and trial.startup_s > 0
    assert trial.worker_rss_bytes is not None and trial.worker_rss_bytes > 0
    assert len(trial.rates) == 2 and trial.rate_ci is not None


def test_a_failing_configuration_is_a_trial_with_its_error() -> None:
    bench = LoaderBench(Waiting(n=64), batch_size=8, loader_kwargs={"timeout": -1})
    trial = bench.measure(LoaderSettings(num_workers=1), window_s=0.1, segments=1)
    assert trial.error is not None and trial.rate == 0.0


def test_the_profile_tells_waiting_from_computing() -> None:
    waiting = LoaderBench(Waiting(n=64, wait_s=0.003), batch_size=8).profile(0.1)
    # The profile leaves out the time each woken sleep spent waiting for a core, so
    # a busy machine may read a hair under the 3 ms each sample sleeps.
    assert waiting.kind == "latency" and 0.0027 <= waiting.sample_s < 0.006
    assert waiting.batch_bytes == 8 * (4 * 4 + 8)  # a float32 x4 and an int64 label
    iterable = LoaderBench(Stream(), batch_size=4)
    assert iterable.iterable and iterable.profile(0.05).samples >= 3


@pytest.mark.parametrize(("share", "kind"), [(0.9, "cpu"), (0.5, "mixed"), (0.1, "latency")])
def test_profile_kinds(share: float, kind: str) -> None:
    assert DatasetProfile(0.001, share, None, 10).kind == kind


def test_the_index_stream_continues_across_trials_and_covers_every_index() -> None:
    stream = IndexStream(10, 4, seed=1)
    first = next(iter(stream))
    second = next(iter(stream))  # a new iterator continues where the last stopped
    third = next(iter(stream))
    assert len(set(first + second)) == 8
    assert set(first + second + third[:2]) == set(range(10))


def test_the_training_step_keeps_the_process_busy_for_its_time() -> None:
    ticks = iter(i * 0.004 for i in range(1000))
    bench = LoaderBench(Waiting(n=8), batch_size=2, step_s=0.02, clock=lambda: next(ticks))
    bench._train_step()
    assert next(ticks) == pytest.approx(0.024)  # it read the clock until 0.02 had passed
