"""Steps through the shared-memory ring, and the probe's thread asleep while they flow."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.channel import ring
from trainmedic.channel.server import ChannelServer
from trainmedic.channel.wire import Heartbeat, Hello, ProbeMessage
from trainmedic.probe.agent import FLUSH_S, QUIET_S
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import Probe
from trainmedic.probe.sampling import StepStats
from trainmedic.probe.steps import StepTracker
from trainmedic.record.types import StepRecord

pytestmark = pytest.mark.skipif(not ring.available(), reason="no memfd_create here")


class Received:
    def __init__(self) -> None:
        self.messages: list[ProbeMessage] = []
        self.arrived = threading.Condition()

    def add(self, message: ProbeMessage) -> None:
        with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()

    def heartbeats(self, count: int) -> list[Heartbeat]:
        def found() -> list[Heartbeat]:
            return [m for m in self.messages if isinstance(m, Heartbeat)]

        with self.arrived:
            assert self.arrived.wait_for(lambda: len(found()) >= count, timeout=5)
            return found()

    def steps(self, count: int) -> list[StepRecord]:
        def found() -> list[StepRecord]:
            return [m for m in self.messages if isinstance(m, StepRecord)]

        with self.arrived:
            assert self.arrived.wait_for(lambda: len(found()) >= count, timeout=5)
            return found()


@pytest.fixture
def received() -> Received:
    return Received()


@pytest.fixture
def server(tmp_path: Path, received: Received) -> Iterator[ChannelServer]:
    srv = ChannelServer(tmp_path, "tok", received.add)
    srv.start()
    yield srv
    srv.close()


def make_probe(address: str, disabled: frozenset[str] = frozenset()) -> tuple[Probe, StepTracker]:
    probe = Probe(ProbeConfig(address, "tok", None, disabled, frozenset()))
    tracker = probe._ensure_tracker()
    probe.step_stats = StepStats()
    return probe, tracker


def train_step(tracker: StepTracker, t: float) -> None:
    tracker.loader_enter(t)
    tracker.loader_exit(t + 0.002, 16, True)
    tracker.forward_enter(t + 0.002, 16, True, None)
    tracker.forward_exit(t + 0.01, True)
    tracker.backward_enter(t + 0.01)
    tracker.backward_exit(t + 0.02)
    tracker.optimizer_enter(t + 0.02)
    tracker.optimizer_exit(t + 0.03, "sgd")


def taken(probe: Probe) -> None:
    """Connect, offer the ring, and read the supervisor's answer."""
    probe._flush()
    assert probe._ring_offer is not None
    sock = None if probe.client is None else probe.client.fileno()
    assert sock is not None
    assert select.select([sock], [], [], 5)[0]
    probe._read_supervisor()
    assert probe.ring is not None and probe._ring_offer is None


def test_steps_go_through_the_ring_as_the_lines_would_carry_them(
    server: ChannelServer, received: Received, tmp_path: Path
) -> None:
    probe, tracker = make_probe(server.address)
    taken(probe)
    for i in range(3):
        train_step(tracker, float(i))
    assert not probe.outbox  # nothing queued for the probe's thread
    via_ring = received.steps(3)
    assert isinstance(received.messages[0], Hello) and received.messages[0].ring

    # The same steps through a probe that sends lines.
    other = Received()
    (tmp_path / "lines").mkdir()
    lines_server = ChannelServer(tmp_path / "lines", "tok", other.add)
    lines_server.start()
    try:
        plain, plain_tracker = make_probe(lines_server.address, frozenset({"ring"}))
        plain.wall_offset = probe.wall_offset
        for i in range(3):
            train_step(plain_tracker, float(i))
        plain._flush()
        via_lines = other.steps(3)
    finally:
        lines_server.close()
    assert len(via_ring) == 3
    for a, b in zip(via_ring, via_lines, strict=True):
        assert (a.step, a.source, a.phase, a.samples) == (b.step, b.source, b.phase, b.samples)
        assert a.duration_s == pytest.approx(b.duration_s, abs=1e-9)
        assert a.data_wait_s == pytest.approx(b.data_wait_s, abs=1e-9)
        assert a.compute_s == pytest.approx(b.compute_s, abs=1e-9)
        assert a.t == pytest.approx(b.t, abs=1e-6)
    assert via_ring[0].data_wait_s == pytest.approx(0.002)
    assert via_ring[0].samples == 16


def test_while_steps_flow_through_the_ring_the_probes_thread_sleeps_and_samples_nothing(
    server: ChannelServer, received: Received
) -> None:
    probe, tracker = make_probe(server.address)
    taken(probe)
    samples: list[str] = []
    probe._sample_main = lambda: samples.append("sample")  # type: ignore[method-assign]
    probe._agent_pass(stopping=False)
    assert received.heartbeats(1)[0].samples >= 3  # start-up: topped up
    samples.clear()
    train_step(tracker, 1.0)
    assert probe._agent_pass(stopping=False) == QUIET_S
    assert samples == []
    # The pass that turns quiet sends a heartbeat at once (it tells the supervisor the
    # process trains), and takes no liveness sample: they matter in a silence only.
    beat = received.heartbeats(2)[1]
    assert (beat.samples, beat.steps) == (0, 1)
    # The stack sampler's statistics follow the ring's steps.
    probe._pull_ring_totals()
    assert probe.step_stats is not None and probe.step_stats.step_s == pytest.approx(0.03)


