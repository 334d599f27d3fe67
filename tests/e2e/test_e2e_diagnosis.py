"""End to end: real CPU training runs under ``trainmedic run``, and the true cause comes first.

Every job is an ordinary PyTorch script in ``scripts/`` (none of them knows
about trainmedic), each slow for one real reason that a CPU reproduces. The
assertion is always the same: ``findings.json`` names that reason first, with
its category and the evidence that shows it. A shared machine may add
``contention.cpu`` for other people's load; it is skipped only after checking
that its evidence really measured others' CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TOLERATED = "contention.cpu"
USABLE_CORES = len(os.sched_getaffinity(0))


@dataclass
class Diagnosed:
    """A finished run: the job's output and the ranked findings."""

    run_dir: Path
    stdout: str
    findings: list[dict[str, Any]]

    @property
    def counted(self) -> list[dict[str, Any]]:
        out = []
        for f in self.findings:
            if f["id"] == TOLERATED:
                ev = f["evidence"]
                assert ev["others_cpu_cores"] >= ev["others_cpu_limit_cores"] >= 1.0, f
                assert ev["system_cpu_pct"] >= ev["system_cpu_busy_pct"], f
                continue
            out.append(f)
        return out

    @property
    def first(self) -> dict[str, Any]:
        assert self.counted, self.findings
        return self.counted[0]


def run_job(
    tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None
) -> Diagnosed:
    run_dir = tmp_path / "run"
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainmedic",
            "run",
            "--quiet",
            "--no-html",
            "--out",
            str(run_dir),
            "--",
            sys.executable,
            str(SCRIPTS / script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert got.returncode == 0, got.stderr
    document = json.loads((run_dir / "findings.json").read_text())
    return Diagnosed(run_dir, got.stdout, list(document["findings"]))


def assert_first(run: Diagnosed, finding_id: str, category: str) -> dict[str, Any]:
    first = run.first
    assert (first["id"], first["category"]) == (finding_id, category), [
        (f["id"], f["severity"], f["impact"]) for f in run.findings
    ]
    assert first["severity"] in ("warning", "error")
    return dict(first["evidence"])


# --- in the default suite: a few seconds each -------------------------------------------------


def test_healthy_compute_bound_run_has_no_warning_or_error(tmp_path: Path) -> None:
    run = run_job(tmp_path, "mlp_preloaded.py", "--steps", "800")
    assert "step 800" in run.stdout
    assert all(f["severity"] == "info" for f in run.counted), run.findings
    if len(run.counted) == len(run.findings):  # no contention: the overall verdict is there
        assert [f["id"] for f in run.findings] == ["run.healthy"]
        ev = run.findings[0]["evidence"]
        assert ev["steady_steps"] >= 700 and ev["data_wait_share"] < 0.2


def test_heavy_transform_with_zero_workers_is_named_first(tmp_path: Path) -> None:
    run = run_job(tmp_path, "augment_no_workers.py", "--steps", "60")
    ev = assert_first(run, "input.workers", "framework_config")
    assert ev["num_workers"] == 0
    assert ev["data_wait_share"] >= 0.2
    assert ev["loader_transform_share"] >= 0.9  # the stacks saw the transform, not I/O
    assert ev["job_cpu_cores"] < 0.85 * ev["usable_cores"]


# --- slow: longer runs ------------------------------------------------------------------------


@pytest.mark.slow
def test_slow_file_reads_in_workers_are_named_io(tmp_path: Path) -> None:
    run = run_job(tmp_path, "slow_reads.py", str(tmp_path / "data"), "--steps", "40")
    ev = assert_first(run, "input.io", "io")
    assert ev["num_workers"] == 2
    assert ev["loader_file_read_share"] >= 0.4


class _SlowSamples(BaseHTTPRequestHandler):
    latency_s = 0.004

    def do_GET(self) -> None:
        time.sleep(self.latency_s)  # a server far away
        body = bytes(1024)  # 256 float32 zeros
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def data_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowSamples)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_samples_fetched_over_http_are_named_network(tmp_path: Path, data_server: str) -> None:
    run = run_job(tmp_path, "http_loader.py", data_server, "--steps", "40")
    ev = assert_first(run, "input.network", "network")
    assert ev["loader_socket_wait_share"] >= 0.4


