"""Checks of the path to remote training data (``doctor --data-url``), category ``network``.

The numbers come from one fetch timed stage by stage
(:func:`trainmedic.host.netprobe.measure_network`). Thresholds and their
reasoning: docs/doctor-checks.md, section "network".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.host.netprobe import NetworkMeasurement

CONNECT_WARN_MS = 50.0
"""A TCP connect is one round trip. Within a cloud region it takes < 2 ms,
across a continent 10-40 ms; above 50 ms the data is in a distant region or
another continent, and every request pays it (twice more for a new TLS session)."""

TTFB_WARN_MS = 200.0
"""Time to first byte adds the server's own work to a round trip; object
stores answer within ~20-100 ms in-region. Above 200 ms each uncached
per-sample request caps one loader worker at < 5 samples/s."""

THROUGHPUT_WARN_MIB_PER_S = 50.0
"""One GPU training an image model consumes ~300 MB/s; at < 50 MiB/s (~420
Mbit/s) a single stream feeds less than a sixth of that."""

THROUGHPUT_ERROR_MIB_PER_S = 10.0
"""Under 10 MiB/s (~80 Mbit/s) even one pass over a 100 GB dataset takes ~3 h."""

_STAGE_FIX = {
    "dns": (
        "check the host name for typos and that this machine can resolve it "
        "(/etc/resolv.conf, the cluster's DNS, `getent hosts <name>`)"
    ),
    "connect": (
        "check that the server runs and listens on that port, and that firewalls or "
        "security groups let this machine reach it (`nc -vz <host> <port>`)"
    ),
    "tls": (
        "check the server's certificate and this machine's clock; behind a "
        "TLS-inspecting proxy, point SSL_CERT_FILE / REQUESTS_CA_BUNDLE at its CA bundle"
    ),
    "http": (
        "check the URL and the credentials the data loader uses "
        "(401/403: token or bucket permissions; 404: path; 5xx: the server)"
    ),
    "read": (
        "the connection broke during the download: make the loader retry and resume "
        "(HTTP Range requests), or download the data once before training"
    ),
}

_FIX_LATENCY = (
    "fetch many samples in parallel (more DataLoader workers, a larger prefetch_factor), "
    "stream large shards (WebDataset tar) so latency is paid per shard not per sample, "
    "cache the data locally, or run the job in the region where the data is"
)
_FIX_THROUGHPUT = (
    "download the dataset to local disk once before training, with parallel "
    "connections (s5cmd, rclone --transfers, aria2c -x), or move the job next to the data"
)


def _numbers(m: NetworkMeasurement) -> dict[str, Any]:
    return {
        "target": m.target,
        "dns_ms": m.dns_ms,
        "connect_ms": m.connect_ms,
        "tls_ms": m.tls_ms,
        "ttfb_ms": m.ttfb_ms,
        "throughput_mib_per_s": m.throughput_mib_per_s,
        "bytes_read": m.bytes_read,
        "http_status": m.http_status,
    }


def _fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:,.1f} {unit}"


def check_measured(facts: MachineFacts) -> Sequence[Finding]:
    """Always one info finding with the measured numbers."""
    m = facts.network
    if m is None:
        return []
    return [
        Finding(
            id="network.measured",
            category=Category.NETWORK,
            severity=Severity.INFO,
            title=(
                f"{m.host}:{m.port}: connect {_fmt(m.connect_ms, 'ms')}, first byte "
                f"{_fmt(m.ttfb_ms, 'ms')}, download {_fmt(m.throughput_mib_per_s, 'MiB/s')}"
            ),
            evidence={
                **_numbers(m),
                "address": m.address,
                "redirects": m.redirects,
                "final_url": m.final_url,
                "error_stage": m.error_stage,
                "note": m.note,
            },
            subject=m.target,
        )
    ]


def check_unreachable(facts: MachineFacts) -> Sequence[Finding]:
    """The data cannot be fetched at all: an error naming the failed stage."""
    m = facts.network
    if m is None or m.error is None:
        return []
    stage = m.error_stage or "connect"
    return [
        Finding(
            id=f"network.unreachable.{stage}",
            category=Category.NETWORK,
            severity=Severity.ERROR,
            title=f"Cannot fetch data from {m.target}: {stage} failed: {m.error}",
            evidence={"stage": stage, "error": m.error, **_numbers(m)},
            fix=_STAGE_FIX.get(stage, _STAGE_FIX["connect"]),
            subject=m.target,
        )
    ]


def check_latency(facts: MachineFacts) -> Sequence[Finding]:
    """Round trips so long that per-sample requests starve the loader."""
    m = facts.network
    if m is None:
        return []
    slow_connect = m.connect_ms is not None and m.connect_ms > CONNECT_WARN_MS
    # A tcp target's first byte is a greeting, not an answer to a request.
    slow_ttfb = m.scheme != "tcp" and m.ttfb_ms is not None and m.ttfb_ms > TTFB_WARN_MS
    if not (slow_connect or slow_ttfb):
        return []
    parts = []
    if slow_connect:
        parts.append(f"connect {m.connect_ms:,.0f} ms")
    if slow_ttfb:
        parts.append(f"first byte {m.ttfb_ms:,.0f} ms")
    return [
        Finding(
            id="network.high_latency",
            category=Category.NETWORK,
            severity=Severity.WARNING,
            title=f"High latency to the data ({', '.join(parts)}): it is far away",
            evidence={
                "connect_ms": m.connect_ms,
                "ttfb_ms": m.ttfb_ms,
                "connect_threshold_ms": CONNECT_WARN_MS,
                "ttfb_threshold_ms": TTFB_WARN_MS,
                "address": m.address,
            },
            fix=_FIX_LATENCY,
            subject=m.target,
        )
    ]


def check_throughput(facts: MachineFacts) -> Sequence[Finding]:
    """A download rate too low to feed a GPU."""
    m = facts.network
    if m is None or m.throughput_mib_per_s is None:
        return []
    rate = m.throughput_mib_per_s
    if rate >= THROUGHPUT_WARN_MIB_PER_S:
        return []
    severity = Severity.ERROR if rate < THROUGHPUT_ERROR_MIB_PER_S else Severity.WARNING
    return [
        Finding(
            id="network.low_throughput",
            category=Category.NETWORK,
            severity=severity,
            title=f"Downloading the data reaches only {rate:,.1f} MiB/s",
            evidence={
                "throughput_mib_per_s": rate,
                "threshold_mib_per_s": (
                    THROUGHPUT_ERROR_MIB_PER_S
                    if severity is Severity.ERROR
                    else THROUGHPUT_WARN_MIB_PER_S
                ),
                "bytes_read": m.bytes_read,
            },
            fix=_FIX_THROUGHPUT,
            subject=m.target,
        )
    ]


CHECKS = (check_measured, check_unreachable, check_latency, check_throughput)
