"""The supervisor's listener: private socket, token first, messages in order."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.channel.client import ChannelClient, parse_address
from trainmedic.channel.server import ChannelServer
from trainmedic.channel.wire import STEP_COLUMNS, Goodbye, Hello, ProbeMessage, encode_message
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
