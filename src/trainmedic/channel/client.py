"""The probe's end of the channel: one connection, written from one thread.

The probe's background thread owns the client; the training thread never
touches the socket. Any error closes the client for good: a lost supervisor
must cost the job nothing, so nothing is retried and nothing is raised.
"""

from __future__ import annotations

import contextlib
import select
import socket

_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
SEND_TIMEOUT_S = 5.0
"""How long one send may block before the supervisor is considered gone, seconds."""


def parse_address(address: str) -> tuple[int, str | tuple[str, int]]:
    """``unix:/path`` -> ``(AF_UNIX, path)``; ``tcp:HOST:PORT`` -> ``(AF_INET, (host, port))``.

    Raises:
        ValueError: anything else.
    """
    scheme, _, rest = address.partition(":")
    if scheme == "unix" and rest:
        return socket.AF_UNIX, rest
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return socket.AF_INET, (host, int(port))
    raise ValueError(f"not a channel address: {address!r}")


class ChannelClient:
    """A connection to the supervisor that fails quietly.

    Attributes:
        failed: the first error that closed the client, as text, else ``None``.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: socket.socket | None = None
        self.failed: str | None = None

    @property
    def usable(self) -> bool:
        return self.failed is None

    def connect(self) -> bool:
        """Open the connection; ``False`` (and :attr:`failed` set) when that fails."""
        if self._sock is not None:
            return True
        if self.failed is not None:
            return False
        try:
            family, where = parse_address(self.address)
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(SEND_TIMEOUT_S)
            try:
                sock.connect(where)
            except BaseException:
                sock.close()
                raise
        except (OSError, ValueError) as exc:
            self.failed = f"connect to {self.address}: {exc}"
            return False
        self._sock = sock
        return True

    def send(self, data: bytes) -> bool:
        """Send ``data`` whole; ``False`` when the connection is (now) broken."""
        if not data:
            return self.usable
        if self._sock is None and not self.connect():
            return False
        assert self._sock is not None
        try:
            # MSG_NOSIGNAL: a job that restored SIGPIPE's default (many CLI scripts
            # do) must not be killed because its supervisor went away.
            self._sock.sendall(data, _NOSIGNAL)
        except OSError as exc:
            self.failed = f"send: {exc}"
            self.close()
            return False
        return True

    def send_fd(self, data: bytes, fd: int) -> bool:
        """Send ``data`` whole with a copy of ``fd`` (``SCM_RIGHTS``, Unix sockets only);
        ``False`` when the connection is (now) broken or cannot pass descriptors."""
        if self._sock is None and not self.connect():
            return False
        assert self._sock is not None
        if self._sock.family != getattr(socket, "AF_UNIX", None):
            return False
        try:
            sent = socket.send_fds(self._sock, [data], [fd], _NOSIGNAL)
            if sent < len(data):
                self._sock.sendall(data[sent:], _NOSIGNAL)
        except OSError as exc:
            self.failed = f"send: {exc}"
            self.close()
            return False
        return True

    def fileno(self) -> int | None:
        """The connection's descriptor (to wait on), ``None`` when not connected."""
        return None if self._sock is None else self._sock.fileno()

    def receive(self) -> bytes | None:
        """What the supervisor sent, without waiting: ``b""`` once it closed the
        connection (or on an error), ``None`` when there is nothing to read."""
        if self._sock is None:
            return None
        try:
            # A socket with a timeout waits for data inside recv() whatever the
            # flags say: ask first whether there is any.
            if not select.select([self._sock], [], [], 0)[0]:
                return None
            return self._sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return None
        except (OSError, ValueError):
            return b""

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def abandon(self) -> None:
        """Forget the connection without telling the peer (in a forked child,
        whose copy of the socket belongs to the parent's conversation)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            # Closing the child's descriptor leaves the parent's connection open.
            with contextlib.suppress(OSError):
                sock.close()
        self.failed = None
