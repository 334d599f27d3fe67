"""The step tracker's work counter: what a heartbeat shows between steps."""

from __future__ import annotations

from trainmedic.channel.wire import Heartbeat, decode_line, encode_message
from trainmedic.probe.steps import StepTracker


def test_forward_backward_optimizer_and_batches_count_as_work() -> None:
    tracker = StepTracker(emit=lambda draft: None)
    tracker.loader_enter(0.0)
    tracker.loader_exit(0.1, 32, True)
    tracker.forward_enter(0.1, 32, True, None)
    tracker.forward_exit(0.2, True)
    tracker.backward_enter(0.2)
    tracker.backward_exit(0.3)
    tracker.optimizer_enter(0.3)
    tracker.optimizer_exit(0.4, "sgd")
    assert tracker.work == 4
    for i in range(5):  # an evaluation: forward passes without steps
        tracker.forward_enter(1.0 + i, 32, False, None)
        tracker.forward_exit(1.5 + i, False)
    assert tracker.work == 9
    assert tracker.train_steps == 1


def test_the_heartbeat_carries_the_work_count_and_old_ones_read_as_zero() -> None:
    hb = Heartbeat(1, 2.0, 3, "train", "other", ("a.py:1 f",), 0.5, work=17)
    assert decode_line(encode_message(hb))[0] == hb
    old = (
        b'{"k":"hb","pid":1,"t":2.0,"steps":3,"phase":"train",'
        b'"activity":"other","stack":[],"cpu_s":0.5}\n'
    )
    decoded = decode_line(old)[0]
    assert isinstance(decoded, Heartbeat) and decoded.work == 0
