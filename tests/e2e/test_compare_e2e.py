"""`trainmedic compare` on real runs: a rerun is no change, a real fix is faster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def record(tmp_path: Path, name: str, sleep_ms: float) -> Path:
    """A loop paced by its sleep (the machine's load barely moves it), 120 steps."""
    run_dir = tmp_path / name
    got = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(run_dir),
         "--", sys.executable, str(SCRIPTS / "sleep_loop.py"), "--steps", "120", "--sleep-ms",
         str(sleep_ms)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return run_dir


def compare(a: Path, b: Path) -> dict[str, Any]:
    got = subprocess.run(
        [sys.executable, "-m", "trainmedic", "compare", str(a), str(b), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


@pytest.mark.slow
def test_a_rerun_is_no_change_and_removing_the_sleep_is_faster(tmp_path: Path) -> None:
    before = record(tmp_path, "before", 60)
    rerun = record(tmp_path, "rerun", 60)
    fixed = record(tmp_path, "fixed", 15)
    same = compare(before, rerun)
    assert same["verdict"] == "no_change", same
    # The interval the verdict is judged on holds 1 (without others' load, when the
    # machine's load changed between the two runs).
    lo, hi = same["speedup_load_adjusted_ci"] or same["speedup_ci"]
    assert lo <= 1.0 + same["min_effect"] and hi >= 1.0 - same["min_effect"]
    better = compare(before, fixed)
    assert better["verdict"] == "faster", better  # 60 ms of sleep became 15 ms
    assert (better["speedup_load_adjusted"] or better["speedup"]) > 1.3
    assert better["metric"] == "samples_per_s"
    still = {f["id"] for f in better["findings"]["still_present"]}
    resolved = {f["id"] for f in better["findings"]["resolved"]}
    assert "host.sleep" in still | resolved  # the sleep was named in the first run
