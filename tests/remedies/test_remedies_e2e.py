"""Remedies end to end under ``trainmedic run``: fixes applied to an unmodified script make
it faster, and a data set with a corrupt and a flaky file trains to the end."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from trainmedic.record.stats import summarize
from trainmedic.record.store import load_run_record
from trainmedic.remedies.stats import bootstrap_ratio_ci

SCRIPTS = Path(__file__).parent / "scripts"
LENET = Path(__file__).resolve().parents[2] / "src" / "trainmedic" / "demo" / "train_lenet.py"


def trainmedic_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


def steady_step_times(run_dir: Path) -> list[float]:
    record = load_run_record(run_dir)
    steps = sorted((s for s in record.steps if s.phase == "train"), key=lambda s: s.t)
    return [s.duration_s for s in steps[len(steps) // 5 :]]  # past start-up


@pytest.mark.slow
def test_apply_from_makes_an_unmodified_input_bound_script_faster(tmp_path: Path) -> None:
    # The script reads one file per sample from an emulated network disk (3 ms a
    # read) with the DataLoader's default settings: a wait no spare core can hide.
    job = [sys.executable, str(LENET), "--steps", "80", "--batch-size", "16"]
    job += ["--samples", "2048", "--dataset-dir", str(tmp_path / "data")]
    job += ["--read-delay-ms", "3", "--threads", "1", "--log-every", "1000"]
    before = trainmedic_run("--out", str(tmp_path / "before"), "--", *job, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    findings = json.loads((tmp_path / "before" / "findings.json").read_text())["findings"]
    assert findings[0]["id"].startswith("input.")
    plan = findings[0]["apply"]["dataloader"]
    # More samples in flight: worker processes, or fetch threads inside one.
    assert plan["num_workers"] >= 1 and plan["num_workers"] * plan.get("threads", 1) >= 2

    after = trainmedic_run(
        "--out", str(tmp_path / "after"), "--apply-from", str(tmp_path / "before"), "--", *job,
        cwd=tmp_path,
    )  # fmt: skip
    assert after.returncode == 0, after.stderr
    assert "applying from" in after.stderr and "applied fixes" in after.stderr
    events = load_run_record(tmp_path / "after").events
    applied = [e for e in events if e.kind == "remedy_applied"]
    assert len(applied) == 1 and applied[0].data["changed"]["num_workers"][0] == 0
    assert not [e for e in events if e.kind == "remedy_reverted"]
    loaders = load_run_record(tmp_path / "after").loaders
    assert loaders[0].num_workers == applied[0].data["changed"]["num_workers"][1]
    context = json.loads((tmp_path / "after" / "findings.json").read_text())["context"]
    assert context["apply_plan"]["dataloader"] == plan

    # The effect, from the two runs' step records: the median step is faster and the
    # bootstrap interval of the throughput ratio lies above 1.
    slow, fast = steady_step_times(tmp_path / "before"), steady_step_times(tmp_path / "after")
    assert statistics.median(fast) < 0.8 * statistics.median(slow)
    ci = bootstrap_ratio_ci([1 / d for d in fast], [1 / d for d in slow])
    assert ci is not None and ci[0] > 1.0
    rate = [summarize(load_run_record(tmp_path / r)).samples_per_s for r in ("before", "after")]
    assert rate[1] is not None and rate[0] is not None and rate[1] > 1.2 * rate[0]


@pytest.mark.slow
def test_a_corrupt_and_a_flaky_file_do_not_end_training_and_both_are_recorded(
    tmp_path: Path,
) -> None:
    got = trainmedic_run(
        "--out", str(tmp_path / "run"), "--", sys.executable,
        str(SCRIPTS / "resilient_train.py"), str(tmp_path / "data"), cwd=tmp_path,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert "trained 16 steps" in got.stdout  # 2 epochs x 8 batches: every batch full
    events = load_run_record(tmp_path / "run").events
    skipped = [e for e in events if e.kind == "sample_skipped"]
    retried = [e for e in events if e.kind == "sample_retried"]
    assert {e.data["index"] for e in skipped} == {12}
    assert "truncated file" in skipped[0].data["error"]
    assert [e.data["index"] for e in retried] == [7]
    assert retried[0].data["retries"] == 2
    assert "skipping index 12" in got.stderr  # the log, through the job's stderr
