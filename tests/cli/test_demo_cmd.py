"""``trainmedic demo``: the bundled example runs under ``trainmedic run`` and is diagnosed."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.readable import assert_readable
from trainmedic.cli.main import main
from trainmedic.demo.scenarios import SCENARIOS, TOLERATED

README = Path(__file__).resolve().parents[2] / "README.md"


def trainmedic(
    *args: str, cwd: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def findings(run_dir: Path) -> list[dict[str, Any]]:
    document = json.loads((run_dir / "findings.json").read_text())
    return list(document["findings"])


def counted(run_dir: Path) -> list[dict[str, Any]]:
    """Findings without other people's CPU load (real on a shared machine), after
    checking that such a finding really measured others' CPU."""
    out = []
    for f in findings(run_dir):
        if f["id"].startswith(TOLERATED):
            ev = f["evidence"]
            if "train_cpu_wait_share" in ev:  # measured: the training thread waited
                assert ev["train_cpu_wait_share"] >= 0.02, f
            else:
                assert ev["others_cpu_cores"] >= ev["others_cpu_limit_cores"] >= 1.0, f
            continue
        out.append(f)
    return out


def busy_machine(finding: dict[str, Any]) -> bool:
    """Other processes starved the demo's loader: the input cause is contention, rightly."""
    ev = finding["evidence"]
    return finding["id"] == "input.contention" and ev["others_cpu_cores"] >= 0.5


def losses(stdout: str) -> list[float]:
    return [float(m) for m in re.findall(r" loss (\d+\.\d+)", stdout)]


def test_list_names_every_scenario_with_its_expected_finding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--list"]) == 0
    out = capsys.readouterr().out
    for s in SCENARIOS.values():
        assert f"{s.name}" in out and s.expectation in out
    assert "input-bound (default)" in out


def test_a_bad_simulation_file_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "sim.json"
    bad.write_text('{"driver": null, "gpus": [], "typo": 1}')
    code = main(
        ["demo", "--scenario", "throttling", "--simulate", str(bad), "--out", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "typo" in err and "unknown section" in err
    assert not (tmp_path / "r").exists()


def test_a_used_run_directory_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_healthy_demo_runs_end_to_end_learns_and_reports_no_problem(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    got = trainmedic("demo", "--scenario", "healthy", "--steps", "300", "--out", str(run_dir))
    assert got.returncode == 0, got.stderr
    # The training is real: the loss falls.
    logged = losses(got.stdout)
    assert len(logged) == 6 and logged[-1] < 0.5 * logged[0]
    assert "done: 300 steps" in got.stdout
    # Diagnosed under trainmedic run: a record, a report, no warning or error.
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["command"][1].endswith("train_lenet.py")
    assert all(f["severity"] == "info" for f in counted(run_dir))
    assert "demo (healthy): no warning or error" in got.stderr
    assert f"report: {run_dir / 'report.html'}" in got.stderr
    assert (run_dir / "report.html").is_file()
    steps = (run_dir / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 300


def test_readme_first_command_runs_the_default_demo_and_says_where_the_report_is(
    tmp_path: Path,
) -> None:
    quick_start = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quick_start, re.S)
    assert len(commands) == 2
    assert commands[0] == "bash scripts/setup && .venv/bin/trainmedic demo"
    args = shlex.split(commands[0].split("&&")[1])[1:]  # what follows .venv/bin/trainmedic
    got = trainmedic(*args, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    # What a new user reads: the step-time bar on top, a few facts a finding, fixes to paste.
    assert "a step's time" in got.stderr and "▒ waiting for data" in got.stderr
    report = got.stderr[got.stderr.index("\ntrainmedic run ") : got.stderr.index("\nsummary: ")]
    assert_readable(report, 80)  # the summary and the findings, as a pipe gets them
    found = re.search(r"^  report: (\S+/report\.html)$", got.stderr, re.M)
    assert found is not None, got.stderr
    report = tmp_path / found.group(1)
    assert report.is_file()
    assert report.parent.parent == tmp_path / "trainmedic-runs"
    assert report.parent.name.endswith("-demo-input-bound")
    first = counted(report.parent)[0]
    if busy_machine(first):
        assert "this machine is too busy to show input.workers" in got.stderr
        return
    assert first["id"] == "input.workers"
    assert "trainmedic named the cause, as expected: input.workers" in got.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["slow-storage", "stalls", "throttling", "contention", "memory-pressure"]
)
def test_every_scenario_gives_its_finding_first(tmp_path: Path, name: str) -> None:
    scenario = SCENARIOS[name]
    run_dir = tmp_path / "run"
    got = trainmedic("demo", "--scenario", name, "--quiet", "--out", str(run_dir))
    assert got.returncode == 0, got.stderr
    first = counted(run_dir)[0]
    assert (first["id"], first["category"]) == (scenario.expected, scenario.category.value)
    assert first["severity"] in ("warning", "error")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["gpu_backend"] == ("simulated" if scenario.simulation else meta["gpu_backend"])
    for arg in meta["command"]:  # the scratch directory (data set, checkpoints) is gone
        if "trainmedic-demo-" in arg:
            assert not Path(arg).exists()


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_like_the_job_and_cleans_up(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainmedic",
            "demo",
            "--scenario",
            "slow-storage",
            "--out",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the job's own output, passed through: it is training
        if " step 50/" in line:
            break
    os.killpg(proc.pid, signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "done:" not in rest  # stopped, not finished
    assert "demo (slow-storage): the training job ended with exit code 130" in err
    assert f"run directory: {run_dir}" in err
    scratch = re.search(r"--dataset-dir (\S+)", err)
    assert scratch is not None and not Path(scratch.group(1)).exists()
    assert json.loads((run_dir / "meta.json").read_text())["exit_code"] != 0
