"""The Prometheus exporter: what a scrape returns, the listen address, and its errors."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from support.builders import T0, make_gpu, make_host
from trainmedic.errors import UsageError
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import ClockEventReason
from trainmedic.record.types import RunEvent, StepRecord
from trainmedic.supervise.live.metrics import MetricsCollector, MetricsState
from trainmedic.supervise.live.metrics_server import ListenAddress, parse_listen, start_exporter
from trainmedic.supervise.loop.attempt_state import AttemptNow, AttemptState


def samples(state: MetricsState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(state))
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(**kv: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kv.items()))


def fed_state() -> MetricsState:
    state = MetricsState("run-1", node="n1", started_at=T0)
    for r in (0, 1):
        state.add_event(RunEvent(T0, "process_start", "", pid=100 + r,
                                 data={"rank": r, "local_rank": r}))  # fmt: skip
    for k in range(1, 61):
        for r in (0, 1):
            wait = 0.015 if r == 1 else 0.001
            state.add_step(StepRecord(step=k, t=T0 + k * 0.02, duration_s=0.02,
                                      data_wait_s=wait, compute_s=0.02 - wait, samples=16,
                                      pid=100 + r, rank=r))  # fmt: skip
    state.add_gpu(make_gpu(T0, index=0, clock_event_reasons=int(ClockEventReason.HW_SLOWDOWN)))
    state.add_host(make_host(T0, job_cpu_pct=150.0, others_cpu_pct=20.0))
    state.add_event(RunEvent(T0, "job_start", "", data={"attempt": 1}))
    state.add_event(RunEvent(T0, "hang_detected", ""))
    state.add_event(RunEvent(T0, "attempt_end", "", data={
        "restarted": True, "failure_class": "hang",
        "finding": {"severity": "error", "category": "timeout"}}))  # fmt: skip
    state.add_event(RunEvent(T0, "job_start", "", data={"attempt": 2}))
    state.attempt_changed(AttemptNow(2, AttemptState.RUNNING, T0))
    return state


def test_the_restart_loops_state_is_a_state_set() -> None:
    got = samples(fed_state())
    values = {dict(k[1])["state"]: v for k, v in got.items() if k[0] == "trainmedic_attempt_state"}
    assert values == {s.value: float(s is AttemptState.RUNNING) for s in AttemptState}
    assert not any(k[0] == "trainmedic_attempt_state" for k in samples(MetricsState("r", "n")))


def test_a_scrape_reports_ranks_gpus_and_incidents() -> None:
    got = samples(fed_state())
    r1 = labels(node="n1", rank="1", local_rank="1")
    assert got[("trainmedic_steps_total", r1)] == 60
    assert got[("trainmedic_steps_per_second", r1)] == pytest.approx(50.0)
    assert got[("trainmedic_samples_per_second", r1)] == pytest.approx(800.0)
    assert got[("trainmedic_data_wait_ratio", r1)] == pytest.approx(0.75)
    assert got[("trainmedic_data_wait_ratio", labels(node="n1", rank="0", local_rank="0"))] == (
        pytest.approx(0.05)
    )
    gpu = labels(node="n1", gpu="0", uuid="GPU-0000")
    assert got[("trainmedic_gpu_utilization_percent", gpu)] == 95.0
    assert got[("trainmedic_gpu_sm_clock_hertz", gpu)] == pytest.approx(1.98e9)
    assert got[("trainmedic_gpu_slowdown", gpu)] == 1.0
    assert got[("trainmedic_job_cpu_cores", labels(node="n1"))] == 1.5
    assert got[("trainmedic_attempts_total", labels(node="n1"))] == 2
    assert got[("trainmedic_hangs_total", labels(node="n1"))] == 1
    assert got[("trainmedic_restarts_total", labels(node="n1", failure_class="hang"))] == 1
    key = ("trainmedic_findings", labels(node="n1", severity="error", category="timeout"))
    assert got[key] == 1


def test_the_final_diagnosis_replaces_the_incident_counts() -> None:
    state = fed_state()
    state.set_findings([Finding("x", Category.IO, Severity.WARNING, "t"),
                        Finding("y", Category.IO, Severity.WARNING, "t")])  # fmt: skip
    got = samples(state)
    assert got[("trainmedic_findings", labels(node="n1", severity="warning", category="io"))] == 2
    gone = ("trainmedic_findings", labels(node="n1", severity="error", category="timeout"))
    assert gone not in got


def test_a_restarted_rank_keeps_counting_but_rates_start_again() -> None:
    state = MetricsState("r", node="n")
    state.add_step(StepRecord(step=1, t=T0, duration_s=1.0, pid=1, rank=0))
    state.add_step(StepRecord(step=1, t=T0 + 9, duration_s=0.5, pid=2, rank=0))
    got = samples(state)
    assert got[("trainmedic_steps_total", labels(node="n", rank="0", local_rank=""))] == 2
    assert got[("trainmedic_steps_per_second", labels(node="n", rank="0", local_rank=""))] == 2.0


def test_a_job_without_ranks_is_its_first_stepping_process() -> None:
    state = MetricsState("r", node="n")
    state.add_step(StepRecord(step=1, t=T0, duration_s=0.1, pid=7))
    state.add_step(StepRecord(step=1, t=T0, duration_s=0.1, pid=8))  # another process
    got = samples(state)
    assert got[("trainmedic_steps_total", labels(node="n", rank="", local_rank=""))] == 1


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [("9400", "127.0.0.1", 9400), ("0.0.0.0:9400", "0.0.0.0", 9400), ("[::1]:0", "::1", 0),
     ("localhost:80", "localhost", 80)],
)  # fmt: skip
def test_listen_addresses(value: str, host: str, port: int) -> None:
    assert parse_listen(value) == ListenAddress(host, port)


@pytest.mark.parametrize(
    ("value", "says"),
    [("", "give a port"), ("abc", "number"), ("70000", "number"), (":9", "empty"),
     ("::1:9", "IPv6"), ("[::1]9", "IPv6"), ("no-such-host.invalid:9", "neither")],
)  # fmt: skip
def test_bad_addresses_are_one_line_usage_errors(value: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as info:
        parse_listen(value)
    assert "\n" not in str(info.value)


def test_the_server_answers_on_loopback_and_a_taken_port_is_refused() -> None:
    exporter = start_exporter(fed_state(), ListenAddress("127.0.0.1", 0))
    try:
        with urllib.request.urlopen(exporter.url, timeout=5) as r:
            text = r.read().decode()
        assert 'trainmedic_steps_total{local_rank="1",node="n1",rank="1"} 60.0' in text
        assert "process_cpu_seconds_total" not in text  # only trainmedic's own collector
        with pytest.raises(UsageError, match="already in use"):
            start_exporter(MetricsState("x"), ListenAddress("127.0.0.1", exporter.port))
    finally:
        exporter.close()
    with socket.socket() as s:  # nobody listens there any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", exporter.port))


def test_every_documented_and_dashboard_metric_is_served() -> None:
    import json
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    served = {name for name, _ in samples(fed_state())}
    documented = set(re.findall(r"`(trainmedic_[a-z_]+)", (docs / "metrics.md").read_text()))
    dashboard = json.loads((docs / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    used = set(re.findall(r"trainmedic_[a-z_]+", exprs))
    assert documented and used
    assert documented - served == set()
    assert used - served == set()
    # and nothing served goes undocumented
    assert served - documented == set()


def test_a_connection_that_sends_nothing_is_closed_and_scrapes_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainmedic.supervise.live import metrics_server

    monkeypatch.setattr(metrics_server, "REQUEST_TIMEOUT_S", 0.3)
    exporter = start_exporter(fed_state(), ListenAddress("127.0.0.1", 0))
    try:
        idle = [socket.create_connection(("127.0.0.1", exporter.port)) for _ in range(20)]
        for conn in idle:
            conn.settimeout(10.0)  # the server's 0.3 s ends it long before this
            assert conn.recv(1) == b""  # closed by the server: its thread is free again
            conn.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        exporter.close()


@pytest.mark.parametrize(
    ("host", "others"), [("127.0.0.1", False), ("::1", False), ("localhost", False),
                         ("0.0.0.0", True), ("192.168.1.5", True), ("::", True)],
)  # fmt: skip
def test_an_address_other_machines_reach_is_told_apart(host: str, others: bool) -> None:
    from trainmedic.supervise.live.metrics_server import reachable_from_others

    assert reachable_from_others(ListenAddress(host, 9400)) is others


def test_run_warns_when_other_machines_can_read_its_metrics(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainmedic.cli.main import main

    code = main(["run", "--quiet", "--no-html", "--prometheus", "0.0.0.0:0",
                 "--out", f"{tmp_path}/run", "--", "true"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "warning: other machines can read http://0.0.0.0:" in err