def test_the_supervisors_wake_up_turns_a_quiet_probe_back_to_a_silence_cadence(
    server: ChannelServer, received: Received
) -> None:
    probe, tracker = make_probe(server.address)
    taken(probe)
    probe._sample_main = lambda: None  # type: ignore[method-assign]
    probe._agent_pass(stopping=False)
    train_step(tracker, 1.0)
    assert probe._agent_pass(stopping=False) == QUIET_S
    received.steps(1)
    # The ring stops: the server sends WAKE after WAKE_AFTER_S, which ends the quiet wait.
    done = threading.Event()

    def sleep_quietly() -> None:
        probe._quiet_wait(30.0)
        done.set()

    threading.Thread(target=sleep_quietly, daemon=True).start()
    assert done.wait(5)
    probe._read_supervisor()
    assert probe._progress_seen is None and probe._next_heartbeat == 0.0
    assert probe._agent_pass(stopping=False) == FLUSH_S  # no progress seen: a silence


def test_a_stop_or_a_stack_request_wakes_a_quiet_probe(server: ChannelServer) -> None:
    probe, _ = make_probe(server.address)
    taken(probe)

    def sleep_quietly(started: threading.Event, done: threading.Event) -> None:
        started.set()
        probe._quiet_wait(30.0)
        done.set()

    for wake in (probe._request_dump, probe._stop.set):
        started, done = threading.Event(), threading.Event()
        threading.Thread(target=sleep_quietly, args=(started, done), daemon=True).start()
        assert started.wait(5)
        # As at exit: the flag, then wake() (the thread checks the flags once it is
        # quiet, so a wake-up before it sleeps is not lost).
        wake()
        probe.wake()
        assert done.wait(5)
        probe.dump_requested = False


def test_a_forked_child_writes_nothing_into_its_parents_ring(server: ChannelServer) -> None:
    probe, tracker = make_probe(server.address)
    taken(probe)
    probe._wake_pipe()
    probe._after_fork_child()  # as in the child, after os.fork()
    assert probe.ring is None and probe._ring_offer is None and probe._wake_fds is None
    train_step(tracker, 0.0)
    assert len(probe.outbox) == 1  # the child's step waits for its own connection


def test_no_ring_is_offered_by_a_worker_over_tcp_or_with_the_part_off(tmp_path: Path) -> None:
    received = Received()
    tcp = ChannelServer(tmp_path, "tok", received.add, use_unix=False)
    tcp.start()
    try:
        probe, _ = make_probe(tcp.address)
        probe._flush()
        assert probe._ring_offer is None
    finally:
        tcp.close()
    unix = ChannelServer(tmp_path, "tok", received.add)
    unix.start()
    try:
        off, _ = make_probe(unix.address, frozenset({"ring"}))
        off._flush()
        worker, _ = make_probe(unix.address)
        worker.role = "worker"
        worker._flush()
        assert off._ring_offer is None and worker._ring_offer is None
    finally:
        unix.close()
    hellos = [m for m in received.messages if isinstance(m, Hello)]
    assert len(hellos) == 3 and not any(h.ring for h in hellos)


def test_a_job_whose_steps_flow_wakes_the_probes_thread_less_than_once_a_second(
    tmp_path: Path,
) -> None:
    """The wake-ups counted in the job itself (its threads' voluntary context switches),
    over seconds 1.5 to 4 of a loop of sub-millisecond steps. The probe's thread sent the
    steps itself once a second, and yielded between lines: 6-8 wake-ups a second."""
    import json
    import sys

    from tests.probe.probed import run_probed

    scripts = Path(__file__).resolve().parent.parent / "scripts"
    run = run_probed([sys.executable, str(scripts / "steady_loop.py"), "4", "1.5"], tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    out = json.loads(run.proc.stdout.splitlines()[-1])
    assert out["rates"]["trainmedic-probe"] < 1.0, out
    hello = next(m for m in run.messages if isinstance(m, Hello))
    assert hello.ring
    # Every step reached the supervisor, numbered in order.
    steps = [m.step for m in run.messages if isinstance(m, StepRecord)]
    assert steps == list(range(1, out["steps"] + 1))


def test_a_step_the_ring_cannot_hold_goes_as_a_line(
    server: ChannelServer, received: Received
) -> None:
    probe, tracker = make_probe(server.address)
    taken(probe)
    ring_steps = probe.ring
    assert ring_steps is not None
    # The name table fills up; "optimizer" and "train" hold two slots from the start
    # (the gap steps' codes, steprings.RingGap).
    for i in range(ring.NAME_SLOTS - 2):
        assert ring_steps.writer.code(f"phase-{i}") is not None
    assert ring_steps.writer.code("phase-full") is None
    tracker.phase_enter(0.0, "one-phase-too-many")
    train_step(tracker, 0.5)
    tracker.phase_exit(1.0)
    (queued,) = [m for m in probe.outbox if isinstance(m, tuple)]
    assert queued[0].phase == "one-phase-too-many"
    probe._flush()
    (step,) = received.steps(1)
    assert step.phase == "one-phase-too-many"
