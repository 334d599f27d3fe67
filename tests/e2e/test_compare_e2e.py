"""`trainmedic compare` on real runs: a rerun is no change, a real fix is faster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def start(tmp_path: Path, name: str, sleep_ms: float) -> tuple[Path, subprocess.Popen[str]]:
    """A loop paced by its sleep, 120 steps, one torch thread."""
    run_dir = tmp_path / name
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(run_dir),
         "--", sys.executable, str(SCRIPTS / "sleep_loop.py"), "--steps", "120", "--sleep-ms",
         str(sleep_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    return run_dir, proc


def compare(a: Path, b: Path) -> dict[str, Any]:
    got = subprocess.run(
        [sys.executable, "-m", "trainmedic", "compare", str(a), str(b), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


@pytest.mark.slow
def test_a_rerun_is_never_a_change_and_removing_the_sleep_is_faster(tmp_path: Path) -> None:
    # The three runs go side by side, so a shared machine's load is the same for all:
    # what differs between them is their configuration alone.
    runs = [start(tmp_path, "before", 60), start(tmp_path, "rerun", 60),
            start(tmp_path, "fixed", 15)]  # fmt: skip
    for _, proc in runs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    before, rerun, fixed = (d for d, _ in runs)
    same = compare(before, rerun)
    assert same["verdict"] in ("no_change", "inconclusive"), same
    lo, hi = same["speedup_load_adjusted_ci"] or same["speedup_ci"]
    assert lo <= 1.0 + same["min_effect"] and hi >= 1.0 - same["min_effect"]
    better = compare(before, fixed)
    assert better["verdict"] == "faster", better  # 60 ms of sleep became 15 ms
    assert (better["speedup_load_adjusted"] or better["speedup"]) > 1.5
    assert better["metric"] == "samples_per_s"
    still = {f["id"] for f in better["findings"]["still_present"]}
    resolved = {f["id"] for f in better["findings"]["resolved"]}
    assert "host.sleep" in still | resolved  # the sleep was named in the first run
