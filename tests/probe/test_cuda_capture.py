"""The CUDA part around graph captures and devices, against a recording stand-in of torch.cuda.

The stand-in fails the way CUDA does: recording or querying an event while a
stream captures invalidates the capture (here: raises). Real captures run in
``test_probe_cuda.py`` on a GPU.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainmedic.probe import graphs
from trainmedic.probe.cuda import CudaSteps
from trainmedic.probe.parts import Parts
from trainmedic.probe.segments import Segment, StepDraft
from trainmedic.probe.steps import StepTracker


class CaptureInvalidated(RuntimeError):
    pass


class FakeCuda:
    """Records what the CUDA part does; every event completes at once."""

    def __init__(self) -> None:
        self.capturing = False
        self.done = True  # whether recorded events have completed on the "GPU"
        self.invalidated = 0  # calls that would have broken the job's capture
        self.recorded: list[Any] = []  # stream of each recorded event
        self.queries = 0
        self.stats_reads = 0
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t: float | None = None

            def record(self, stream: Any = None) -> None:
                if cuda.capturing:
                    cuda.invalidated += 1
                    raise CaptureInvalidated("cudaEventRecord during capture")
                cuda.recorded.append(stream)
                self.t = float(len(cuda.recorded))

            def query(self) -> bool:
                if cuda.capturing:
                    cuda.invalidated += 1
                    raise CaptureInvalidated("cudaEventQuery during capture")
                cuda.queries += 1
                return cuda.done

            def elapsed_time(self, other: Any) -> float:
                return (other.t - self.t) * 1000.0

        self.Event = Event

    def is_initialized(self) -> bool:
        return True

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def current_stream(self, device: Any = None) -> str:
        return f"stream of {device}"

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        """Each device's own statistics; no argument reads the current device, 0 here."""
        self.stats_reads += 1
        current = device is None or str(device) == "cuda:0"
        peak = 1 if current else 7 << 30
        return {"allocated_bytes.all.peak": peak, "reserved_bytes.all.peak": 2 * peak}


def make_cuda(
    allocs: list[Any] | None = None,
) -> tuple[CudaSteps, FakeCuda, list[tuple[StepDraft, Any]]]:
    """The CUDA part on a :class:`FakeCuda`; ``allocs`` collects each step's allocator reading."""
    fake = FakeCuda()
    finished: list[tuple[StepDraft, Any]] = []
    parts = Parts((), (), lambda part, exc, tb: None)

    def finish(draft: StepDraft, timing: Any, alloc: Any) -> None:
        finished.append((draft, timing))
        if allocs is not None:
            allocs.append(alloc)

    steps = CudaSteps(SimpleNamespace(cuda=fake), parts["cuda"], finish, lambda: None)
    return steps, fake, finished


def draft(step: int, marker: Any) -> StepDraft:
    seg = Segment.of(
        0.0, compute=1.0, compute_seen=True, forward_samples=8, start_marker=marker
    )
    return StepDraft(step, "train", "optimizer", 1.0, seg)


def test_nothing_cuda_side_happens_while_a_graph_is_captured() -> None:
    steps, fake, finished = make_cuda()
    fake.done = False  # step 1's events are still running when the capture begins
    steps.add(draft(1, steps.segment_started()))
    fake.capturing = True
    before = (len(fake.recorded), fake.queries, fake.stats_reads)
    # A step ends during the capture (optimizer.step() captured): no record, no query.
    steps.add(draft(2, steps.segment_started()))
    assert (len(fake.recorded), fake.queries, fake.stats_reads) == before
    assert fake.invalidated == 0
    fake.capturing, fake.done = False, True
    steps.add(draft(3, steps.segment_started()))
    steps.flush()
    assert steps.active()  # the CUDA part never failed
    assert [d.step for d, _ in finished] == [1, 2, 3]
    timings = {d.step: t for d, t in finished}
    assert timings[2] is not None and timings[2].gpu_time_s is None  # the captured step
    assert timings[3] is not None and timings[3].gpu_time_s is not None


