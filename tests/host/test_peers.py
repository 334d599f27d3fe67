"""The process at the far end of a socket, from /proc and the kernel (trainmedic.host.peers)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.host.peers import (
    LocalPeers,
    mirror_inodes,
    parse_unix_diag,
    process_activity,
    process_name,
    unix_peers,
)
from trainmedic.host.threadstate import TcpRow

LINUX = sys.platform.startswith("linux") and Path("/proc/self/task").is_dir()

# A server in a process of its own: it accepts one connection on TCP (127.0.0.1) or a
# Unix socket and then computes (``busy``) or sleeps; it ends when its stdin closes.
SERVER = """
import os, socket, sys, threading
kind, path, mode = sys.argv[1:4]
if kind == "tcp":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); where = str(s.getsockname()[1])
else:
    s = socket.socket(socket.AF_UNIX); s.bind(path); where = path
s.listen()
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
print(where, flush=True)
c, _ = s.accept()
print("accepted", flush=True)
x = 0
while True:
    if mode == "busy":
        x = (x * 31 + 7) % 1000003
    else:
        threading.Event().wait(1)
"""


def inode(sock: socket.socket) -> str:
    return os.readlink(f"/proc/self/fd/{sock.fileno()}")[8:-1]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []
    socks: list[socket.socket] = []

    def start(kind: str, mode: str) -> tuple[subprocess.Popen[str], socket.socket]:
        path = str(tmp_path / f"s{len(procs)}.sock")
        p = subprocess.Popen(
            [sys.executable, "-c", SERVER, kind, path, mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(p)
        assert p.stdout is not None
        where = p.stdout.readline().strip()
        if kind == "tcp":
            c = socket.create_connection(("127.0.0.1", int(where)))
        else:
            c = socket.socket(socket.AF_UNIX)
            c.connect(where)
        assert p.stdout.readline().strip() == "accepted"  # its end now held by it
        socks.append(c)
        return p, c

    yield start
    for c in socks:
        c.close()
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_for(pid: int, activity: str) -> tuple[str, int] | None:
    deadline = time.monotonic() + 10
    seen = process_activity(pid)
    while (seen is None or seen[0] != activity) and time.monotonic() < deadline:
        time.sleep(0.01)
        seen = process_activity(pid)
    return seen


# --- pure parts ------------------------------------------------------------------------------


def test_a_tcp_connection_is_mirrored_by_its_far_end_in_the_same_table() -> None:
    rows = [
        TcpRow("0100007F:A000", "0100007F:1F90", "01", "11"),  # ours -> :8080
        TcpRow("0100007F:1F90", "0100007F:A000", "01", "22"),  # the server's end
        TcpRow("0100007F:1F90", "00000000:0000", "0A", "23"),  # its listening socket
        TcpRow("0A000001:B000", "5DB8D822:01BB", "01", "12"),  # ours -> far away
        TcpRow("0100007F:C000", "0100007F:C001", "01", "13"),  # within the process
        TcpRow("0100007F:C001", "0100007F:C000", "01", "14"),
    ]
    assert mirror_inodes(rows, {"11", "12", "13", "14"}) == {"11": "22"}


def diag_message(ino: int, peer: int | None, kind: int = 20) -> bytes:
    attrs = struct.pack("=HHI", 8, 2, peer) if peer is not None else b""
    body = struct.pack("=BBBBIII", 1, 1, 1, 0, ino, 0, 0) + struct.pack("=HHI", 8, 9, 7) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, 2, 1, 0) + body


def test_socket_diagnostics_give_the_peers_of_the_sockets_asked_for() -> None:
    data = diag_message(101, 201) + diag_message(102, 202) + diag_message(103, None)
    out: dict[str, str] = {}
    assert parse_unix_diag(data, {"101", "103"}, out) is False  # more to read
    assert out == {"101": "201"}
    assert parse_unix_diag(struct.pack("=IHHII", 16, 3, 2, 1, 0), {"101"}, out) is True


@pytest.mark.parametrize(
    "data",
    [b"\x01\x00", struct.pack("=IHHII", 8, 20, 0, 0, 0), struct.pack("=IHHII", 4000, 20, 0, 0, 0)],
)
def test_malformed_diagnostics_end_the_reading_without_an_error(data: bytes) -> None:
    out: dict[str, str] = {}
    parse_unix_diag(data, {"1"}, out)
    assert out == {}


# --- live ------------------------------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_the_process_answering_on_a_socket_is_found(server, kind: str) -> None:  # type: ignore[no-untyped-def]
    proc, sock = server(kind, "idle")
    if kind == "unix" and not unix_peers({inode(sock)}):
        pytest.skip("no socket diagnostics here (NETLINK_SOCK_DIAG)")
    peers = LocalPeers()
    peer = peers.peer(inode(sock))
    assert peer is not None and peer.pid == proc.pid
    assert peer.name.startswith("python")  # a short name: the base name of the program
    assert "/" not in peer.name.split()[0]


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_sockets_to_nobody_on_this_machine_have_no_peer_and_scans_are_paced(server) -> None:  # type: ignore[no-untyped-def]
    a, b = socket.socketpair()  # both ends in this process: no server
    now = [0.0]
    peers = LocalPeers(monotonic=lambda: now[0], scan_s=10.0)
    try:
        assert peers.peer(inode(a)) is None
        assert peers.scans == 1
        proc, sock = server("tcp", "idle")  # a connection made after the scan
        assert peers.peer(inode(sock)) is None and peers.scans == 1  # until the next scan
        now[0] = 10.0
        found = peers.peer(inode(sock))
        assert found is not None and found.pid == proc.pid and peers.scans == 2
        assert peers.peer(inode(sock)) == found and peers.scans == 2  # kept
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_server_computing_is_on_a_cpu_and_one_sleeping_waits(server) -> None:  # type: ignore[no-untyped-def]
    busy, _ = server("tcp", "busy")
    idle, _ = server("tcp", "idle")
    seen = wait_for(busy.pid, "cpu")
    assert seen is not None and seen[0] == "cpu" and seen[1] >= 1
    assert wait_for(idle.pid, "wait") == ("wait", 0)
    assert process_activity(2**22 + 12345) is None  # no such process


def test_a_process_name_is_printable_and_short(tmp_path: Path) -> None:
    proc = tmp_path / "42"
    proc.mkdir()
    (proc / "cmdline").write_bytes(b"/usr/bin/python3\0/srv/app/store.py\0--port\x1b\0" + b"x" * 90)
    name = process_name(42, str(tmp_path))
    assert name.startswith("python3 store.py --port? xxx") and len(name) == 60
    (proc / "cmdline").write_bytes(b"")
    (proc / "comm").write_text("kworker")
    assert process_name(42, str(tmp_path)) == "kworker"


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_the_sole_peer_is_the_one_server_and_none_when_there_are_several(server) -> None:  # type: ignore[no-untyped-def]
    first, _ = server("tcp", "idle")
    peers = LocalPeers(scan_s=0.0)
    sole = peers.sole()
    # (this test process may hold other connections to this machine: then there is none)
    assert sole is None or sole.pid == first.pid
    if sole is None:
        return
    server("tcp", "idle")
    assert peers.sole() is None  # two servers: no guessing between them
