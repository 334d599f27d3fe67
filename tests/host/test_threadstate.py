"""What a thread is doing as the kernel sees it (trainmedic.host.threadstate)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trainmedic.host.threadstate import (
    KernelState,
    child_pids,
    connection_count,
    fd_kind,
    kernel_class,
    parse_syscall,
    read_kernel_state,
    stat_state,
)

LINUX = sys.platform.startswith("linux") and Path("/proc/self/task").is_dir()


@pytest.mark.parametrize(
    ("text", "machine", "expected"),
    [
        ("running", "x86_64", ("running", None)),
        ("45 0x3 0x7f 0xa 0x0 0x0 0x0 0x7f 0x7f", "x86_64", ("recvfrom", 3)),
        ("44 0x5 0x0", "x86_64", ("sendto", 5)),
        ("202 0x7f 0x80 0x0", "x86_64", ("futex", None)),
        ("207 0x4 0x0", "aarch64", ("recvfrom", 4)),
        ("-1 0x0", "x86_64", ("none", None)),
        ("999 0x0", "x86_64", ("syscall 999", None)),
        ("", "x86_64", (None, None)),
    ],
)
def test_syscall_lines(text: str, machine: str, expected: tuple[str | None, int | None]) -> None:
    assert parse_syscall(text, machine) == expected


def test_stat_state_survives_a_command_with_spaces_and_parentheses() -> None:
    assert stat_state("123 (my (odd) prog) S 1 2 3") == "S"
    assert stat_state("") is None


@pytest.mark.parametrize(
    ("link", "kind"),
    [("socket:[123]", "socket"), ("pipe:[9]", "pipe"), ("/data/x.npy", "file"),
     ("anon_inode:[eventfd]", "other"), (None, None)],
)  # fmt: skip
def test_descriptor_kinds(link: str | None, kind: str | None) -> None:
    assert fd_kind(link) == kind


@pytest.mark.parametrize(
    ("state", "klass"),
    [
        (KernelState("R", "running"), "running"),
        (KernelState("R", None), "running"),
        (KernelState("D", "read", "file"), "disk"),
        (KernelState("S", "recvfrom", "socket"), "socket"),
        (KernelState("S", "read", "socket"), "socket"),
        (KernelState("S", "read", "file"), "file"),
        (KernelState("S", "read", "pipe"), "pipe"),
        (KernelState("S", "futex"), "lock"),
        (KernelState("S", "epoll_wait"), "poll"),
        (KernelState("S", "clock_nanosleep"), "sleep"),
        (KernelState("S", "wait4"), "child"),
        (KernelState("S", None), None),
    ],
)
def test_kernel_classes(state: KernelState, klass: str | None) -> None:
    assert kernel_class(state) == klass


def _blocked(target: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    time.sleep(0.05)
    return t


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_live_threads_read_as_blocked_in_what_they_wait_on() -> None:
    a, b = socket.socketpair()
    r, w = os.pipe()
    stop = threading.Event()
    try:
        receiver = _blocked(lambda: a.recv(1))
        reader = _blocked(lambda: os.read(r, 1))
        sleeper = _blocked(lambda: stop.wait(5))
        classes = {}
        for name, t in (("receiver", receiver), ("reader", reader), ("sleeper", sleeper)):
            k = read_kernel_state("self", t.native_id or 0)
            assert k is not None
            classes[name] = kernel_class(k)
        assert classes == {"receiver": "socket", "reader": "pipe", "sleeper": "lock"}
        assert read_kernel_state("self", 2**30) is None  # no such thread
    finally:
        b.send(b"x")
        os.write(w, b"x")
        stop.set()
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_children_and_their_connections() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = (
        f"import socket, sys; s = socket.create_connection(('127.0.0.1', {port})); "
        "print('up', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        conn, _ = server.accept()
        assert child.pid in child_pids()
        assert connection_count(child.pid) == 1
        assert connection_count(2**30) == 0  # gone
        conn.close()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
        server.close()
