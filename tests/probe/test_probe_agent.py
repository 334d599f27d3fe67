"""The probe's own thread: step rows and the idle watch, driven by hand."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from trainmedic.channel.wire import (
    HOST_STEP_COLUMNS,
    STEP_COLUMNS,
    StepBatch,
    TorchInfo,
    decode_line,
)
from trainmedic.probe.agent import FLUSH_S, IDLE_STEPS_S, STEADY_S
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import Probe
from trainmedic.probe.sampling import StepStats
from trainmedic.probe.segments import Segment
from trainmedic.probe.steplines import LINE_ROWS, StepLines
from trainmedic.probe.steps import StepDraft, StepTracker
from trainmedic.record.types import StepRecord


class Watch:
    """The forward watch as the probe's thread sees it."""

    def __init__(self) -> None:
        self.requests = 0
        self.discovering = False
        self.requested = False
        self.pending = False
        self.next_routine = float("inf")

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
    probe._watch_forward(10.0)
    tracker.loader_enter(1.0)  # an evaluation: batches, no steps
    tracker.loader_exit(1.1, 8, True)
    probe._watch_forward(10.0 + IDLE_STEPS_S / 2)
    assert watch.requests == 0  # not yet
    probe._watch_forward(10.0 + IDLE_STEPS_S)
    probe._watch_forward(10.0 + 2 * IDLE_STEPS_S)
    assert watch.requests == 1  # once per idle period
    train_step(tracker, 2.0)
    probe._watch_forward(20.0)
    tracker.loader_enter(3.0)
    tracker.loader_exit(3.1, 8, True)
    probe._watch_forward(20.0 + IDLE_STEPS_S)
    assert watch.requests == 2


def test_steps_without_forward_calls_ask_for_a_discovery() -> None:
    probe, tracker, watch = make_probe()
    train_step(tracker, 0.0)
    probe._watch_forward(10.0)
    assert watch.requests == 0
    tracker.backward_enter(1.0)  # a model whose class the watch does not know
    tracker.backward_exit(1.1)
    tracker.optimizer_enter(1.1)
    tracker.optimizer_exit(1.2, "sgd")
    probe._watch_forward(10.25)
    assert watch.requests == 1


def test_a_routine_discovery_is_asked_for_when_due() -> None:
    probe, tracker, watch = make_probe()
    watch.next_routine = probe.clock() + 3600.0
    train_step(tracker, 0.0)
    probe._watch_forward(10.0)
    assert watch.requests == 0
    watch.next_routine = probe.clock()
    train_step(tracker, 1.0)
    probe._watch_forward(10.25)
    assert watch.requests == 1


def test_a_job_doing_nothing_is_not_a_reason_to_look() -> None:
    probe, tracker, watch = make_probe()
    train_step(tracker, 0.0)
    probe._watch_forward(10.0)
    probe._watch_forward(10.0 + 10 * IDLE_STEPS_S)  # a hang or a sleep: no work either
    assert watch.requests == 0


def test_long_steps_are_not_idle_periods() -> None:
    probe, tracker, watch = make_probe()
    assert probe.step_stats is not None
    for _ in range(20):
        probe.step_stats.add(5.0, 0.0)  # 5 s steps
    train_step(tracker, 0.0)
    probe._watch_forward(10.0)
    tracker.loader_enter(1.0)
    tracker.loader_exit(1.1, 8, True)
    probe._watch_forward(10.0 + IDLE_STEPS_S * 2)
    assert watch.requests == 0  # within three usual steps
    probe._watch_forward(10.0 + 15.0)
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


def draft(
    step: int = 1,
    phase: str = "train",
    duration_s: float = 0.5,
    data_wait_s: float = 0.2,
    fetches: int = 0,
) -> StepDraft:
    """A step of ``duration_s`` ending at 1.5: ``data_wait_s`` in a loader when it
    fetched, else outside compute; compute the rest."""
    seg = Segment.of(
        1.5 - duration_s,
        loader_wait=data_wait_s if fetches else 0.0,
        fetches=fetches,
        compute=duration_s - data_wait_s,
        compute_seen=True,
        forward_samples=8,
    )
    return StepDraft(step, phase, "optimizer", 1.5, seg)


