"""Measured latency and throughput to the place the training data comes from.

:func:`measure_network` times each stage of one fetch separately — name
resolution, TCP connect, TLS handshake, first byte, download — on a socket it
opens itself, within a time budget. A target that cannot be reached is a
measurement with ``error`` and ``error_stage`` set, never an exception: that
it cannot be reached is the finding. Only a malformed target raises
:class:`InputError` (the user typed something that is not a target).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmedic.errors import InputError
from trainmedic.host.nettarget import is_ip_literal, masked, parse_target

if TYPE_CHECKING:
    # Imported where used: together they cost ~50 ms, and every doctor run
    # imports this module for its dataclass, with or without --data-url.
    import http.client
    import ssl

Clock = Callable[[], float]
"""Monotonic seconds."""

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]
Resolver = Callable[[str, int], Sequence[AddrInfo]]
"""``(host, port) -> getaddrinfo results``; a seam so tests need no DNS."""

MIB = 1024 * 1024

DEFAULT_MAX_BYTES = 64 * MIB
"""Download sample size: long enough for TCP to leave slow start on a fast link."""

MIN_THROUGHPUT_SAMPLE_BYTES = 1 * MIB
"""Below this a download rate mostly measures latency and slow start: not reported."""

MAX_REDIRECTS = 5

SERVER_FIRST_WAIT_S = 0.5
"""How long a host:port target may take to speak first (SSH, SMTP banners)."""


@dataclass(frozen=True)
class NetworkMeasurement:
    """What fetching from ``--data-url`` showed.

    Attributes:
        target: the URL or host:port as given (a password in it is masked).
        host / port / scheme: parsed target (scheme ``tcp`` for host:port).
        dns_ms: name resolution time, milliseconds.
        connect_ms: TCP connect time (one round trip), milliseconds.
        ttfb_ms: time from sending the request to the first byte of the
            response, milliseconds (for ``tcp``: of the server's greeting, if any).
        throughput_mib_per_s: download rate over the bounded sample, MiB/s;
            ``None`` when the sample was too small to mean anything.
        bytes_read: body bytes downloaded.
        http_status: status of the last response.
        error: why the target could not be reached, else ``None``.
        error_stage: ``dns``, ``connect``, ``tls``, ``http`` or ``read``.
        tls_ms: TLS handshake time, milliseconds (https only).
        address: the IP address connected to.
        redirects: redirects followed; the numbers are those of the last hop.
        final_url: the URL the data came from after redirects.
        note: what limited the measurement.
    """

    target: str
    host: str
    port: int
    scheme: str
    dns_ms: float | None = None
    connect_ms: float | None = None
    ttfb_ms: float | None = None
    throughput_mib_per_s: float | None = None
    bytes_read: int = 0
    http_status: int | None = None
    error: str | None = None
    error_stage: str | None = None
    tls_ms: float | None = None
    address: str | None = None
    redirects: int = 0
    final_url: str | None = None
    note: str | None = None


def _system_resolver(host: str, port: int) -> Sequence[AddrInfo]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class _StageError(Exception):
    """A stage failed; carries the stage name for the measurement."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _describe(exc: BaseException) -> str:
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verification failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, socket.gaierror):
        return f"name resolution failed: {exc.strerror or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port, or a firewall rejects it)"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class _Deadline:
    """The budget's end, as socket timeouts."""

    def __init__(self, clock: Clock, budget_s: float) -> None:
        self.clock = clock
        self.end = clock() + budget_s

    def left(self, stage: str) -> float:
        left = self.end - self.clock()
        if left <= 0:
            raise _StageError(stage, "time budget used up")
        return left


def _resolve(resolver: Resolver, host: str, port: int, deadline: _Deadline) -> Sequence[AddrInfo]:
    """Run the resolver in a thread: ``getaddrinfo`` has no timeout of its own."""
    result: list[Sequence[AddrInfo]] = []
    failure: list[BaseException] = []
    if is_ip_literal(host):
        # Nothing to look up, nothing that can hang: a thread would only add
        # its start-up time to the reading.
        try:
            return resolver(host, port)
        except OSError as exc:
            raise _StageError("dns", _describe(exc)) from None

    def work() -> None:
        try:
            result.append(resolver(host, port))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=work, name="trainmedic-dns", daemon=True)
    thread.start()
    thread.join(deadline.left("dns"))
    if thread.is_alive():
        raise _StageError("dns", f"name resolution of {host} timed out")
    if failure:
        raise _StageError("dns", _describe(failure[0]))
    if not result or not result[0]:
        raise _StageError("dns", f"{host} resolved to no address")
    return result[0]


