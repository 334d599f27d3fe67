"""Unmodified PyTorch scripts under ``trainmedic run``: hangs, crashes, a bug, a hung
DataLoader worker, an allocation failure, and a healthy run with pauses.

The probe finds the steps through torch's optimizer hooks; the scripts know
nothing about trainmedic (scripts/torch_trainer.py), or only use its
Checkpointer and phase API (scripts/checkpointed.py). Each run imports torch
once per attempt (~2 s here), so most variants are marked slow.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from resilience_helpers import SCRIPTS, left_running, run_trainmedic, torch_trainer

FAST = ["--backoff", "0", "--grace", "1"]


@pytest.mark.parametrize(
    "fault",
    [
        "sleep",
        pytest.param("lock", marks=pytest.mark.slow),
        pytest.param("busy", marks=pytest.mark.slow),
        pytest.param("segfault", marks=pytest.mark.slow),
    ],
)
def test_an_unmodified_script_survives_one_fault_at_step_30(tmp_path: Path, fault: str) -> None:
    """The issue's "done when": exit 0 under --max-restarts 2, resumed from the
    script's own last checkpoint, the hang's stacks in the run directory, no
    process (DataLoader workers included) left behind."""
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path,
        [*FAST, "--timeout", "2", "--max-restarts", "2"],
        torch_trainer(state, fault, "--own-resume", "--workers", 2),
    )
    assert run.returncode == 0, run.stderr
    expected = "segfault" if fault == "segfault" else "hang"
    assert run.classes == [expected, "success"]
    assert run.resumed == [0, 30]
    assert (state / "done").read_text().strip() == "40"
    if expected == "hang":
        stacks = (run.run_dir / "attempts" / "1" / "stacks.txt").read_text()
        assert "torch_trainer.py" in stacks
        assert "torch_trainer.py" in run.attempts[0]["hang"]["summary"]
    assert len(run.pids) >= 3 * 2 - 1  # trainer + 2 workers per attempt (the dead may differ)
    assert left_running(run.pids) == []


@pytest.mark.slow
def test_a_bug_in_an_unmodified_script_runs_once_with_its_traceback(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path, [*FAST, "--timeout", "2"], torch_trainer(state, "exception", "--own-resume")
    )
    assert run.returncode == 1
    assert run.classes == ["user_exception"]
    detail = run.finding("failure.user_exception")["detail"]
    assert "RuntimeError: loss is NaN" in detail
    assert "torch_trainer.py" in detail


@pytest.mark.slow
def test_a_hung_dataloader_worker_is_found_and_stopped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path,
        [*FAST, "--timeout", "2", "--max-restarts", "1"],
        torch_trainer(state, "worker", "--own-resume", "--workers", 2),
    )
    assert run.returncode == 0, run.stderr
    assert run.classes == ["hang", "success"]
    summary = run.attempts[0]["hang"]["summary"]
    assert "DataLoader worker" in summary and "__getitem__" in summary
    stacks = (run.run_dir / "attempts" / "1" / "stacks.txt").read_text()
    assert stacks.count("=== trainmedic: stacks of pid") >= 3  # trainer and both workers
    assert left_running(run.pids) == []


@pytest.mark.slow
def test_an_allocation_failure_under_an_address_space_limit(tmp_path: Path) -> None:
    state = tmp_path / "state"
    limited = [
        sys.executable,
        str(SCRIPTS / "rlimit_as.py"),
        str(6 * 2**30),
        *torch_trainer(state, "alloc", "--own-resume"),
    ]
    run = run_trainmedic(tmp_path, [*FAST, "--max-restarts", "1"], limited)
    assert run.returncode == 0, run.stderr
    assert run.classes == ["host_alloc_failure", "success"]
    finding = run.finding("failure.host_alloc_failure")
    assert any("can't allocate memory" in line for line in finding["evidence"]["lines"])
    assert run.resumed == [0, 30]


def test_a_healthy_run_with_evaluation_and_checkpoint_pauses_raises_no_false_hang(
    tmp_path: Path,
) -> None:
    """An unmarked 6 s evaluation and a 6 s checkpoint marked with trainmedic.phase,
    against a learned bound of 5 s: the evaluation shows progress (forward
    passes), the checkpoint has the phase's bound. (A bound of a few seconds
    leaves room for the heartbeats' delay when the machine's cores are busy.)"""
    state = tmp_path / "state"
    command = [
        sys.executable,
        str(SCRIPTS / "checkpointed.py"),
        "--state",
        str(state),
        "--steps",
        "40",
        "--eval-at",
        "20",
        "--slow-ckpt-at",
        "30",
        "--pause-s",
        "6",
    ]
    run = run_trainmedic(tmp_path, [*FAST, "--timeout-floor", "5"], command)
    assert run.returncode == 0, run.stderr
    assert run.classes == ["success"]
    assert not any(f["id"].startswith(("failure.", "restart.")) for f in run.findings)
    assert (state / "done").exists()
    # Both pauses really were longer than the bound: two gaps between train steps.
    steps = [json.loads(line) for line in (run.run_dir / "steps.jsonl").read_text().splitlines()]
    ends = sorted(s["t"] for s in steps if s.get("ph", "train") == "train")
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    assert len([g for g in gaps if g > 5]) == 2


@pytest.mark.slow
def test_a_checkpointer_job_resumes_and_its_redone_steps_are_counted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    command = [
        sys.executable,
        str(SCRIPTS / "checkpointed.py"),
        "--state",
        str(state),
        "--steps",
        "40",
        "--hang-at",
        "35",
    ]
    run = run_trainmedic(tmp_path, [*FAST, "--timeout", "2"], command)
    assert run.returncode == 0, run.stderr
    assert run.classes == ["hang", "success"]
    assert run.resumed == [0, 30]
    assert run.attempts[1]["resume_step"] == 30  # reported by the Checkpointer itself
    evidence = run.finding("restart.summary")["evidence"]
    assert evidence["steps_redone"] == 5
    assert evidence["redone_s"] > 0
    checkpoints = sorted(p.name for p in (run.run_dir / "checkpoints").glob("*.json"))
    assert checkpoints  # $TRAINMEDIC_CHECKPOINT_DIR is in the run directory