class Timing:
    gpu_time_s = 0.25
    idle_before_s = 0.05


def sent(probe: Probe, *queued: tuple[StepDraft, object, object]) -> list[StepRecord]:
    """The step records the supervisor reads from the lines the probe writes for ``queued``."""
    lines: list[bytes] = []
    steps = StepLines(probe.pid, probe.rank, probe.wall_offset, lines)
    for message in queued:
        steps.add(*message)
    steps.close()
    records: list[StepRecord] = []
    for line in lines:
        batch, _ = decode_line(line)
        assert isinstance(batch, StepBatch)
        records += batch.steps
    return records


def test_step_rows_carry_the_gpu_view_of_the_data_wait() -> None:
    probe, _, _ = make_probe()
    (row,) = sent(probe, (draft(), Timing(), None))
    # No DataLoader: the GPU's idle gap, not the host time spent in a sync.
    assert row.data_wait_s == pytest.approx(0.05) and row.gpu_time_s == pytest.approx(0.25)
    assert row.t == pytest.approx(1.5 + probe.wall_offset, abs=1e-6)
    (with_loader,) = sent(probe, (draft(fetches=1, data_wait_s=0.2), Timing(), None))
    assert with_loader.data_wait_s == pytest.approx(0.2)


class FakeEvent:
    """A CUDA event on a fake GPU clock: recorded at the current fake time, done at once."""

    clock: ClassVar[list[float]] = [0.0]

    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self) -> None:
        self.t = FakeEvent.clock[0]

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1000.0


class FakeCuda:
    Event = FakeEvent

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def is_current_stream_capturing() -> bool:
        return False

    @staticmethod
    def memory_stats() -> dict[str, int]:
        return {"allocated_bytes.all.peak": 10, "reserved_bytes.all.peak": 20}


class FakeTorch:
    cuda = FakeCuda


def test_cuda_timings_reach_the_step_rows_through_the_tracker_listener() -> None:
    from trainmedic.probe.cuda import CudaSteps

    probe, tracker, _ = make_probe()
    probe.forward = None
    probe.cuda = CudaSteps(FakeTorch(), probe.parts["cuda"], probe._finish_step, lambda: None)
    tracker.listener = probe.cuda
    tracker.emit = probe._on_draft
    for i in range(3):
        t = 10.0 * i
        FakeEvent.clock[0] = t + 0.02  # the GPU starts the step's work after 20 ms of prep
        tracker.forward_enter(t + 0.04, 8, True, None)  # the host prepared for 40 ms
        tracker.forward_exit(t + 0.05, True)
        tracker.backward_enter(t + 0.05)
        tracker.backward_exit(t + 0.06)
        tracker.optimizer_enter(t + 0.06)
        FakeEvent.clock[0] = t + 0.09
        tracker.optimizer_exit(t + 0.07, "sgd")
    errors = [m for m in probe.outbox if not isinstance(m, tuple)]
    assert errors == []
    rows = sent(probe, *probe.outbox)  # type: ignore[arg-type]
    assert len(rows) == 3
    assert all(r.gpu_time_s == pytest.approx(0.07) for r in rows)
    assert rows[0].alloc_peak_bytes == 10
    # After the first step, the GPU sat idle from the last step's end event to this step's
    # start: less than the host's preparation outside compute.
    assert rows[1].data_wait_s == pytest.approx(9.93)


class Alloc:
    alloc_peak_bytes = 3 << 30
    reserved_peak_bytes = 4 << 30
    alloc_retries = 2
    ooms = 0


