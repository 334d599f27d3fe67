"""The supervisor's end of the channel: a listener thread decoding probe messages.

:class:`ChannelServer` listens on a Unix domain socket (mode 0600, in the run
directory when its path fits ``sun_path``, else in a private temporary
directory) or, where ``AF_UNIX`` is missing, on 127.0.0.1. Each connection
must open with a hello carrying the run's token; later lines are decoded and
handed to ``handler`` in arrival order, from the server's one thread.

A hello may come with the descriptor of a shared-memory step ring
(:mod:`trainmedic.channel.ring`). The server then answers
:data:`~trainmedic.channel.wire.RING_TAKEN`, reads the ring every
:data:`DRAIN_S` and before each batch of the connection's lines (so steps
come before the messages the process sent after them), and, when a ring
that moved stops for :data:`WAKE_AFTER_S`, sends
:data:`~trainmedic.channel.wire.WAKE` once: the probe's thread sleeps while
steps flow, and a silence is when the supervisor needs its heartbeats.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.channel.ring import RingError, RingReader
from trainmedic.channel.wire import (
    RING_REFUSED,
    RING_TAKEN,
    WAKE,
    Hello,
    ProbeMessage,
    StepBatch,
    decode_line,
)

SOCKET_NAME = "probe.sock"
MAX_LINE_BYTES = 16 * 1024 * 1024
"""A connection sending a longer line is dropped (the probe never does)."""
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path is 104 (macOS) or 108 (Linux) bytes; keep margin.
_RECV_BYTES = 256 * 1024
_FD_SPACE = socket.CMSG_SPACE(8 * 4) if hasattr(socket, "CMSG_SPACE") else 0
DRAIN_S = 0.1
"""Seconds between two reads of the step rings."""
WAKE_AFTER_S = 0.3
"""A ring that stopped moving for this long gets its probe's thread woken, seconds
(the watchdog calls a job silent after half a second without a step)."""
WAKE_AFTER_STEPS = 2.0
"""... or for this many of its recent steps, when longer: a job of 1 s steps is not
silent between two of them, and its probe's thread need not wake at each."""

MessageHandler = Callable[[ProbeMessage], None]
ProblemHandler = Callable[[str], None]
Sender = Callable[[bytes], bool]
"""Sends bytes to one connection's probe; ``False`` once the connection is gone."""
RingListener = Callable[[int, Sender], None]
"""Told ``(pid, sender)`` when a process's ring is taken (from the server's thread)."""


@dataclass
class _Connection:
    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    pid: int | None = None
    fd: int | None = None
    """A descriptor that came before the hello (the ring it may announce)."""
    ring: RingReader | None = None
    ring_moved: float = 0.0
    """When the ring last gave a step (monotonic s); 0 before the first."""
    woken: bool = False
    """Whether the probe was woken since the ring last moved."""
    last_t: float | None = None
    """The latest step's end (Unix s)."""
    step_s: float = 0.0
    """The recent time between two steps (a moving average), seconds."""
    closed: bool = False
    """Dropped: nothing more is sent on it."""


