"""Naming the supervisor as a process that may read the job, where Yama asks for it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from trainmedic.probe.ptracer import allow_supervisor, peer_pid, yama_scope


def test_the_peer_of_a_unix_socket_is_the_process_that_holds_its_other_end() -> None:
    a, b = socket.socketpair()
    try:
        assert peer_pid(a.fileno()) == os.getpid()
        a.send(b"x")  # the descriptor is still the socket's own after the look-up
        assert b.recv(1) == b"x"
    finally:
        a.close()
        b.close()


def test_only_yamas_scope_one_names_anyone(tmp_path: Path) -> None:
    a, b = socket.socketpair()
    try:
        for scope in (0, 2, 3):
            assert allow_supervisor(a.fileno(), scope=scope) is False
        # Scope 1: prctl names the peer; without Yama in this kernel it is refused.
        named = allow_supervisor(a.fileno(), scope=1)
        assert named is (yama_scope() is not None)
    finally:
        a.close()
        b.close()


def test_the_scope_is_read_from_the_kernels_file(tmp_path: Path) -> None:
    scope = tmp_path / "ptrace_scope"
    scope.write_text("1\n")
    assert yama_scope(str(scope)) == 1
    scope.write_text("nonsense")
    assert yama_scope(str(scope)) is None
    assert yama_scope(str(tmp_path / "missing")) is None