def test_host_steps_leave_out_the_gpu_columns_and_keep_their_times_to_the_nanosecond() -> None:
    probe, _, _ = make_probe()
    lines: list[bytes] = []
    steps = StepLines(probe.pid, 3, probe.wall_offset, lines)
    drafts = [draft(step=i, duration_s=0.000731 + i * 1e-9, data_wait_s=0.000117) for i in (1, 2)]
    steps.add(drafts[0], None, None)
    steps.add(drafts[1], None, Alloc())  # a CUDA step: every column
    steps.add(draft(step=3), None, None)
    steps.close()
    objs = [json.loads(line) for line in lines]
    # One line per run of steps of one shape, in order.
    assert [tuple(o["cols"]) for o in objs] == [HOST_STEP_COLUMNS, STEP_COLUMNS, HOST_STEP_COLUMNS]
    assert all(isinstance(v, int) for v in objs[0]["rows"][0][1:5])  # nanoseconds
    assert [o["rank"] for o in objs] == [3, 3, 3]
    records = sent(probe, (drafts[0], None, None), (drafts[1], None, Alloc()))
    for record, made in zip(records, drafts, strict=True):
        assert record.duration_s == pytest.approx(made.duration_s, abs=1e-9)
        assert record.data_wait_s == pytest.approx(made.data_wait_s, abs=1e-9)
        assert record.compute_s == pytest.approx(made.compute_s, abs=1e-9)
        assert record.t == pytest.approx(1.5 + probe.wall_offset, abs=1e-6)
        assert record.samples == 8 and record.source == "optimizer" and record.phase == "train"
    assert records[0].alloc_peak_bytes is None
    assert (records[1].alloc_peak_bytes, records[1].alloc_retries) == (3 << 30, 2)


def test_a_line_holds_at_most_line_rows_steps_and_says_when_one_is_full() -> None:
    probe, _, _ = make_probe()
    lines: list[bytes] = []
    steps = StepLines(probe.pid, None, probe.wall_offset, lines)
    full = [steps.add(draft(step=i + 1), None, None) for i in range(LINE_ROWS * 2 + 5)]
    steps.close()
    assert [i for i, done in enumerate(full) if done] == [LINE_ROWS - 1, 2 * LINE_ROWS - 1]
    counts = [len(json.loads(line)["rows"]) for line in lines]
    assert counts == [LINE_ROWS, LINE_ROWS, 5]
    assert steps.train_steps == LINE_ROWS * 2 + 5
    assert steps.train_s == pytest.approx(0.5 * steps.train_steps)


class Cudnn:
    """``torch.backends.cudnn``: its first ``version()`` loads the library; calls are noted."""

    def __init__(self, version: int | None = 90100, fails: bool = False) -> None:
        self.calls: list[str] = []
        self.answer = version
        self.fails = fails
        self.where = "step"

    def version(self) -> int | None:
        self.calls.append(self.where)
        if self.fails:
            raise RuntimeError("cuDNN version incompatibility")
        return self.answer


class ReadyCuda(FakeCuda):
    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(i: int) -> str:
        return "NVIDIA H200"

    @staticmethod
    def get_arch_list() -> list[str]:
        return ["sm_90"]


def probe_on_cuda(cudnn: Cudnn) -> tuple[Probe, StepTracker]:
    """A probe whose CUDA part sees a job that initialised CUDA, as _install_torch sets it up."""
    from types import SimpleNamespace

    from trainmedic.probe.cuda import CudaSteps

    probe, tracker, _ = make_probe()
    probe.forward = None
    torch = SimpleNamespace(
        __version__="2.11.0+cu130",
        version=SimpleNamespace(cuda="13.0"),
        cuda=ReadyCuda,
        backends=SimpleNamespace(cudnn=cudnn),
    )
    probe.torch = torch  # type: ignore[assignment]
    probe.cuda = CudaSteps(torch, probe.parts["cuda"], probe._finish_step, probe._cuda_ready)
    tracker.listener = probe.cuda
    tracker.emit = probe._on_draft
    return probe, tracker


def torch_infos(probe: Probe) -> list[TorchInfo]:
    return [m for m in probe.outbox if isinstance(m, TorchInfo)]