def _connect(infos: Sequence[AddrInfo], deadline: _Deadline) -> tuple[socket.socket, str]:
    """A socket connected to the first address that accepts, and that address.

    Tries the addresses in order, as ``socket.create_connection`` does.
    """
    last: BaseException | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left("connect"))
            sock.connect(address)
            return sock, str(address[0])
        except _StageError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            last = exc
    raise _StageError("connect", _describe(last) if last else "no address to connect to")


@dataclass
class _Hop:
    dns_ms: float | None = None
    connect_ms: float | None = None
    tls_ms: float | None = None
    ttfb_ms: float | None = None
    address: str | None = None
    status: int | None = None
    location: str | None = None
    body_bytes: int = 0
    body_s: float = 0.0
    truncated_by_budget: bool = False


def _fetch(
    scheme: str,
    host: str,
    port: int,
    path: str,
    hop: _Hop,
    deadline: _Deadline,
    resolver: Resolver,
    ssl_context: ssl.SSLContext | None,
    max_bytes: int,
) -> None:
    """One request; fills ``hop`` stage by stage, raises :class:`_StageError` on failure."""
    import ssl

    clock = deadline.clock
    try:
        # Internationalized names travel as punycode (DNS, SNI, Host header).
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise _StageError("dns", f"{host!r} is not a valid host name") from None
    t0 = clock()
    infos = _resolve(resolver, host, port, deadline)
    hop.dns_ms = _ms(clock() - t0)
    t0 = clock()
    sock, hop.address = _connect(infos, deadline)
    hop.connect_ms = _ms(clock() - t0)
    try:
        if scheme == "https":
            context = ssl_context or ssl.create_default_context()
            t0 = clock()
            sock.settimeout(deadline.left("tls"))
            sock = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
            try:
                sock.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                raise _StageError("tls", _describe(exc)) from None
            hop.tls_ms = _ms(clock() - t0)
        if scheme == "tcp":
            _await_greeting(sock, hop, deadline)
        else:
            _http_get(sock, host, port, path, hop, deadline, max_bytes)
    finally:
        sock.close()


def _await_greeting(sock: socket.socket, hop: _Hop, deadline: _Deadline) -> None:
    """Time a server's first bytes, for protocols where the server speaks first."""
    clock = deadline.clock
    t0 = clock()
    try:
        sock.settimeout(min(SERVER_FIRST_WAIT_S, deadline.left("read")))
        if sock.recv(1):
            hop.ttfb_ms = _ms(clock() - t0)
    except (_StageError, OSError):
        # Most protocols wait for the client: silence is normal, not an error.
        pass


def _ascii_path(path: str) -> str:
    """``path`` with non-ASCII characters percent-encoded, as HTTP requires."""
    return "".join(c if c.isascii() else urllib.parse.quote(c) for c in path)


def _http_get(
    sock: socket.socket,
    host: str,
    port: int,
    path: str,
    hop: _Hop,
    deadline: _Deadline,
    max_bytes: int,
) -> None:
    import http.client

    clock = deadline.clock
    conn = http.client.HTTPConnection(host, port)
    # http.client would connect on its own; handing it our socket keeps the
    # DNS, connect and TLS stages timed apart.
    conn.sock = sock
    try:
        t0 = clock()
        try:
            sock.settimeout(deadline.left("http"))
            conn.putrequest("GET", _ascii_path(path), skip_accept_encoding=True)
            conn.putheader("User-Agent", "trainmedic-doctor")
            conn.putheader("Accept-Encoding", "identity")
            # Ask only for the sample; servers that ignore it are cut off below.
            conn.putheader("Range", f"bytes=0-{max_bytes - 1}")
            conn.putheader("Connection", "close")
            conn.endheaders()
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise _StageError("http", _describe(exc)) from None
        hop.ttfb_ms = _ms(clock() - t0)
        hop.status = response.status
        if 300 <= response.status < 400:
            hop.location = response.getheader("Location")
            return
        if response.status >= 400:
            raise _StageError("http", f"HTTP {response.status} {response.reason}".strip())
        _download(response, sock, hop, deadline, max_bytes)
    finally:
        conn.sock = None
        conn.close()


