"""`trainmedic bench --runs N -- CMD_A ::: CMD_B`: runs in turns, compared; bad input in
one line; Ctrl-C keeps and compares what finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainmedic.bench import PlannedRun, plan, split_commands
from trainmedic.cli.main import main

SLEEP_LOOP = Path(__file__).resolve().parents[1] / "e2e" / "scripts" / "sleep_loop.py"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_rounds_alternate_which_command_goes_first() -> None:
    order = [r.name for r in plan(["x"], ["y"], 3)]
    assert order == ["a-1", "b-1", "b-2", "a-2", "a-3", "b-3"]
    assert plan(["x", "1"], ["y"], 1)[0] == PlannedRun("a", 1, ("x", "1"))
    assert split_commands(["p", "a.py", ":::", "p", "b.py"]) == (("p", "a.py"), ("p", "b.py"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "python", "a.py"], "give two commands separated by :::"),
        (["--", "a", ":::", "b", ":::", "c"], "one :::, not more"),
        (["--", ":::", "b"], "a command is empty: before :::"),
        (["--", "a", ":::"], "a command is empty: after :::"),
        (["--runs", "0", "--", "a", ":::", "b"], "--runs"),
        (["--bogus", "--", "a", ":::", "b"], "no such option: --bogus"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, "bench", "--out", str(tmp_path / "b"), *args)
    assert code == 2 and out == "" and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "b").exists()  # nothing made before the input is known good


def test_a_bench_directory_holding_files_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "bench", "--out", str(used), "--", "a", ":::", "b")
    assert code != 0 and "--out" in err and (used / "notes.txt").read_text() == "mine"


def _bench(tmp_path: Path, *extra: str, runs: int = 2) -> subprocess.Popen[str]:
    job = [sys.executable, str(SLEEP_LOOP), "--steps", "60", "--sleep-ms"]
    return subprocess.Popen(
        [sys.executable, "-m", "trainmedic", "bench", "--runs", str(runs), "--out",
         str(tmp_path / "bench"), "--json", str(tmp_path / "c.json"), *extra, "--",
         *job, "30", ":::", *job, "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=_ctrl_c_as_at_a_terminal,
    )  # fmt: skip


def _ctrl_c_as_at_a_terminal() -> None:
    # Tests started as a background job of a script inherit SIGINT ignored, and an
    # ignored signal stays ignored across exec: bench would never see the Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_a_fix_is_faster_over_repeated_interleaved_runs(tmp_path: Path) -> None:
    proc = _bench(tmp_path)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-2000:]
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["verdict"] == "faster" and doc["speedup"] > 1.5
    assert [r["run"] for r in doc["runs"]["before"]] == ["a-1", "a-2"]
    assert [r["run"] for r in doc["runs"]["after"]] == ["b-1", "b-2"]
    assert (tmp_path / "bench" / "b-2" / "findings.json").is_file()
    assert "faster:" in out and f"runs: {tmp_path / 'bench'}" in out


@pytest.mark.slow
def test_ctrl_c_keeps_and_compares_what_finished(tmp_path: Path) -> None:
    proc = _bench(tmp_path, runs=3)
    bench = tmp_path / "bench"
    deadline = time.monotonic() + 300
    # Round 1 is a-1, b-1; round 2 starts with b-2: interrupt it while it runs.
    while not (bench / "b-2").is_dir() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [r["run"] for r in doc["runs"]["before"]] == ["a-1"]
    assert [r["run"] for r in doc["runs"]["after"]] == ["b-1"]
    assert "left out: b-2 (interrupted" in err
    assert "compare" in out and "b-2" not in out.split("after:")[1].splitlines()[0]
    assert (bench / "b-2" / "meta.json").is_file()  # its record was kept
    assert not (bench / "a-2").exists()
