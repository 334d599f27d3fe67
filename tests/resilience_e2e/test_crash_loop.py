"""A job that crashes again and again but trains between crashes runs to its end.

The restart budget (``--max-restarts``, 3 by default) counts failures in a row
*without progress*: an attempt that trained for a while resets it and the
backoff, so every restart here comes at once. (The benchmark runs the same at
the scale of a crash every 30 s: benchmarks/restarts.py --crash-loop.)
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from resilience_helpers import run_trainmedic

JOB = Path(__file__).resolve().parents[2] / "benchmarks" / "hang_job.py"


@pytest.mark.slow
def test_five_crashes_each_after_training_a_while_are_each_restarted_at_once(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    command = [
        sys.executable, str(JOB), "--state", str(state), "--step-s", "0.05",
        "--crash-after-s", "11", "--crashes", "5", "--total-steps", "1400",
    ]  # fmt: skip
    run = run_trainmedic(tmp_path, [], command, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.classes == ["segfault"] * 5 + ["success"]
    assert (state / "done").exists()
    attempts = run.attempts
    assert all(a["restarted"] and a["wait_s"] <= 0.5 for a in attempts[:-1])
    # Each attempt resumed from the checkpoint the previous one left, and went further.
    resumed = [int(line.split()[0]) for line in (state / "starts").read_text().splitlines()]
    assert len(resumed) == 6 and resumed[0] == 0
    assert all(b > a for a, b in itertools.pairwise(resumed))
    summary = run.finding("restart.summary")
    assert summary["severity"] == "info"
