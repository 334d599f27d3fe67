"""Network measurement against real servers on 127.0.0.1; DNS through an injected resolver."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from trainmedic.errors import InputError
from trainmedic.host.netprobe import AddrInfo, measure_network
from trainmedic.host.nettarget import parse_target

MIB = 1024 * 1024
BLOB_BYTES = 4 * MIB
BLOB = bytes(range(256)) * (BLOB_BYTES // 256)


class DataHandler(BaseHTTPRequestHandler):
    """Serves /blob (4 MiB), /small (1000 B), /redirect -> /blob, and 404 otherwise."""

    seen_headers: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen_headers.append(dict(self.headers.items()))
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/blob")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = urllib.parse.unquote(self.path)
        body = {"/blob": BLOB, "/small": b"x" * 1000, "/données": b"d" * 10}.get(path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(server: ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def http_server() -> Iterator[str]:
    DataHandler.seen_headers = []
    yield from serve(ThreadingHTTPServer(("127.0.0.1", 0), DataHandler))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_fetch_times_every_stage(http_server: str) -> None:
    m = measure_network(f"http://{http_server}/blob", max_bytes=2 * MIB)
    assert m.error is None and m.error_stage is None
    assert (m.scheme, m.host, m.http_status, m.address) == ("http", "127.0.0.1", 200, "127.0.0.1")
    # The server ignores Range and sends 4 MiB; the sample stops at max_bytes.
    assert m.bytes_read == 2 * MIB
    assert DataHandler.seen_headers[0]["Range"] == f"bytes=0-{2 * MIB - 1}"
    for value in (m.dns_ms, m.connect_ms, m.ttfb_ms, m.throughput_mib_per_s):
        assert value is not None and value >= 0
    assert m.tls_ms is None


def test_whole_body_smaller_than_the_sample_is_read_to_its_end(http_server: str) -> None:
    m = measure_network(f"http://{http_server}/blob")
    assert m.error is None
    assert m.bytes_read == BLOB_BYTES
    assert m.throughput_mib_per_s is not None and m.throughput_mib_per_s > 0


def test_tiny_body_gives_no_throughput(http_server: str) -> None:
    m = measure_network(f"http://{http_server}/small")
    assert (m.error, m.bytes_read, m.throughput_mib_per_s) == (None, 1000, None)
    assert m.note is not None and "too few" in m.note


def test_non_ascii_path_and_host_are_encoded_for_the_wire(http_server: str) -> None:
    m = measure_network(f"http://{http_server}/données")
    assert (m.error, m.bytes_read) == (None, 10)
    asked: list[str] = []

    def records(host: str, port: int) -> Sequence[AddrInfo]:
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    m = measure_network("http://bücher.example/x", resolver=records)
    assert asked == ["xn--bcher-kva.example"]
    assert m.error_stage == "dns"


def test_redirect_is_followed_to_the_data(http_server: str) -> None:
    m = measure_network(f"http://{http_server}/redirect", max_bytes=MIB)
    assert m.error is None
    assert m.redirects == 1
    assert m.final_url == f"http://{http_server}/blob"
    assert m.bytes_read == MIB


def test_http_error_status_is_a_measurement(http_server: str) -> None:
    m = measure_network(f"http://{http_server}/missing")
    assert (m.error_stage, m.http_status) == ("http", 404)
    assert m.error is not None and "404" in m.error
    assert m.connect_ms is not None and m.ttfb_ms is not None


def test_refused_connection_is_a_measurement() -> None:
    m = measure_network(f"http://127.0.0.1:{closed_port()}/x")
    assert m.error_stage == "connect"
    assert m.error is not None and "refused" in m.error
    assert m.dns_ms is not None and m.connect_ms is None


def test_name_that_does_not_resolve_is_a_measurement() -> None:
    def no_such_name(host: str, port: int) -> Sequence[AddrInfo]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    m = measure_network("https://data.invalid/train.tar", resolver=no_such_name)
    assert (m.error_stage, m.host, m.port) == ("dns", "data.invalid", 443)
    assert m.error is not None and "Name or service not known" in m.error
    assert m.dns_ms is None


def test_hanging_resolver_is_cut_by_the_budget() -> None:
    release = threading.Event()

    def hangs(host: str, port: int) -> Sequence[AddrInfo]:
        release.wait(10)
        raise socket.gaierror(socket.EAI_AGAIN, "late")

    start = time.monotonic()
    try:
        m = measure_network("http://slow-dns.example/x", budget_s=0.3, resolver=hangs)
    finally:
        release.set()
    assert time.monotonic() - start < 2.0
    assert m.error_stage == "dns"
    assert m.error is not None and "timed out" in m.error


def test_silent_server_is_cut_by_the_budget() -> None:
    # Listening but never answering: the kernel completes the handshake, no
    # response ever comes.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        start = time.monotonic()
        m = measure_network(f"http://127.0.0.1:{port}/x", budget_s=0.5)
        elapsed = time.monotonic() - start
    assert elapsed < 2.0
    assert m.connect_ms is not None
    assert m.error_stage == "http"
    assert m.error is not None and "timed out" in m.error


def test_tls_to_a_plain_http_server_fails_at_the_tls_stage(http_server: str) -> None:
    m = measure_network(f"https://{http_server}/blob", budget_s=3.0)
    assert m.error_stage == "tls"
    assert m.connect_ms is not None and m.ttfb_ms is None


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), DataHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    for address in serve(server):
        yield address, cert


def test_https_times_the_tls_handshake(https_server: tuple[str, Path]) -> None:
    address, cert = https_server
    trusted = ssl.create_default_context(cafile=str(cert))
    m = measure_network(f"https://{address}/blob", max_bytes=MIB, ssl_context=trusted)
    assert m.error is None
    assert m.tls_ms is not None and m.tls_ms > 0
    assert (m.http_status, m.bytes_read) == (200, MIB)


def test_untrusted_certificate_fails_at_the_tls_stage(https_server: tuple[str, Path]) -> None:
    address, _ = https_server
    m = measure_network(f"https://{address}/blob", budget_s=3.0)
    assert m.error_stage == "tls"
    assert m.error is not None and "certificate" in m.error


def test_host_port_measures_connect_and_a_greeting() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def greet() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"SSH-2.0-test\r\n")

        thread = threading.Thread(target=greet, daemon=True)
        thread.start()
        m = measure_network(f"127.0.0.1:{port}")
        thread.join(5)
    assert (m.scheme, m.error) == ("tcp", None)
    assert m.connect_ms is not None and m.ttfb_ms is not None
    assert m.bytes_read == 0 and m.throughput_mib_per_s is None


def test_password_in_the_target_is_masked() -> None:
    m = measure_network(f"http://user:secret@127.0.0.1:{closed_port()}/x")
    assert "secret" not in m.target and "user:***@" in m.target


@pytest.mark.parametrize(
    ("target", "parsed"),
    [
        ("http://example.com/data.tar", ("http", "example.com", 80, "/data.tar")),
        ("https://Example.com:8443/a?b=c", ("https", "example.com", 8443, "/a?b=c")),
        ("http://example.com", ("http", "example.com", 80, "/")),
        ("http://[::1]:8080/x", ("http", "::1", 8080, "/x")),
        ("example.com:9000", ("tcp", "example.com", 9000, "")),
        ("10.0.0.5:873", ("tcp", "10.0.0.5", 873, "")),
        ("[::1]:8080", ("tcp", "::1", 8080, "")),
    ],
)
def test_parse_target_accepts_urls_and_host_port(
    target: str, parsed: tuple[str, str, int, str]
) -> None:
    assert parse_target(target) == parsed


@pytest.mark.parametrize(
    "target",
    [
        "",
        "ftp://example.com/x",
        "s3://bucket/key",
        "http://",
        "http:///path",
        "http://host:99999/",
        "http://host:abc/",
        "http://host:0/",
        "http://exa mple.com/",
        "example.com",
        "example.com:0",
        "example.com:70000",
        ":8080",
        "[zz]:80",
        "[::1]",
    ],
)
def test_parse_target_rejects_malformed_targets(target: str) -> None:
    with pytest.raises(InputError) as err:
        parse_target(target)
    message = str(err.value)
    assert repr(target) in message and "\n" not in message
    with pytest.raises(InputError):
        measure_network(target)
