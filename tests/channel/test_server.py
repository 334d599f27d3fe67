"""The supervisor's listener: private socket, token first, messages in order."""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.channel import ring
from trainmedic.channel.client import ChannelClient, parse_address
from trainmedic.channel.server import WAKE_AFTER_S, ChannelServer
from trainmedic.channel.wire import (
    RING_REFUSED,
    RING_TAKEN,
    STEP_COLUMNS,
    WAKE,
    Goodbye,
    Hello,
    ProbeMessage,
    encode_message,
)
from trainmedic.record.types import StepRecord


def make_hello(pid: int = 100) -> Hello:
    return Hello(
        pid=pid,
        ppid=1,
        role="process",
        argv=("x",),
        rank=None,
        local_rank=None,
        python="3",
        executable="py",
        t=1.0,
    )


def make_step(n: int, pid: int = 100) -> StepRecord:
    return StepRecord(step=n, t=float(n), duration_s=0.1, pid=pid)


class Collector:
    def __init__(self) -> None:
        self.messages: list[ProbeMessage] = []
        self.problems: list[str] = []
        self.arrived = threading.Condition()

    def add(self, message: ProbeMessage) -> None:
        with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()

    def wait_for(self, count: int) -> list[ProbeMessage]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.messages) >= count, timeout=5)
        return self.messages


@pytest.fixture
def collector() -> Collector:
    return Collector()


@pytest.fixture
def server(tmp_path: Path, collector: Collector) -> Iterator[ChannelServer]:
    srv = ChannelServer(tmp_path, "tok", collector.add, collector.problems.append)
    srv.start()
    yield srv
    srv.close()


def send(address: str, *lines: bytes) -> None:
    client = ChannelClient(address)
    assert client.send(b"".join(lines))
    client.close()


def test_socket_is_private_and_in_the_run_directory(server: ChannelServer, tmp_path: Path) -> None:
    family, path = parse_address(server.address)
    assert family == socket.AF_UNIX
    assert Path(str(path)).parent == tmp_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_messages_arrive_in_order_after_an_authenticated_hello(
    server: ChannelServer, collector: Collector
) -> None:
    lines = [encode_message(make_hello(), token="tok")]
    lines += [encode_message(make_step(n)) for n in range(1, 51)]
    lines.append(encode_message(Goodbye(pid=100, t=9.0)))
    send(server.address, *lines)
    got = collector.wait_for(52)
    assert isinstance(got[0], Hello)
    assert [m.step for m in got[1:51] if isinstance(m, StepRecord)] == list(range(1, 51))
    assert isinstance(got[-1], Goodbye)
    assert server.wait_idle(5)


def test_a_steps_line_reaches_the_consumer_as_single_steps(
    server: ChannelServer, collector: Collector
) -> None:
    rows = [[n, float(n), 0.1, 0.0, None, None, None, "optimizer", "train"] for n in range(1, 6)]
    cols = list(STEP_COLUMNS[:9])
    line = json.dumps({"k": "steps", "pid": 100, "rank": None, "cols": cols, "rows": rows})
    send(server.address, encode_message(make_hello(), token="tok"), line.encode() + b"\n")
    got = collector.wait_for(6)
    assert got[1:] == [make_step(n) for n in range(1, 6)]
    assert server.messages == 6


def test_a_connection_without_the_token_is_refused(
    server: ChannelServer, collector: Collector
) -> None:
    send(server.address, encode_message(make_hello(), token="wrong"), encode_message(make_step(1)))
    send(server.address, encode_message(make_step(1)))  # no hello at all
    send(server.address, encode_message(make_hello(200), token="tok"))
    got = collector.wait_for(1)
    assert server.wait_idle(5)
    assert [type(m).__name__ for m in got] == ["Hello"]
    assert got[0].pid == 200  # type: ignore[union-attr]
    assert any("without the run token" in p for p in collector.problems)


def test_a_malformed_line_is_skipped_and_reported(
    server: ChannelServer, collector: Collector
) -> None:
    send(
        server.address,
        encode_message(make_hello(), token="tok"),
        b"{oops\n",
        encode_message(make_step(1)),
    )
    got = collector.wait_for(2)
    assert isinstance(got[1], StepRecord)
    assert len(collector.problems) == 1 and "malformed" in collector.problems[0]