def _download(
    response: http.client.HTTPResponse,
    sock: socket.socket,
    hop: _Hop,
    deadline: _Deadline,
    max_bytes: int,
) -> None:
    """Read the body until ``max_bytes``, its end or the deadline."""
    import http.client

    clock = deadline.clock
    buffer = memoryview(bytearray(256 * 1024))
    t0 = clock()
    try:
        while hop.body_bytes < max_bytes:
            left = deadline.end - clock()
            if left <= 0:
                hop.truncated_by_budget = True
                break
            if response.isclosed():
                # http.client closes the response once the body is complete.
                break
            # The response reads through a file made from this socket.
            sock.settimeout(left)
            n = response.readinto(buffer[: min(len(buffer), max_bytes - hop.body_bytes)])
            if not n:
                break
            hop.body_bytes += n
    except TimeoutError:
        hop.truncated_by_budget = True
    except (OSError, http.client.HTTPException) as exc:
        raise _StageError("read", f"{_describe(exc)} after {hop.body_bytes} bytes") from None
    finally:
        hop.body_s = clock() - t0


def measure_network(
    target: str,
    budget_s: float = 10.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    resolver: Resolver = _system_resolver,
    clock: Clock = time.monotonic,
    ssl_context: ssl.SSLContext | None = None,
) -> NetworkMeasurement:
    """Measure one fetch from ``target`` within ``budget_s`` seconds.

    Args:
        target: ``http(s)://host[:port]/path`` or ``host:port``.
        budget_s: time for all stages together, seconds.
        max_bytes: body bytes to download at most.
        resolver: name resolution (``getaddrinfo`` by default).
        clock: monotonic seconds.
        ssl_context: TLS settings; ``None`` uses the system's trusted CAs with
            certificate and host name verification.

    Raises:
        InputError: ``target`` is malformed (see :func:`parse_target`).
    """
    scheme, host, port, path = parse_target(target)
    deadline = _Deadline(clock, budget_s)
    redirects = 0
    url: str | None = None
    error: _StageError | None = None
    while True:
        hop = _Hop()
        try:
            _fetch(scheme, host, port, path, hop, deadline, resolver, ssl_context, max_bytes)
        except _StageError as exc:
            error = exc
            break
        if hop.location is None or redirects >= MAX_REDIRECTS:
            break
        # Data hosts (Hugging Face, S3 presigned, CDNs) redirect to where the
        # bytes really are: measure that place, not the front door.
        url = urllib.parse.urljoin(url or target, hop.location)
        try:
            scheme, host, port, path = parse_target(url)
        except InputError:
            error = _StageError("http", f"redirect to an unusable location {hop.location!r}")
            break
        redirects += 1

    notes: list[str] = []
    throughput: float | None = None
    if hop.body_bytes >= MIN_THROUGHPUT_SAMPLE_BYTES and hop.body_s > 0:
        throughput = hop.body_bytes / MIB / hop.body_s
    elif error is None and scheme != "tcp":
        notes.append(f"only {hop.body_bytes} bytes downloaded: too few to measure throughput")
    if hop.truncated_by_budget:
        notes.append("the time budget ended the download")
    if hop.location is not None and error is None:
        notes.append(f"stopped after {redirects} redirects")
    return NetworkMeasurement(
        target=masked(target),
        host=host,
        port=port,
        scheme=scheme,
        dns_ms=hop.dns_ms,
        connect_ms=hop.connect_ms,
        ttfb_ms=hop.ttfb_ms,
        throughput_mib_per_s=throughput,
        bytes_read=hop.body_bytes,
        http_status=hop.status,
        error=error.message if error else None,
        error_stage=error.stage if error else None,
        tls_ms=hop.tls_ms,
        address=hop.address,
        redirects=redirects,
        final_url=masked(url) if url is not None else None,
        note="; ".join(notes) or None,
    )
