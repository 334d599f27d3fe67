"""The HTTP endpoint of ``trainmedic run --prometheus [ADDR:]PORT``.

:func:`parse_listen` checks the option's value; :func:`start_exporter` binds
the port before the job starts (so a port in use or a bad address is a usage
error with nothing started) and serves ``/metrics`` from prometheus-client's
own server, in its own daemon thread, from a private registry that holds
only trainmedic's collector (no process or platform collectors of the
supervisor). 127.0.0.1 unless an address is given.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from trainmedic.errors import UsageError
from trainmedic.supervise.live.metrics import MetricsCollector, MetricsState

DEFAULT_ADDRESS = "127.0.0.1"


@dataclass(frozen=True)
class ListenAddress:
    """Where the exporter listens."""

    host: str
    port: int

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}/metrics"


def parse_listen(value: str) -> ListenAddress:
    """``PORT``, ``ADDR:PORT`` or ``[IPV6]:PORT``; a bad value is a :class:`UsageError`.

    ``ADDR`` is an IP address or a host name that resolves; port 0 asks the
    system for a free one (announced when the run starts).
    """
    text = value.strip()
    if not text:
        raise UsageError("--prometheus: give a port, or ADDR:PORT (e.g. 9400 or 0.0.0.0:9400)")
    host, port_text = DEFAULT_ADDRESS, text
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1 :].startswith(":"):
            raise UsageError(f"--prometheus {value!r}: write an IPv6 address as [ADDR]:PORT")
        host, port_text = text[1:end], text[end + 2 :]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise UsageError(f"--prometheus {value!r}: write an IPv6 address as [ADDR]:PORT")
    # ASCII digits only: str.isdigit() also takes "²" and other digits int() refuses.
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"--prometheus {value!r}: the port must be a number from 0 to 65535")
    if not host:
        raise UsageError(f"--prometheus {value!r}: the address before ':' is empty")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError):
            raise UsageError(
                f"--prometheus {value!r}: {host!r} is neither an IP address nor a known host name"
            ) from None
    return ListenAddress(host, int(port_text))


class Exporter:
    """A running exporter; :meth:`close` stops it."""

    def __init__(self, state: MetricsState, address: ListenAddress, server: Any,
                 thread: threading.Thread) -> None:  # fmt: skip
        self.state = state
        self.address = address
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return self.address.url(self.port)

    def close(self) -> None:
        try:
            self._server.shutdown()
            self._server.server_close()
        except Exception:
            return  # ending anyway: the thread is a daemon


REQUEST_TIMEOUT_S = 10.0
"""Seconds a connection to ``/metrics`` may take to send its request."""


def start_exporter(state: MetricsState, address: ListenAddress) -> Exporter:
    """Bind and serve; a port in use or an address not on this machine is a
    :class:`UsageError` naming it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(state))
    where = address.url().removesuffix("/metrics")
    try:
        server, thread = start_http_server(address.port, addr=address.host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = f"port {address.port} is already in use"
        elif exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            why = f"{address.host} is not an address of this machine"
        elif exc.errno == errno.EACCES:
            why = f"no permission to listen on port {address.port}"
        else:
            why = exc.strerror or str(exc)
        raise UsageError(f"--prometheus: cannot listen on {where}: {why}") from None
    # A connection that sends nothing (half-open, a port scanner) would hold its
    # thread for good: each request gets REQUEST_TIMEOUT_S to arrive.
    handler: Any = server.RequestHandlerClass
    server.RequestHandlerClass = type("TimedHandler", (handler,), {"timeout": REQUEST_TIMEOUT_S})
    return Exporter(state, address, server, thread)


def reachable_from_others(address: ListenAddress) -> bool:
    """Whether other machines may read the metrics: any address but loopback."""
    try:
        return not ipaddress.ip_address(address.host).is_loopback
    except ValueError:
        return address.host != "localhost"


__all__ = [
    "DEFAULT_ADDRESS",
    "Exporter",
    "ListenAddress",
    "parse_listen",
    "reachable_from_others",
    "start_exporter",
]