def test_a_consumer_that_raises_does_not_stop_the_channel(tmp_path: Path) -> None:
    received: list[ProbeMessage] = []
    problems: list[str] = []

    def handler(message: ProbeMessage) -> None:
        if isinstance(message, StepRecord) and message.step == 1:
            raise RuntimeError("consumer bug")
        received.append(message)

    srv = ChannelServer(tmp_path, "tok", handler, problems.append)
    srv.start()
    try:
        send(
            srv.address,
            encode_message(make_hello(), token="tok"),
            encode_message(make_step(1)),
            encode_message(make_step(2)),
        )
        assert srv.wait_idle(5)
    finally:
        srv.close()
    assert [type(m).__name__ for m in received] == ["Hello", "StepRecord"]
    assert "consumer bug" in problems[0]


def test_a_deep_run_directory_gets_a_short_private_socket(
    tmp_path: Path, collector: Collector
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    srv = ChannelServer(deep, "tok", collector.add)
    _, path = parse_address(srv.address)
    try:
        assert len(str(path)) < 100
        assert stat.S_IMODE(os.stat(Path(str(path)).parent).st_mode) == 0o700
        srv.start()
        send(srv.address, encode_message(make_hello(), token="tok"))
        collector.wait_for(1)
    finally:
        srv.close()
    assert not Path(str(path)).exists()


def test_tcp_fallback_listens_on_loopback_only(tmp_path: Path, collector: Collector) -> None:
    srv = ChannelServer(tmp_path, "tok", collector.add, use_unix=False)
    family, where = parse_address(srv.address)
    assert family == socket.AF_INET
    assert where[0] == "127.0.0.1"  # type: ignore[index]
    srv.start()
    try:
        send(srv.address, encode_message(make_hello(), token="tok"))
        collector.wait_for(1)
    finally:
        srv.close()


def test_a_client_fails_quietly_when_nobody_listens(tmp_path: Path) -> None:
    client = ChannelClient(f"unix:{tmp_path / 'none.sock'}")
    assert client.send(b"x\n") is False
    assert client.failed is not None and "connect" in client.failed
    assert client.send(b"y\n") is False


# --- the shared-memory step ring ------------------------------------------------------------


def ring_hello(pid: int = 100) -> bytes:
    hello = make_hello(pid)
    return encode_message(
        Hello(**{**hello.__dict__, "ring": True}), token="tok"
    )


def read_answer(client: ChannelClient, timeout: float = 5.0) -> bytes:
    sock = socket.socket(fileno=os.dup(client_fd(client)))
    try:
        sock.settimeout(timeout)
        return sock.recv(16)
    finally:
        sock.close()


def client_fd(client: ChannelClient) -> int:
    fd = client.fileno()
    assert fd is not None
    return fd


def ring_taken(server: ChannelServer) -> tuple[ring.RingWriter, ChannelClient, int, int]:
    """A ring handed over with a hello and taken; its writer, the connection, and the
    codes of ``optimizer`` and ``train``."""
    writer = ring.RingWriter(64)
    client = ChannelClient(server.address)
    assert writer.fd is not None and client.send_fd(ring_hello(), writer.fd)
    writer.close_fd()  # the server has its own copy; the mapping stays
    assert read_answer(client) == RING_TAKEN
    source, phase = writer.code("optimizer"), writer.code("train")
    assert source is not None and phase is not None
    return writer, client, source, phase


@pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
def test_steps_written_into_a_ring_reach_the_consumer_before_later_lines(
    server: ChannelServer, collector: Collector
) -> None:
    writer, client, source, phase = ring_taken(server)
    for n in (1, 2, 3):
        writer.write(n, 10.0 + n, 0.1, 0.01, 0.05, math.nan, 8, -1, -1, -1, -1, source, phase, 0)
    # A line sent after the steps were written comes after them.
    assert client.send(encode_message(Goodbye(pid=100, t=20.0)))
    messages = collector.wait_for(5)
    assert isinstance(messages[0], Hello) and messages[0].ring
    steps = messages[1:4]
    assert [s.step for s in steps if isinstance(s, StepRecord)] == [1, 2, 3]
    assert steps[0] == StepRecord(
        step=1, t=11.0, duration_s=0.1, data_wait_s=0.01, compute_s=0.05, samples=8,
        pid=100, autocast=False,
    )  # fmt: skip
    assert isinstance(messages[4], Goodbye)
    client.close()


@pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
def test_a_ring_that_stops_moving_wakes_its_probe_once(
    server: ChannelServer, collector: Collector
) -> None:
    writer, client, source, phase = ring_taken(server)
    writer.write(1, 1.0, 0.1, 0.0, math.nan, math.nan, -1, -1, -1, -1, -1, source, phase, -1)
    collector.wait_for(2)
    assert read_answer(client) == WAKE  # after WAKE_AFTER_S without a step
    with pytest.raises(TimeoutError):  # once per stop, not at every read of the ring
        read_answer(client, timeout=3 * WAKE_AFTER_S)
    writer.write(2, 2.0, 0.1, 0.0, math.nan, math.nan, -1, -1, -1, -1, -1, source, phase, -1)
    collector.wait_for(3)
    assert read_answer(client) == WAKE  # the next stop wakes it again
    client.close()


@pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
def test_a_ring_that_is_not_one_is_refused_and_the_lines_still_count(
    server: ChannelServer, collector: Collector
) -> None:
    fake = os.memfd_create("fake", os.MFD_CLOEXEC)
    os.ftruncate(fake, 1 << 16)
    client = ChannelClient(server.address)
    assert client.send_fd(ring_hello(), fake)
    os.close(fake)
    assert read_answer(client) == RING_REFUSED
    send_line = encode_message(make_step(7))
    assert client.send(send_line)
    messages = collector.wait_for(2)
    assert isinstance(messages[1], StepRecord) and messages[1].step == 7
    assert any("step ring is unreadable" in p for p in collector.problems)
    client.close()


def test_a_descriptor_from_a_connection_without_the_token_is_closed(
    server: ChannelServer, collector: Collector
) -> None:
    before = len(os.listdir("/proc/self/fd"))
    r, w = os.pipe()
    client = ChannelClient(server.address)
    hello = encode_message(make_hello(), token="wrong")
    assert client.send_fd(hello, r)
    os.close(r)
    os.close(w)
    deadline = time.monotonic() + 5
    while not collector.problems and time.monotonic() < deadline:
        time.sleep(0.01)
    client.close()
    assert any("without the run token" in p for p in collector.problems)
    assert server.wait_idle(5)
    assert len(os.listdir("/proc/self/fd")) <= before


@pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
def test_a_ring_of_long_steps_wakes_its_probe_only_after_two_of_them(
    server: ChannelServer, collector: Collector
) -> None:
    writer, client, source, phase = ring_taken(server)

    def step(n: int, t: float) -> None:
        writer.write(n, t, 0.5, 0.0, math.nan, math.nan, -1, -1, -1, -1, -1, source, phase, -1)

    step(1, 100.0)
    collector.wait_for(2)
    written = time.monotonic()
    step(2, 100.5)  # steps 0.5 s apart, by their own times
    step(3, 101.0)
    assert read_answer(client) == WAKE
    # Not at WAKE_AFTER_S: two steps' time (1 s) is the job's normal gap. (The ring
    # moved after ``written``, and the wake-up comes 1 s after that at the soonest.)
    assert time.monotonic() - written >= 2 * 0.5 > WAKE_AFTER_S
    client.close()


@pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
def test_steps_written_just_before_the_process_ends_are_read(
    server: ChannelServer, collector: Collector
) -> None:
    writer, client, source, phase = ring_taken(server)
    for n in range(1, 6):
        writer.write(n, float(n), 0.1, 0.0, math.nan, math.nan, -1, -1, -1, -1, -1, source,
                     phase, -1)  # fmt: skip
    client.close()  # the process is gone before the next read of the ring
    steps = [m for m in collector.wait_for(6) if isinstance(m, StepRecord)]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert server.wait_idle(5)


@pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
def test_a_taken_ring_is_announced_with_a_sender_that_stops_at_the_drop(
    tmp_path: Path, collector: Collector
) -> None:
    announced: list[tuple[int, object]] = []
    got = threading.Event()

    def on_ring(pid: int, sender: object) -> None:
        announced.append((pid, sender))
        got.set()

    srv = ChannelServer(tmp_path, "tok", collector.add, collector.problems.append, on_ring=on_ring)
    srv.start()
    try:
        _writer, client, _source, _phase = ring_taken(srv)
        assert got.wait(5.0)
        pid, sender = announced[0]
        assert pid == 100 and callable(sender)
        assert sender(b"S") is True
        assert read_answer(client) == b"S"
        client.close()
        assert srv.wait_idle(5.0)
        assert sender(b"s") is False  # the connection is gone: nothing is sent
    finally:
        srv.close()