def test_a_capture_seen_by_the_graph_wrapper_counts_even_on_another_stream() -> None:
    steps, fake, _ = make_cuda()
    steps.captures = 1  # torch.cuda.CUDAGraph.capture_begin ran
    assert steps.segment_started() is None
    assert fake.recorded == []


def test_events_go_to_the_stream_of_the_steps_device() -> None:
    steps, fake, _ = make_cuda()
    steps.segment_started()
    steps.use_device("cuda:1")
    steps.segment_started()
    assert fake.recorded == [None, "stream of cuda:1"]


def test_allocator_statistics_are_read_from_the_steps_device() -> None:
    """A job on ``cuda:1`` without ``set_device``: ``memory_stats()`` without a device
    reads device 0, where the job allocated nothing."""
    allocs: list[Any] = []
    steps, _, _ = make_cuda(allocs)
    steps.use_device("cuda:1")
    steps.add(draft(1, steps.segment_started()))
    steps.flush()
    (alloc,) = allocs
    assert (alloc.alloc_peak_bytes, alloc.reserved_peak_bytes) == (7 << 30, 14 << 30)


def test_before_any_device_is_known_the_current_devices_allocator_is_read() -> None:
    allocs: list[Any] = []
    steps, _, _ = make_cuda(allocs)
    steps.add(draft(1, steps.segment_started()))
    steps.flush()
    assert [a.alloc_peak_bytes for a in allocs] == [1]


class FakeGraph:
    """torch.cuda.CUDAGraph's methods, without CUDA."""

    replays = 0

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        FakeGraph.replays += 1


def make_probe(cuda: CudaSteps | None) -> Any:
    drafts: list[StepDraft] = []
    clock = iter(float(i) for i in range(10_000))
    probe = SimpleNamespace(
        parts=Parts((), (), lambda part, exc, tb: None),
        clock=lambda: next(clock),
        state=SimpleNamespace(training_ident=threading.get_ident()),
        restore=[],
        cuda=cuda,
        drafts=drafts,
    )
    tracker = StepTracker(emit=drafts.append)
    probe._ensure_tracker = lambda: tracker
    return probe


@pytest.fixture
def fake_torch() -> Any:
    return SimpleNamespace(cuda=SimpleNamespace(CUDAGraph=type("CUDAGraph", (FakeGraph,), {})))


def test_each_replay_of_a_captured_training_step_is_a_step(fake_torch: Any) -> None:
    cuda, _, _ = make_cuda()
    probe = make_probe(cuda)
    tracker = probe._ensure_tracker()
    assert graphs.install(fake_torch, probe, tracker)
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = fake_torch.cuda.CUDAGraph()
        g.capture_begin()
        assert cuda.captures == 1
        tracker.optimizer_enter(probe.clock())
        model(torch.ones(2, 4)).sum().backward()
        opt.step()  # the real post hook fires inside the capture
        tracker.optimizer_exit(probe.clock(), id(opt))
        g.capture_end()
        assert cuda.captures == 0
        captured = len(probe.drafts)
        for _ in range(5):
            g.replay()
        assert len(probe.drafts) == captured + 5
        assert {d.source for d in probe.drafts[captured:]} == {"optimizer"}
        # A graph without an optimizer step (a captured forward) is not a step.
        fwd = fake_torch.cuda.CUDAGraph()
        fwd.capture_begin()
        fwd.capture_end()
        fwd.replay()
        assert len(probe.drafts) == captured + 5
    finally:
        while probe.restore:
            probe.restore.pop()()
    assert fake_torch.cuda.CUDAGraph.replay is FakeGraph.replay


def test_the_optimizers_device_is_handed_to_the_cuda_part() -> None:
    cuda, _, _ = make_cuda()
    probe = make_probe(cuda)
    graphs.install_device_hook(torch, probe, probe._ensure_tracker())
    try:
        seen: list[Any] = []
        cuda.use_device = seen.append  # type: ignore[method-assign]
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        opt.step()
        assert seen == []  # CPU parameters: nothing to tell
    finally:
        while probe.restore:
            probe.restore.pop()()
