"""network checks: the path to remote data judged from hand-built measurements."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from support.facts import finding_keys, make_facts
from trainmedic.doctor.checks.network import (
    CHECKS,
    check_latency,
    check_measured,
    check_throughput,
    check_unreachable,
)
from trainmedic.findings.model import Category, Finding
from trainmedic.host.netprobe import NetworkMeasurement

URL = "https://data.example.com/shards/train-0000.tar"
MIB = 1024 * 1024


def make_network(**overrides: Any) -> NetworkMeasurement:
    """A healthy in-region fetch: 1.2 ms connect, 25 ms first byte, 400 MiB/s."""
    m = NetworkMeasurement(
        target=URL,
        host="data.example.com",
        port=443,
        scheme="https",
        dns_ms=3.0,
        connect_ms=1.2,
        tls_ms=4.0,
        ttfb_ms=25.0,
        throughput_mib_per_s=400.0,
        bytes_read=64 * MIB,
        http_status=200,
        address="10.1.2.3",
    )
    return replace(m, **overrides)


def run_all(network: NetworkMeasurement | None) -> list[Finding]:
    facts = make_facts(network=network)
    return [f for check in CHECKS for f in check(facts)]


def test_no_data_url_gives_no_network_finding() -> None:
    assert run_all(None) == []


def test_healthy_fetch_gives_only_the_numbers() -> None:
    findings = run_all(make_network())
    assert finding_keys(findings) == {("network.measured", "info", URL)}
    (info,) = findings
    assert info.category is Category.NETWORK
    assert info.evidence["connect_ms"] == 1.2
    assert info.evidence["throughput_mib_per_s"] == 400.0
    assert "connect 1.2 ms" in info.title and "400.0 MiB/s" in info.title


@pytest.mark.parametrize(
    ("stage", "fix_word"),
    [
        ("dns", "resolv.conf"),
        ("connect", "firewall"),
        ("tls", "certificate"),
        ("http", "403"),
        ("read", "retry"),
    ],
)
def test_unreachable_is_an_error_naming_stage_and_cause(stage: str, fix_word: str) -> None:
    m = make_network(
        error="something went wrong", error_stage=stage, throughput_mib_per_s=None, bytes_read=0
    )
    findings = check_unreachable(make_facts(network=m))
    assert finding_keys(findings) == {(f"network.unreachable.{stage}", "error", URL)}
    (f,) = findings
    assert stage in f.title and "something went wrong" in f.title
    assert f.evidence["stage"] == stage
    assert fix_word in f.fix


def test_reachable_target_gives_no_unreachable_finding() -> None:
    assert check_unreachable(make_facts(network=make_network())) == []


def test_unreachable_target_still_shows_partial_numbers() -> None:
    m = make_network(
        error="connection refused", error_stage="connect", connect_ms=None, ttfb_ms=None,
        throughput_mib_per_s=None, bytes_read=0, http_status=None,
    )  # fmt: skip
    assert finding_keys(run_all(m)) == {
        ("network.measured", "info", URL),
        ("network.unreachable.connect", "error", URL),
    }
    (info,) = check_measured(make_facts(network=m))
    assert info.evidence["dns_ms"] == 3.0 and "connect n/a" in info.title


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"connect_ms": 50.0}, set()),
        ({"connect_ms": 51.0}, {("network.high_latency", "warning", URL)}),
        ({"ttfb_ms": 200.0}, set()),
        ({"ttfb_ms": 350.0}, {("network.high_latency", "warning", URL)}),
        ({"connect_ms": 120.0, "ttfb_ms": 400.0}, {("network.high_latency", "warning", URL)}),
        # A tcp target's first byte is a greeting, not a response time.
        ({"scheme": "tcp", "ttfb_ms": 350.0}, set()),
        ({"connect_ms": None, "ttfb_ms": None}, set()),
    ],
)
def test_latency_thresholds(overrides: dict[str, Any], expected: set[Any]) -> None:
    findings = check_latency(make_facts(network=make_network(**overrides)))
    assert finding_keys(findings) == expected


def test_latency_finding_names_the_numbers() -> None:
    (f,) = check_latency(make_facts(network=make_network(connect_ms=120.0, ttfb_ms=400.0)))
    assert "connect 120 ms" in f.title and "first byte 400 ms" in f.title
    assert f.evidence["connect_ms"] == 120.0
    assert "region" in f.fix


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (50.0, set()),
        (49.0, {("network.low_throughput", "warning", URL)}),
        (10.0, {("network.low_throughput", "warning", URL)}),
        (9.5, {("network.low_throughput", "error", URL)}),
        (None, set()),
    ],
)
def test_throughput_thresholds(rate: float | None, expected: set[Any]) -> None:
    findings = check_throughput(make_facts(network=make_network(throughput_mib_per_s=rate)))
    assert finding_keys(findings) == expected
    for f in findings:
        assert f.evidence["throughput_mib_per_s"] == rate
