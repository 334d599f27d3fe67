"""The probe's own thread: step rows and the idle watch, driven by hand."""

from __future__ import annotations

from typing import Any

import pytest

from trainmedic.channel.wire import STEP_COLUMNS, StepBatch, decode_line
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import IDLE_STEPS_S, Probe
from trainmedic.probe.sampling import StepStats
from trainmedic.probe.steps import StepDraft, StepTracker


class Watch:
    def __init__(self) -> None:
        self.requests = 0

    def request(self) -> None:
        self.requests += 1


def make_probe() -> tuple[Probe, StepTracker, Watch]:
    probe = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()))
    tracker = probe._ensure_tracker()
    watch = Watch()
    probe.forward = watch  # type: ignore[assignment]
    probe.step_stats = StepStats()
    return probe, tracker, watch


def train_step(tracker: StepTracker, t: float) -> None:
    tracker.forward_enter(t, 8, True, None)
    tracker.forward_exit(t + 0.01, True)
    tracker.backward_enter(t + 0.01)
    tracker.backward_exit(t + 0.02)
    tracker.optimizer_enter(t + 0.02)
    tracker.optimizer_exit(t + 0.03, "sgd")


def test_steps_stopping_while_work_goes_on_asks_once_for_a_discovery() -> None:
    probe, tracker, watch = make_probe()
    train_step(tracker, 0.0)
    probe._watch_idle(10.0)
    tracker.loader_enter(1.0)  # an evaluation: batches, no steps
    tracker.loader_exit(1.1, 8, True)
    probe._watch_idle(10.0 + IDLE_STEPS_S / 2)
    assert watch.requests == 0  # not yet
    probe._watch_idle(10.0 + IDLE_STEPS_S)
    probe._watch_idle(10.0 + 2 * IDLE_STEPS_S)
    assert watch.requests == 1  # once per idle period
    train_step(tracker, 2.0)
    probe._watch_idle(20.0)
    tracker.loader_enter(3.0)
    tracker.loader_exit(3.1, 8, True)
    probe._watch_idle(20.0 + IDLE_STEPS_S)
    assert watch.requests == 2


def test_a_job_doing_nothing_is_not_a_reason_to_look() -> None:
    probe, tracker, watch = make_probe()
    train_step(tracker, 0.0)
    probe._watch_idle(10.0)
    probe._watch_idle(10.0 + 10 * IDLE_STEPS_S)  # a hang or a sleep: no work either
    assert watch.requests == 0


def test_long_steps_are_not_idle_periods() -> None:
    probe, tracker, watch = make_probe()
    assert probe.step_stats is not None
    for _ in range(20):
        probe.step_stats.add(5.0, 0.0)  # 5 s steps
    train_step(tracker, 0.0)
    probe._watch_idle(10.0)
    tracker.loader_enter(1.0)
    tracker.loader_exit(1.1, 8, True)
    probe._watch_idle(10.0 + IDLE_STEPS_S * 2)
    assert watch.requests == 0  # within three usual steps
    probe._watch_idle(10.0 + 15.0)
    assert watch.requests == 1


def test_a_flush_sends_steps_as_rows_and_feeds_the_recent_statistics() -> None:
    probe, _, _ = make_probe()
    sent: list[bytes] = []

    class Client:
        def send(self, data: bytes) -> bool:
            sent.append(data)
            return True

    probe.client = Client()  # type: ignore[assignment]
    probe._hello_due = False
    for i in range(3):
        probe._finish_step(draft(step=i + 1, duration_s=0.5, data_wait_s=0.1), None, None)
    probe._finish_step(draft(step=1, phase="eval", duration_s=9.0, data_wait_s=9.0), None, None)
    probe._flush()
    (line,) = b"".join(sent).splitlines()
    batch, _ = decode_line(line)
    assert isinstance(batch, StepBatch)
    assert [(s.step, s.phase) for s in batch.steps] == [
        (1, "train"),
        (2, "train"),
        (3, "train"),
        (1, "eval"),
    ]
    stats = probe.step_stats
    assert stats is not None
    assert stats.wait_share == pytest.approx(0.2)  # train steps only
    assert stats.step_s == pytest.approx(0.5)


def draft(**changes: Any) -> StepDraft:
    values: dict[str, Any] = dict(
        step=1, phase="train", source="optimizer", t_start=1.0, t_end=1.5, duration_s=0.5,
        loader_wait_s=0.0, loader_fetches=0, outside_s=0.2, data_wait_s=0.2, compute_s=0.3,
        samples=8, autocast=None,
    )  # fmt: skip
    values.update(changes)
    return StepDraft(**values)


class Timing:
    gpu_time_s = 0.25
    idle_before_s = 0.05


def test_step_rows_carry_the_gpu_view_of_the_data_wait() -> None:
    probe, _, _ = make_probe()
    row = dict(zip(STEP_COLUMNS, probe._step_row(draft(), Timing(), None), strict=True))
    # No DataLoader: the GPU's idle gap, not the host time spent in a sync.
    assert row["data_wait_s"] == 0.05 and row["gpu_time_s"] == 0.25
    assert row["t"] == 1.5 + probe.wall_offset
    with_loader = probe._step_row(draft(loader_fetches=1, data_wait_s=0.2), Timing(), None)
    assert dict(zip(STEP_COLUMNS, with_loader, strict=True))["data_wait_s"] == 0.2
