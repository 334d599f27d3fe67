"""SIGTERM to trainmedic: the job may save and exit within the grace period, then it
is killed; a stopped job is never restarted."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from resilience_helpers import TRAINMEDIC, faulty, left_running


def preempt(tmp_path: Path, on_sigterm: str) -> tuple[int, float, Path, Path]:
    run_dir, state = tmp_path / "run", tmp_path / "state"
    proc = subprocess.Popen(
        [
            *TRAINMEDIC,
            "--out",
            str(run_dir),
            "--grace",
            "1",
            "--backoff",
            "0",
            "--",
            *faulty(state, "none", "--steps", 100000, "--on-sigterm", on_sigterm),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (state / "ckpt-10.json").exists():  # training is under way
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    return code, time.monotonic() - sent, run_dir, state


def classes(run_dir: Path) -> list[str]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e["data"]["failure_class"] for e in events if e["kind"] == "attempt_end"]


def test_a_job_that_saves_on_sigterm_exits_within_the_grace_period(tmp_path: Path) -> None:
    code, took, run_dir, state = preempt(tmp_path, "save")
    assert code == 143
    assert classes(run_dir) == ["preempted"]
    step = int((state / "preempted").read_text())
    assert step > 10 and (state / f"ckpt-{step}.json").is_file()  # saved where it stood
    assert took < 5


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    code, took, run_dir, state = preempt(tmp_path, "ignore")
    assert code == 128 + signal.SIGKILL
    assert classes(run_dir) == ["preempted"]
    assert took >= 1.0
    pids = [int(x) for x in (state / "pids").read_text().split()]
    assert left_running(pids) == []