def test_cudnn_is_first_asked_for_its_version_on_the_probes_thread_not_in_a_step() -> None:
    """Its first ``cudnn.version()`` loads cuDNN: inside the job's first step it would
    lengthen it, and could run inside a CUDA graph capture or a traced region."""
    cudnn = Cudnn()
    probe, tracker = probe_on_cuda(cudnn)
    train_step(tracker, 0.0)  # CUDA is seen initialised at the first step's first compute
    train_step(tracker, 1.0)
    assert cudnn.calls == []
    assert torch_infos(probe) == []
    cudnn.where = "probe thread"
    probe._send_cuda_info()  # the probe's thread, before each send
    probe._send_cuda_info()
    (info,) = torch_infos(probe)
    assert cudnn.calls == ["probe thread"]
    assert (info.cuda_initialized, info.cudnn_version) == (True, 90100)
    assert (info.devices, info.arch_list) == (("NVIDIA H200",), ("sm_90",))


def test_the_cuda_torch_info_waits_out_a_graph_capture() -> None:
    cudnn = Cudnn()
    probe, tracker = probe_on_cuda(cudnn)
    train_step(tracker, 0.0)
    assert probe.cuda is not None
    probe.cuda.captures = 1  # torch.cuda.graph is capturing on the training thread
    probe._send_cuda_info()
    assert (cudnn.calls, torch_infos(probe)) == ([], [])
    probe.cuda.captures = 0
    probe._send_cuda_info()
    assert len(torch_infos(probe)) == 1


def test_a_cudnn_that_fails_its_check_is_no_version_and_gpu_timing_goes_on() -> None:
    probe, tracker = probe_on_cuda(Cudnn(fails=True))
    train_step(tracker, 0.0)
    probe._send_cuda_info()
    (info,) = torch_infos(probe)
    assert info.cudnn_version is None and info.devices == ("NVIDIA H200",)
    assert probe.parts["cuda"].on


def quiet_probe() -> tuple[Probe, StepTracker, list[str]]:
    """A probe whose pass does everything but the channel's sends, which it records."""
    probe, tracker, _ = make_probe()
    calls: list[str] = []
    probe._flush = lambda: calls.append("flush")  # type: ignore[method-assign]
    probe._heartbeat = lambda top_up=True: calls.append("heartbeat")  # type: ignore[method-assign]
    probe._sample_main = lambda: calls.append("sample")  # type: ignore[method-assign]
    return probe, tracker, calls


def test_a_job_making_progress_wakes_the_probes_thread_once_a_second_and_is_not_sampled() -> None:
    probe, tracker, calls = quiet_probe()
    # Start-up: nothing seen yet, so the quick cadence, with a liveness sample.
    assert probe._agent_pass(stopping=False) == FLUSH_S
    assert calls == ["sample", "heartbeat", "flush"]
    for i in range(3):
        calls.clear()
        train_step(tracker, float(i))
        # Steps went on since the last pass: one pass a second, and no sample, whose
        # time.sleep(0) would take the interpreter lock from the training loop (the
        # heartbeat alone tops its samples up, once a second: the test below).
        assert probe._agent_pass(stopping=False) == STEADY_S
        assert "sample" not in calls and "flush" in calls
    calls.clear()
    # A silence: no step and no work since the last pass. Back to four passes a
    # second, each with a sample (what the silence classifier reads: spinning or parked).
    assert probe._agent_pass(stopping=False) == FLUSH_S
    assert calls[0] == "sample"
    calls.clear()
    tracker.loader_enter(9.0)  # work without a step (an evaluation's batches) is progress too
    tracker.loader_exit(9.1, 8, True)
    assert probe._agent_pass(stopping=False) == STEADY_S
    assert "sample" not in calls


