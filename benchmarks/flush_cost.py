"""What sending a step costs the probe's thread: building its row and encoding it.

Fills the probe's outbox with steps as a 0.7 ms DataLoader step leaves them
(a CPU job: no GPU timing, no allocator reading) and times the probe's
``_flush`` over them, less the time to fill, with the channel's socket
replaced by a sink. Times are the thread's CPU (``time.thread_time``): the
probe's thread sleeps between lines to let the training thread have the
interpreter lock, and that sleep costs wall time, not CPU. Each round fills
and sends one flush's steps, and the fill alone is timed the same way, so
the two differ only by the send. Prints microseconds of CPU per step and
bytes per step.

    python benchmarks/flush_cost.py [--steps-per-flush 350] [--rounds 200]
"""

from __future__ import annotations

import argparse
import time

from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import Probe
from trainmedic.probe.sampling import StepStats
from trainmedic.probe.segments import Segment, StepDraft


class Sink:
    """Stands for the channel client: takes the bytes, keeps their count."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, data: bytes) -> bool:
        self.sent += len(data)
        return True


def fill(probe: Probe, n: int, first: int) -> None:
    for i in range(first, first + n):
        seg = Segment.of(100.0 + i * 0.0007)
        seg.loader_wait, seg.fetches, seg.loader_samples = 0.0002, 1, 64
        seg.partial = True
        draft = StepDraft(i + 1, "train", "optimizer", 100.0007 + i * 0.0007, seg)
        probe.outbox.append(draft)  # as the runtime queues a step without CUDA


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps-per-flush", type=int, default=350, help="0.25 s of 0.7 ms steps")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    probe = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()))
    sink = Sink()
    probe.client = sink  # type: ignore[assignment]
    probe._hello_due = False
    probe.step_stats = StepStats()
    n, rounds = args.steps_per_flush, args.rounds
    for r in range(20):  # warm-up
        fill(probe, n, r * n)
        probe._flush()
    sink.sent = 0
    t0 = time.thread_time()
    for r in range(rounds):
        fill(probe, n, r * n)
        probe.outbox.clear()
    t1 = time.thread_time()
    for r in range(rounds):
        fill(probe, n, r * n)
        probe._flush()
    t2 = time.thread_time()
    per_step = ((t2 - t1) - (t1 - t0)) / (rounds * n)
    size = sink.sent / (rounds * n)
    print(f"flush: {per_step * 1e6:.2f} µs of CPU per step; {size:.0f} bytes per step")


if __name__ == "__main__":
    main()
