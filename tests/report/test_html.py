"""The HTML report: content, order, escaping, empty series, size, and a real browser load."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support import builders
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import (
    HostSample,
    LoaderInfo,
    RunEvent,
    RunMeta,
    RunRecord,
    StepRecord,
    StepWindow,
)
from trainmedic.report.html import render_html_report, write_html_report
from trainmedic.report.html_plots import MAX_POINTS

T0 = 1_700_000_000.0
XSS = '<script>alert("x")</script>'


def make_meta(**kw: object) -> RunMeta:
    return RunMeta(
        run_id="run-1",
        command=("python", "train.py", f"--name={XSS}"),
        cwd="/home/me",
        started_at=T0,
        ended_at=T0 + 600.0,
        exit_code=kw.pop("exit_code", 0),  # type: ignore[arg-type]
        trainmedic_version="0.1.0",
        gpu_backend="simulated",
        **kw,  # type: ignore[arg-type]
    )


def make_steps(count: int, start: float = T0 + 5.0, pid: int = 7) -> list[StepRecord]:
    steps, t = [], start
    for i in range(count):
        d = 0.1 if i % 10 else 0.4
        t += d
        steps.append(
            StepRecord(
                step=i + 1,
                t=t,
                duration_s=d,
                data_wait_s=0.03,
                compute_s=0.05,
                samples=64,
                pid=pid,
            )
        )
    return steps


def make_gpu(t: float, index: int = 0) -> GpuSample:
    return builders.make_gpu(t, index=index, utilization_gpu_pct=55.0, temperature_c=70.0)


def make_host(t: float) -> HostSample:
    return builders.make_host(
        t,
        job_cpu_pct=350.0,
        usable_cores=8.0,
        iowait_pct=2.0,
        disk_read_bytes_per_s=5e7,
        disk_write_bytes_per_s=1e6,
        net_recv_bytes_per_s=None,
        net_sent_bytes_per_s=None,
    )


def make_record(**kw: object) -> RunRecord:
    record = builders.make_record(
        meta=make_meta(),
        steps=make_steps(200),
        windows=[
            StepWindow(
                t_start=T0 + 100.0,
                t=T0 + 200.0,
                count=1000,
                first_step=201,
                last_step=1200,
                duration_sum_s=100.0,
                duration_min_s=0.09,
                duration_max_s=0.2,
                data_wait_sum_s=30.0,
                compute_sum_s=50.0,
                samples_sum=64_000,
                pid=7,
            )
        ],
        gpu=[make_gpu(T0 + s, i) for s in range(0, 300, 2) for i in (0, 1)],
        host=[make_host(T0 + s) for s in range(0, 300, 2)],
        loaders=[LoaderInfo(T0 + 1, 7, 1, 0, 64, False, None, False, "MyDataset")],
        events=[
            RunEvent(T0 + 150.0, "stall", f"no step for 60 s {XSS}", pid=7, data={"x": XSS}),
        ],
    )
    for key, value in kw.items():
        setattr(record, key, value)
    return record


def make_findings() -> list[Finding]:
    return [
        Finding(
            id="input.data_wait",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title="The GPU waits for data 30% of each step",
            evidence={"data_wait_share": 0.3, "num_workers": 0},
            fix="DataLoader(num_workers=6, pin_memory=True)",
            impact=0.3,
            subject="loader1",
        ),
        Finding(
            id="thermal.hw_slowdown",
            category=Category.THERMAL,
            severity=Severity.ERROR,
            title=f"GPU 0 slowed by heat {XSS}",
            evidence={"temperature_c": 91.0},
            fix="Improve cooling",
            impact=0.1,
            subject="gpu0",
        ),
    ]


def test_findings_with_fixes_come_before_the_plots() -> None:
    page = render_html_report(make_record(), make_findings())
    body = page[page.index("<body") :]
    error_title = body.index("GPU 0 slowed by heat")
    warning_title = body.index("The GPU waits for data 30% of each step")
    fix = body.index("DataLoader(num_workers=6, pin_memory=True)")
    plots = body.index('id="plot-0"')
    assert error_title < warning_title < plots  # worst first
    assert fix < plots
    assert "Improve cooling" in body
    assert "#c62828" in body and "#b26a00" in body  # severity colours


def test_header_names_command_duration_and_exit_code() -> None:
    record = make_record(meta=make_meta(exit_code=-9))
    page = render_html_report(record, [])
    assert "python train.py" in page
    assert "10m 00s" in page
    assert "-9 (killed by SIGKILL)" in page
    assert "No findings." in page


def test_user_strings_are_escaped() -> None:
    page = render_html_report(make_record(), make_findings())
    assert XSS not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    # The figure data lives in one JSON block that cannot end its script early.
    figures = re.search(r'id="tm-figures">(.*?)</script>', page, re.S)
    assert figures is not None and "<" not in figures.group(1)


def test_plotly_is_embedded_once() -> None:
    page = render_html_report(make_record(), make_findings())
    assert page.count("* plotly.js v") == 1
    assert "<script src" not in page  # nothing fetched: opens offline
    assert page.count('class="plot"') == 3


def test_empty_series_degrade_to_a_sentence(tmp_path: Path) -> None:
    record = RunRecord(meta=make_meta())
    path = tmp_path / "r.html"
    write_html_report(record, [], path)
    page = path.read_text()
    assert "No steps recorded." in page
    assert "No GPU readings." in page
    assert "No host readings." in page
    assert "No events." in page
    assert 'class="plot"' not in page


def test_long_runs_are_reduced_to_max_points_per_trace() -> None:
    steps = make_steps(3 * MAX_POINTS)
    gpu = [make_gpu(T0 + i * 0.5) for i in range(3 * MAX_POINTS)]
    page = render_html_report(make_record(steps=steps, windows=[], gpu=gpu), [])
    figures = re.search(r'id="tm-figures">(.*?)</script>', page, re.S)
    assert figures is not None
    data = json.loads(figures.group(1))
    lengths = [len(trace["x"]) for f in data for trace in f["figure"]["data"]]
    assert max(lengths) <= MAX_POINTS
    assert max(lengths) >= MAX_POINTS // 2  # reduced, not thrown away
    assert "averaged into" in page


def test_write_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text("old")
    write_html_report(make_record(), make_findings(), path)
    assert path.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.skipif(
    find_chromium() is None,
    reason="no chromium binary (CI installs the Debian package 'chromium')",
)
def test_report_draws_in_headless_chromium(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    write_html_report(make_record(), make_findings(), path)
    chromium = find_chromium()
    assert chromium is not None
    result = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    errors = re.search(r'<p id="tm-errors"[^>]*>(.*?)</p>', dom, re.S)
    assert errors is not None and errors.group(1) == "", errors.group(1) if errors else dom[-500:]
    assert 'data-plots-drawn="3"' in dom
    assert dom.count('class="main-svg"') >= 3