def test_the_first_heartbeat_of_a_silence_says_whether_python_runs() -> None:
    """The pass right after the last step saw progress and took no sample; the heartbeat
    it sends is the first of the silence. With no sample in it, the supervisor could
    not tell a Python loop at ``x += 1`` from a native op and counted it as work."""
    from trainmedic.channel.wire import Heartbeat
    from trainmedic.probe.liveness import HEARTBEAT_MIN_SAMPLES

    probe, tracker, _ = make_probe()
    probe._flush = lambda: None  # type: ignore[method-assign]
    probe._agent_pass(stopping=False)  # start-up: a sample and a heartbeat
    probe.outbox.clear()
    probe._next_heartbeat = 0.0
    train_step(tracker, 1.0)
    assert probe._agent_pass(stopping=False) == STEADY_S
    beats = [m for m in probe.outbox if isinstance(m, Heartbeat)]
    assert len(beats) == 1
    assert beats[0].samples == HEARTBEAT_MIN_SAMPLES >= 3
    # The next heartbeat counts its own samples, topped up as needed.
    probe._sample_main()
    probe._next_heartbeat = 0.0
    probe.outbox.clear()
    probe._agent_pass(stopping=False)  # a silent pass: one more sample, then the beat
    beats = [m for m in probe.outbox if isinstance(m, Heartbeat)]
    assert [b.samples for b in beats] == [HEARTBEAT_MIN_SAMPLES]


def test_a_probe_without_a_step_tracker_keeps_the_quick_cadence() -> None:
    probe, _, calls = quiet_probe()
    probe.tracker = None  # a job that never imported torch: nothing tells progress
    for _ in range(3):
        calls.clear()
        assert probe._agent_pass(stopping=False) == FLUSH_S
        assert calls[0] == "sample"


def test_without_sending_the_hooks_queue_nothing_and_no_probe_thread_starts() -> None:
    from trainmedic.probe.parts import PART_NAMES

    assert "sending" in PART_NAMES
    probe = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset({"sending"}), frozenset()))
    tracker = probe._ensure_tracker()
    probe.emit(probe.event("note", "nothing goes out", {}))
    train_step(tracker, 0.0)
    probe._ensure_agent()
    assert not probe.outbox and probe._agent is None
    assert tracker.train_steps == 1  # the hooks' own work is done as usual


class Detail:
    """The detail switch as the probe's thread reads it."""

    def __init__(self) -> None:
        self.enabled = True
        self.on = False
        self.partly_on = False
        self.windows = 0
        self.windows_ended = 0

    def overdue(self, now: float) -> bool:
        return False

    def step_ended(self, draft: StepDraft) -> None:
        """Switches nothing: the tests set the window counts by hand."""

    def arm_gap(self, out: object, limit: int, make: object = None) -> None:
        """Arms nothing: every step ends the general way."""


def test_steps_between_two_windows_are_no_reason_to_rediscover() -> None:
    probe, tracker, watch = make_probe()
    detail = Detail()
    probe.detail = detail  # type: ignore[assignment]
    train_step(tracker, 0.0)
    probe._watch_forward(10.0)
    for i in range(3):  # steps with the compute hooks off: no forward call can be seen
        tracker.optimizer_exit(1.0 + i, "sgd")
        probe._watch_forward(11.0 + i)
    assert watch.requests == 0
    detail.on, detail.windows = True, 1  # a window begins ...
    tracker.optimizer_exit(5.0, "sgd")
    probe._watch_forward(15.0)
    assert watch.requests == 0  # ... its steps have not run yet
    detail.on, detail.windows_ended = False, 1  # ... and ended: its steps saw no forward call
    tracker.optimizer_exit(6.0, "sgd")
    probe._watch_forward(16.0)
    assert watch.requests == 1


def test_steps_inside_one_window_with_no_forward_call_ask_for_a_discovery() -> None:
    probe, tracker, watch = make_probe()
    detail = Detail()
    detail.on, detail.windows = True, 3
    probe.detail = detail  # type: ignore[assignment]
    train_step(tracker, 0.0)
    probe._watch_forward(10.0)
    tracker.optimizer_exit(1.0, "sgd")  # the same window, on at both looks: watched
    probe._watch_forward(11.0)
    assert watch.requests == 1
