"""Real faults under ``trainmedic run``: the class, the restarts, the resume point, the
exit code, and that no process of the job is left behind.

The script (scripts/faulty.py) saves its own checkpoint every 10 steps and
resumes from it by itself; it injects one fault at step 30 of its first
attempt. A fixed 1 s step timeout keeps each run to a few seconds.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from resilience_helpers import faulty, left_running, run_trainmedic

FAST = ["--timeout", "1", "--backoff", "0", "--grace", "1"]


@pytest.mark.parametrize(
    ("fault", "source"),
    [
        ("sleep", "json"),  # blocked in a C call that releases the GIL
        pytest.param("lock", "json", marks=pytest.mark.slow),  # a lock acquired twice
        # A Python loop spinning in place, burning CPU on the same few stacks.
        pytest.param("busy", "json", marks=pytest.mark.slow),
        ("cblock", "faulthandler"),  # a C call holding the GIL: only the C-level dump works
    ],
)
def test_a_hang_is_caught_with_its_stacks_and_the_job_resumes(
    tmp_path: Path, fault: str, source: str
) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path, [*FAST, "--max-restarts", "2"], faulty(state, fault, "--children", "1")
    )
    assert run.returncode == 0, run.stderr
    assert run.classes == ["hang", "success"]
    assert run.resumed == [0, 30]  # the restart continued from the last checkpoint
    assert (state / "done").read_text().strip() == "40"
    hang = run.attempts[0]["hang"]
    assert "faulty.py" in hang["summary"]
    assert hang["basis"] == "fixed"
    # Detected within a second of its 1 s bound.
    assert 1.0 <= hang["detected_after_s"] < 2.0
    stacks = (run.run_dir / "attempts" / "1" / "stacks.txt").read_text()
    assert "faulty.py" in stacks
    saved = json.loads((run.run_dir / "attempts" / "1" / "hang.json").read_text())
    assert saved["processes"][0]["source"] == source
    assert left_running(run.pids) == []  # the grandchild in its own session too


def test_a_deadlock_between_threads_is_named_where_the_main_thread_waits(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(tmp_path, [*FAST, "--max-restarts", "1"], faulty(state, "deadlock"))
    assert run.returncode == 0, run.stderr
    assert run.classes == ["hang", "success"]
    summary = run.attempts[0]["hang"]["summary"]
    assert "t.join" in summary and "faulty.py" in summary
    # Every thread's stack was saved: the two deadlocked threads sit in one and two.
    dump = next((run.run_dir / "attempts" / "1").glob("stacks-*.json"))
    threads = json.loads(dump.read_text())["threads"]
    functions = {f["function"] for t in threads for f in t["frames"]}
    assert {"one", "two"} <= functions
    assert left_running(run.pids) == []


def test_the_same_hang_twice_stops_instead_of_looping(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path, [*FAST, "--max-restarts", "5"], faulty(state, "lock", "--at", 35, "--always")
    )
    assert run.classes == ["hang", "hang"]  # stopped after 2 of 6 allowed attempts
    assert "deadlock" in run.attempts[-1]["action"]
    assert run.returncode == 128 + signal.SIGTERM
    summary = run.finding("restart.summary")
    assert summary["severity"] == "error"
    assert left_running(run.pids) == []


@pytest.mark.parametrize(
    ("fault", "failure_class", "code"),
    [
        ("segfault", "segfault", -signal.SIGSEGV),
        pytest.param("sigkill", "unknown", -signal.SIGKILL, marks=pytest.mark.slow),
    ],
)
def test_a_crash_is_restarted_and_resumes(
    tmp_path: Path, fault: str, failure_class: str, code: int
) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path, [*FAST, "--max-restarts", "2"], faulty(state, fault, "--children", "1")
    )
    assert run.returncode == 0, run.stderr
    assert run.classes == [failure_class, "success"]
    assert run.attempts[0]["exit_code"] == code
    assert run.resumed == [0, 30]
    assert left_running(run.pids) == []


def test_a_bug_runs_exactly_once_and_the_report_shows_its_traceback(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(tmp_path, [*FAST, "--max-restarts", "3"], faulty(state, "exception"))
    assert run.returncode == 1
    assert run.classes == ["user_exception"]
    assert run.resumed == [0]
    finding = run.finding("failure.user_exception")
    assert "ValueError: batch 30 has the wrong shape" in finding["detail"]
    assert "in bad_batch" in finding["detail"]  # the traceback, not only the message
    assert "Traceback" in run.stderr  # the job's own output passed through


def test_a_program_that_exits_non_zero_by_itself_is_not_restarted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(tmp_path, [*FAST], faulty(state, "exit3"))
    assert run.returncode == 3
    assert run.classes == ["unknown"]
    assert "not restarted" in run.attempts[0]["action"]


@pytest.mark.slow
def test_retry_on_exception_restarts_a_bug(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(tmp_path, [*FAST, "--retry-on-exception"], faulty(state, "exception"))
    assert run.returncode == 0
    assert run.classes == ["user_exception", "success"]
    assert run.resumed == [0, 30]


def test_a_missing_command_inside_a_wrapper_is_a_bad_command(tmp_path: Path) -> None:
    run = run_trainmedic(
        tmp_path, [*FAST, "--max-restarts", "3"], ["/bin/sh", "-c", "no-such-trainer-xyz"]
    )
    assert run.returncode == 127
    assert run.classes == ["bad_command"]


def test_a_missing_command_stops_a_run_at_its_next_attempt(tmp_path: Path) -> None:
    """The script is gone when the restart comes: bad_command, not retried."""
    script = tmp_path / "vanishing.py"
    script.write_text(
        "import os, signal, sys\nos.unlink(sys.argv[0])\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    script.chmod(0o755)
    run = run_trainmedic(tmp_path, [*FAST, "--max-restarts", "3"], [sys.executable, str(script)])
    assert run.classes == ["segfault", "bad_command"]
    assert run.returncode == 2  # python's "can't open file" status


def test_resume_args_name_the_newest_checkpoint_on_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(
        tmp_path,
        [
            *FAST,
            "--resume-args",
            "--resume {checkpoint}",
            "--checkpoint-glob",
            "state/ckpt-*.json",
        ],
        faulty(state, "sleep", "--at", 35, "--no-auto-resume"),
    )
    assert run.returncode == 0, run.stderr
    assert run.classes == ["hang", "success"]
    assert run.resumed == [0, 30]
    second = run.attempts[1]
    assert second["resumed_from"] == str(state / "ckpt-30.json")
    assert second["resume_step"] == 30  # from the file name
    summary = run.finding("restart.summary")["evidence"]
    assert summary["steps_redone"] == 5  # 31..35 again
    assert summary["redone_known"] is True
