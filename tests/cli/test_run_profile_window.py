"""``trainmedic run`` opens a torch.profiler window in the job and reads its trace back:
the mechanics on CPU (``TRAINMEDIC_PROBE_PROFILE=always``), for real, in a job not
written for trainmedic."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainmedic.probe.profile_window import ACTIVE_STEPS, FIRST_STEP
from trainmedic.traces.kineto import read_trace

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "item_and_pageable.py"


def run(tmp_path: Path, mode: str | None, steps: int = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRAINMEDIC_PROBE_PROFILE"}
    if mode is not None:
        env["TRAINMEDIC_PROBE_PROFILE"] = mode
    return subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out",
         str(tmp_path / "run"), "--", sys.executable, str(SCRIPT), str(steps), "cpu"],
        capture_output=True, text=True, timeout=180, check=False, env=env,
    )  # fmt: skip


def events(run_dir: Path, kind: str) -> list[dict[str, object]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def test_a_window_is_recorded_into_the_run_and_read_back(tmp_path: Path) -> None:
    done = run(tmp_path, "always")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "done 120\n"  # the job's output is its own
    run_dir = tmp_path / "run"
    (trace,) = (run_dir / "profiles").iterdir()
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600
    assert trace.name.endswith(f"-step{FIRST_STEP}.json.gz")
    summary = read_trace(trace)
    assert len(summary.steps) == ACTIVE_STEPS
    assert summary.device is None  # a CPU job: no GPU activity recorded
    assert summary.with_stack  # Python frames: what names a synchronisation's call site
    (event,) = events(run_dir, "profile_window")
    data = event["data"]
    assert isinstance(data, dict)
    assert data["steps"] == ACTIVE_STEPS and data["path"] == f"profiles/{trace.name}"
    assert data["cost_s"] >= data["start_s"] + data["stop_s"] > 0
    document = json.loads((run_dir / "findings.json").read_text())
    (window,) = document["context"]["profile_windows"]
    assert window["steps"] == ACTIVE_STEPS and window["gpu_busy_share"] is None
    assert not [f for f in document["findings"] if "profile" in f["evidence"]]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", [None, "off"])
def test_no_window_in_a_cpu_job_by_default_or_when_off(tmp_path: Path, mode: str | None) -> None:
    done = run(tmp_path, mode, steps=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "run" / "profiles").exists()
    assert events(tmp_path / "run", "profile_window") == []