@pytest.mark.slow
def test_workers_using_every_core_are_named_cpu(tmp_path: Path) -> None:
    run = run_job(tmp_path, "saturating_workers.py", "--steps", "60")
    ev = assert_first(run, "input.cpu", "cpu")
    assert ev["num_workers"] == USABLE_CORES
    assert ev["loader_transform_share"] >= 0.9


@pytest.mark.slow
@pytest.mark.xfail(
    USABLE_CORES <= 2,
    reason=(
        "diagnose judges cores idle only at job CPU <= 50 % of the usable cores; on 2 cores a "
        "single busy core is exactly 50 % and the probe's own threads tip it over, so the "
        "rule falls back to input.cpu"
    ),
    strict=False,
)
def test_batches_built_in_the_loop_while_cores_idle_are_named_workers(tmp_path: Path) -> None:
    run = run_job(tmp_path, "manual_batches.py", "--steps", "150")
    ev = assert_first(run, "input.workers", "framework_config")
    assert "num_workers" not in ev  # no DataLoader at all
    assert ev["data_wait_share"] >= 0.5


@pytest.mark.slow
def test_reads_that_hang_now_and_then_are_io_stalls(tmp_path: Path) -> None:
    # Two hangs of 1.4 s in ~25 s of steps. Their share of the time depends on
    # the machine's load (the hangs are fixed, the steps are not), and the
    # input rule counts the hangs' wait too: whether input.io (all the waiting,
    # in file reads) or stall.io (the hangs) comes first, the cause is storage.
    run = run_job(
        tmp_path, "hiccup_reads.py", str(tmp_path / "data"),
        "--steps", "1300", "--hang-every", "16000", "--hang-s", "1.4",
    )  # fmt: skip
    assert run.first["category"] == "io", run.findings
    (stall,) = [f for f in run.findings if f["id"].startswith("stall.")]
    assert (stall["id"], stall["category"]) == ("stall.io", "io")
    ev = stall["evidence"]
    assert ev["stalls"] == 2
    assert ev["stall_data_wait_share_mean"] >= 0.5
    assert ev["stall_longest_s"] >= 1.0


@pytest.mark.slow
def test_workers_started_anew_each_epoch_are_epoch_start_stalls(tmp_path: Path) -> None:
    run = run_job(
        tmp_path,
        "worker_startup.py",
        "--epochs",
        "3",
        "--steps-per-epoch",
        "400",
        "--init-s",
        "1.2",
    )
    ev = assert_first(run, "stall.epoch_start", "framework_config")
    assert ev["stalls"] == 2  # epochs 2 and 3; the first one's start is warm-up
    assert ev["stall_steps"] == [401, 801]


@pytest.fixture
def cpu_burners() -> Iterator[int]:
    """Other people's work: one busy process per usable core, outside the job, each in a
    session of its own as other users' are (with autogroup scheduling, one session would
    get one share of the CPU however many processes it holds)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(USABLE_CORES)
    ]
    try:
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


@pytest.mark.slow
def test_other_processes_taking_the_cores_are_named_contention(
    tmp_path: Path, cpu_burners: int
) -> None:
    run = run_job(tmp_path, "mlp_preloaded.py", "--steps", "150")
    contention = [f for f in run.findings if f["id"] == "contention.cpu"]
    assert run.findings[0]["id"] == "contention.cpu", run.findings
    (finding,) = contention
    assert finding["severity"] == "warning" and finding["category"] == "contention"
    assert finding["evidence"]["others_cpu_cores"] >= 1.0
    assert all(f["severity"] == "info" for f in run.counted)  # nothing else is wrong