class ChannelServer:
    """Accepts probe connections and feeds their messages to ``handler``.

    Args:
        directory: where the socket file goes (the run directory).
        token: the secret a hello must carry.
        handler: called with every decoded message, from the server thread.
        on_problem: told, once per kind of problem, about a bad connection or
            a handler that raised; the server keeps going.
        use_unix: ``False`` forces the TCP fallback (tests, platforms without it).
    """

    def __init__(
        self,
        directory: Path,
        token: str,
        handler: MessageHandler,
        on_problem: ProblemHandler | None = None,
        use_unix: bool | None = None,
        on_ring: RingListener | None = None,
    ) -> None:
        self._token = token
        self._on_ring = on_ring
        self._send_lock = threading.Lock()
        self._handler = handler
        self._on_problem = on_problem or (lambda _message: None)
        self._problems_seen: set[str] = set()
        self._tempdir: str | None = None
        self._socket_path: str | None = None
        if use_unix is None:
            use_unix = hasattr(socket, "AF_UNIX")
        self._listener = self._listen_unix(directory) if use_unix else self._listen_tcp()
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._connections: dict[int, _Connection] = {}
        self._stopping = threading.Event()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="trainmedic-channel", daemon=True)
        self.messages = 0
        self.connections_total = 0

    # --- setup ----------------------------------------------------------------------

    def _listen_unix(self, directory: Path) -> socket.socket:
        path = str(Path(directory) / SOCKET_NAME)
        if len(os.fsencode(path)) > _SUN_PATH_MAX:
            # A deep run directory does not fit sun_path; a private temp dir does.
            self._tempdir = tempfile.mkdtemp(prefix="trainmedic-")
            path = os.path.join(self._tempdir, SOCKET_NAME)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(128)
        self._socket_path = path
        self.address = f"unix:{path}"
        return sock

    def _listen_tcp(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        host, port = sock.getsockname()[:2]
        self.address = f"tcp:{host}:{port}"
        return sock

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every accepted connection has closed; ``False`` on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._connections:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        """Stop the thread after it has read what is already buffered; remove the socket."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        for conn in list(self._connections.values()):
            self._drop(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(OSError, ValueError):
            self._selector.close()
        if self._socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._socket_path)
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)

    # --- the thread -------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping.is_set():
            rings = any(c.ring is not None for c in self._connections.values())
            try:
                events = self._selector.select(timeout=DRAIN_S if rings else 1.0)
            except (OSError, ValueError):
                return
            for key, _mask in events:
                if key.data == "wake":
                    continue
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            if rings:
                self._drain_rings()
        # Read what is left in the kernel buffers before closing.
        for conn in list(self._connections.values()):
            self._read(conn, final=True)

    def _drain_rings(self) -> None:
        now = time.monotonic()
        for conn in list(self._connections.values()):
            if conn.ring is None or self._drain(conn):
                continue
            after = max(WAKE_AFTER_S, WAKE_AFTER_STEPS * conn.step_s)
            if conn.ring_moved and not conn.woken and now - conn.ring_moved >= after:
                conn.woken = True
                with contextlib.suppress(OSError):
                    conn.sock.send(WAKE, socket.MSG_DONTWAIT)

    def _drain(self, conn: _Connection) -> bool:
        """Hand on the steps the connection's ring holds; ``True`` when there were any."""
        ring = conn.ring
        if ring is None:
            return False
        lost, malformed = ring.lost, ring.malformed
        steps = ring.drain()
        if ring.lost != lost:
            self._problem(
                "ring-lost",
                f"channel: steps of pid {ring.pid} were overwritten in shared memory before "
                "they were read (the supervisor fell behind)",
            )
        if ring.malformed != malformed:
            self._problem("ring-malformed", f"channel: malformed steps in pid {ring.pid}'s ring")
        if not steps:
            return False
        conn.ring_moved, conn.woken = time.monotonic(), False
        last = steps[-1].t
        if conn.last_t is not None and last > conn.last_t:
            between = (last - conn.last_t) / len(steps)
            conn.step_s = between if not conn.step_s else 0.7 * conn.step_s + 0.3 * between
        conn.last_t = last
        self._hand_on(steps)
        return True

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._problem("accept", f"channel: accept failed: {exc}")
                return
            sock.setblocking(False)
            conn = _Connection(sock)
            self._connections[sock.fileno()] = conn
            self.connections_total += 1
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection, final: bool = False) -> None:
        while True:
            try:
                chunk = self._recv(conn)
            except (BlockingIOError, InterruptedError):
                if final:
                    self._drain(conn)
                    self._drop(conn)
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._lines(conn, final=True)
                self._drain(conn)
                self._drop(conn)
                return
            conn.buffer += chunk
            if not self._lines(conn):
                self._drop(conn)
                return

    def _recv(self, conn: _Connection) -> bytes:
        """Bytes from the connection; before its hello, with any descriptor passed along."""
        if conn.pid is not None or not _FD_SPACE or conn.sock.family != socket.AF_UNIX:
            return conn.sock.recv(_RECV_BYTES)
        data, ancillary, _flags, _addr = conn.sock.recvmsg(_RECV_BYTES, _FD_SPACE)
        for level, kind, payload in ancillary:
            if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
                continue
            usable = len(payload) - len(payload) % 4
            for fd in memoryview(payload)[:usable].cast("i"):
                if conn.fd is None:
                    conn.fd = fd
                else:
                    os.close(fd)  # one ring per connection: nothing else is expected
        return data

    def _lines(self, conn: _Connection, final: bool = False) -> bool:
        """Decode complete lines in the buffer; ``False`` when the connection must go."""
        buf = conn.buffer
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buf[start:end])
            start = end + 1
            if not self._line(conn, line):
                return False
        del buf[:start]
        if len(buf) > MAX_LINE_BYTES:
            self._problem(
                "long-line", "channel: a probe sent an over-long line; connection dropped"
            )
            return False
        if final and buf:
            buf.clear()  # a half line from a process that died mid-send
        return True

    def _line(self, conn: _Connection, line: bytes) -> bool:
        if not line.strip():
            return True
        try:
            message, token = decode_line(line)
        except (ValueError, KeyError, TypeError) as exc:
            if conn.pid is None:
                return False
            self._problem("malformed", f"channel: malformed message from pid {conn.pid}: {exc}")
            return True
        if conn.pid is None:
            if not isinstance(message, Hello) or not hmac.compare_digest(token or "", self._token):
                self._problem(
                    "unauthenticated", "channel: refused a connection without the run token"
                )
                return False
            conn.pid = message.pid
            self._hand_on((message,))
            self._take_ring(conn, message)
            return True
        self._drain(conn)  # the steps the process wrote before it sent this line
        self._hand_on(message.steps if isinstance(message, StepBatch) else (message,))
        return True

    def _take_ring(self, conn: _Connection, hello: Hello) -> None:
        """Map the ring the hello announced and say whether it will be read."""
        fd, conn.fd = conn.fd, None
        if not hello.ring:
            if fd is not None:
                os.close(fd)
            return
        answer = RING_REFUSED
        if fd is not None:
            try:
                conn.ring = RingReader(fd, hello.pid, hello.rank)
                answer = RING_TAKEN
            except (RingError, OSError, ValueError) as exc:
                self._problem("ring", f"channel: pid {hello.pid}'s step ring is unreadable: {exc}")
        with contextlib.suppress(OSError):
            conn.sock.send(answer, socket.MSG_DONTWAIT)
        if answer == RING_TAKEN and self._on_ring is not None:
            try:
                self._on_ring(hello.pid, self._sender(conn))
            except Exception as exc:  # a bug in a consumer must not stop the channel
                self._problem("ring-listener", f"channel: {type(exc).__name__}: {exc}")

    def _sender(self, conn: _Connection) -> Sender:
        """Sends to ``conn`` from any thread, until it is dropped."""

        def send(data: bytes) -> bool:
            with self._send_lock:
                if conn.closed:
                    return False
                try:
                    conn.sock.send(data, socket.MSG_DONTWAIT)
                except OSError:
                    return False
                return True

        return send

    def _hand_on(self, messages: Iterable[ProbeMessage]) -> None:
        for one in messages:
            self.messages += 1
            try:
                self._handler(one)
            except Exception as exc:  # a bug in a consumer must not stop the channel
                self._problem(
                    f"handler-{type(exc).__name__}",
                    f"channel: handling {type(one).__name__} failed: {type(exc).__name__}: {exc}",
                )

    def _drop(self, conn: _Connection) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        with self._send_lock:
            conn.closed = True
            with contextlib.suppress(OSError):
                conn.sock.close()
        fd, conn.fd = conn.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        ring, conn.ring = conn.ring, None
        if ring is not None:
            with contextlib.suppress(BufferError, ValueError):
                ring.close()
        with self._idle:
            for fd, c in list(self._connections.items()):
                if c is conn:
                    del self._connections[fd]
            self._idle.notify_all()

    def _problem(self, kind: str, message: str) -> None:
        if kind in self._problems_seen:
            return
        self._problems_seen.add(kind)
        with contextlib.suppress(Exception):
            self._on_problem(message)
